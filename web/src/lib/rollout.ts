// Pure helpers for staged rollouts: the publish dialog's label
// selector and the version page's canary-against-the-rest rates.
import type { CohortPoint, Rollout } from './api';

// The console's label syntax (rules/wire/labels.go); it checks again.
const keyRe = /^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$/;
const valueRe = /^[A-Za-z0-9_.-]{1,63}$/;

/** parseSelector reads "k=v, k=v" into labels, or says what is wrong. Empty input is no selector. */
export function parseSelector(s: string): { labels: Record<string, string> | null; error: string } {
  if (s.trim() === '') return { labels: null, error: '' };
  const labels: Record<string, string> = {};
  for (const item of s.split(',')) {
    const i = item.indexOf('=');
    const k = (i < 0 ? item : item.slice(0, i)).trim();
    const v = i < 0 ? '' : item.slice(i + 1).trim();
    if (i < 0 || k === '') return { labels: null, error: `“${item.trim()}” is not key=value` };
    if (k in labels) return { labels: null, error: `label ${k} is given twice` };
    if (!keyRe.test(k)) return { labels: null, error: `label key “${k}”: 1-63 letters, digits, _ . - /, starting with a letter or digit` };
    if (!valueRe.test(v)) return { labels: null, error: `label ${k}: the value must be 1-63 letters, digits, _ . -` };
    labels[k] = v;
  }
  return { labels, error: '' };
}

/** selectorText renders labels as k=v, k=v in key order. */
export function selectorText(labels: Record<string, string>): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}=${labels[k]}`)
    .join(', ');
}

/** CohortRates is, per second, the share of decisions limited (0..1) on the canary and on the rest; null: no traffic. */
export interface CohortRates {
  t: number[];
  canary: (number | null)[];
  rest: (number | null)[];
  /** Over every second: share limited, and decisions. */
  canaryTotal: { rate: number | null; decisions: number };
  restTotal: { rate: number | null; decisions: number };
}

const share = (limited: number, allowed: number): number | null => (limited + allowed > 0 ? limited / (limited + allowed) : null);

/** cohortRates turns the console's cohort points into 429 rates. */
export function cohortRates(points: readonly CohortPoint[]): CohortRates {
  const out: CohortRates = { t: [], canary: [], rest: [], canaryTotal: { rate: null, decisions: 0 }, restTotal: { rate: null, decisions: 0 } };
  let ca = 0;
  let cl = 0;
  let ra = 0;
  let rl = 0;
  for (const p of points) {
    out.t.push(p.t);
    out.canary.push(share(p.canary_limited, p.canary_allowed));
    out.rest.push(share(p.rest_limited, p.rest_allowed));
    ca += p.canary_allowed;
    cl += p.canary_limited;
    ra += p.rest_allowed;
    rl += p.rest_limited;
  }
  out.canaryTotal = { rate: share(cl, ca), decisions: ca + cl };
  out.restTotal = { rate: share(rl, ra), decisions: ra + rl };
  return out;
}

/** formatShare renders a 0..1 share as a percentage, "—" for none. */
export function formatShare(v: number | null): string {
  if (v === null) return '—';
  const p = v * 100;
  return `${p < 10 && p > 0 ? p.toFixed(1) : Math.round(p)}%`;
}

/** rolloutLabel says in words where a rollout stands. */
export function rolloutLabel(r: Rollout): string {
  switch (r.state) {
    case 'staged':
      return `staged to ${selectorText(r.labels)}`;
    case 'promoted':
      return 'promoted to every node';
    case 'rolled_back':
      return `rolled back in v${r.ended_in}`;
    case 'halted':
      return `halted automatically (v${r.ended_in})`;
  }
}
