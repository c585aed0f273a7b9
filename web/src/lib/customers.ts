// Pure logic of the Customers page (the support desk): which request
// descriptors a customer's value makes in a domain, the override expiry
// choices, and what a new limit would have done to the value's last hour.
// No DOM, no fetch, so vitest runs it in plain Node.
import type { DomainConfig, Entry, InspectedLimit, Override, ValueHistory } from './api';

type ConfigDescriptor = NonNullable<NonNullable<DomainConfig>['descriptors']>[number];

/** Level is one step of a limit's way down the descriptor tree: a key and, when the YAML names one, its value. */
export interface Level {
  key: string;
  value?: string;
}

/** LimitShape is a limit of the domain and the descriptor shape that reaches it. */
export interface LimitShape {
  /** The limit's name as stats and inspect call it (rate_limit.name, else its path name). */
  rule: string;
  levels: Level[];
}

/** pathName is a descriptor's Lyft-style name under its parent's: key or key_value, joined with ".". */
function pathName(parent: string, d: { key: string; value?: string }): string {
  const seg = d.value ? `${d.key}_${d.value}` : d.key;
  return parent === '' ? seg : `${parent}.${seg}`;
}

/** limitShapes lists every limit of a domain's structured form with the levels that reach it, in YAML order. */
export function limitShapes(config: DomainConfig | null | undefined): LimitShape[] {
  const out: LimitShape[] = [];
  const walk = (ds: readonly ConfigDescriptor[] | undefined, parent: string, levels: Level[]) => {
    for (const d of ds ?? []) {
      const name = pathName(parent, d);
      const here = [...levels, d.value ? { key: d.key, value: d.value } : { key: d.key }];
      if (d.rate_limit) out.push({ rule: d.rate_limit.name || name, levels: here });
      walk(d.descriptors as ConfigDescriptor[] | undefined, name, here);
    }
  };
  walk(config?.descriptors, '', []);
  return out;
}

/**
 * parsePairs reads the stats' name of a several-entry descriptor value,
 * "k1=v1, k2=v2", into entries; null when the text is not of that form.
 */
export function parsePairs(value: string): Entry[] | null {
  const parts = value.split(', ');
  const out: Entry[] = [];
  for (const p of parts) {
    const i = p.indexOf('=');
    if (i <= 0) return null;
    out.push({ key: p.slice(0, i), value: p.slice(i + 1) });
  }
  return out;
}

/**
 * entriesFor builds the descriptor a customer's value makes for a limit
 * shape. A level the YAML names a value for takes that value; the other
 * levels take the customer's value. For a shape of several levels, a value
 * that reads as the stats' "k1=v1, k2=v2" with the shape's keys gives each
 * level its own value. A one-level shape with a fixed value other than the
 * customer's is not this customer's: null.
 */
export function entriesFor(shape: LimitShape, value: string): Entry[] | null {
  if (value === '') return null;
  if (shape.levels.length > 1) {
    const pairs = parsePairs(value);
    if (pairs && pairs.length === shape.levels.length && pairs.every((p, i) => p.key === shape.levels[i].key)) {
      return shape.levels.every((l, i) => l.value === undefined || matchesValue(l.value, pairs[i].value)) ? pairs : null;
    }
  }
  const open = shape.levels.filter((l) => l.value === undefined).length;
  if (open === 0) {
    // Every level is fixed: the customer is its value at the last level.
    const last = shape.levels[shape.levels.length - 1];
    if (!matchesValue(last.value ?? '', value)) return null;
    return shape.levels.map((l, i) => ({ key: l.key, value: i === shape.levels.length - 1 ? value : (l.value ?? '') }));
  }
  return shape.levels.map((l) => ({ key: l.key, value: l.value ?? value }));
}

// matchesValue reports whether a YAML value (exact, or "prefix*") admits v.
function matchesValue(pattern: string, v: string): boolean {
  return pattern.endsWith('*') ? v.startsWith(pattern.slice(0, -1)) : pattern === v;
}

/** Candidate is a descriptor the page offers for a value: the limit shape and the entries it makes. */
export interface Candidate {
  /** Stable id: the entries as text. */
  id: string;
  rules: string[];
  entries: Entry[];
}

/** entriesText renders entries as "api_key=k1, route=/search" (the stats' way of naming them). */
export function entriesText(entries: readonly Entry[]): string {
  return entries.map((e) => `${e.key}=${e.value}`).join(', ');
}

/**
 * candidates are the descriptors a value makes in a domain, one per
 * distinct set of entries (limits whose shapes give the same entries are
 * listed together), in YAML order.
 */
export function candidates(shapes: readonly LimitShape[], value: string): Candidate[] {
  const out: Candidate[] = [];
  for (const s of shapes) {
    const entries = entriesFor(s, value);
    if (!entries) continue;
    const id = entriesText(entries);
    const have = out.find((c) => c.id === id);
    if (have) have.rules.push(s.rule);
    else out.push({ id, rules: [s.rule], entries });
  }
  return out;
}

/**
 * preselect picks the candidates to inspect first: the one of the rule the
 * page was sent for (from Live traffic or Quotas); without one, those of
 * one entry whose level has no fixed value (the per-customer limits, like
 * api_key); failing that, the first.
 */
export function preselect(cs: readonly Candidate[], shapes: readonly LimitShape[], rule: string): string[] {
  if (rule) {
    const c = cs.find((x) => x.rules.includes(rule));
    if (c) return [c.id];
  }
  const open = new Set(shapes.filter((s) => s.levels.length === 1 && s.levels[0].value === undefined).map((s) => s.rule));
  const picked = cs.filter((c) => c.entries.length === 1 && c.rules.some((r) => open.has(r))).map((c) => c.id);
  if (picked.length > 0) return picked;
  return cs.length > 0 ? [cs[0].id] : [];
}

/** sameEntries reports whether two descriptors have the same keys and values in the same order. */
export function sameEntries(a: readonly Entry[], b: readonly Entry[]): boolean {
  return a.length === b.length && a.every((e, i) => e.key === b[i].key && e.value === b[i].value);
}

/** overridesOf are the overrides for this customer: those for one of the descriptors, or with the value in an entry. */
export function overridesOf(list: readonly Override[], descriptors: readonly Entry[][], value: string): Override[] {
  return list.filter((o) => descriptors.some((d) => sameEntries(d, o.entries)) || o.entries.some((e) => e.value === value));
}

// --- expiry -------------------------------------------------------------

/** maxOverrideDays is how far out an override may end (the console refuses more). */
export const maxOverrideDays = 90;

/** ExpiryChoice is one quick choice of the expiry picker. */
export interface ExpiryChoice {
  id: string;
  label: string;
  at: Date;
}

/**
 * expiryChoices are the picker's quick choices from now: 2 minutes, 1 hour,
 * 1 day, and until Friday (18:00 local time on the next Friday; today if it
 * is Friday before 18:00).
 */
export function expiryChoices(now: Date): ExpiryChoice[] {
  const friday = new Date(now.getTime());
  friday.setHours(18, 0, 0, 0);
  const ahead = (5 - now.getDay() + 7) % 7;
  friday.setDate(friday.getDate() + ahead);
  if (friday.getTime() <= now.getTime()) friday.setDate(friday.getDate() + 7);
  const plus = (ms: number) => new Date(now.getTime() + ms);
  return [
    { id: '2m', label: '2 min', at: plus(2 * 60_000) },
    { id: '1h', label: '1 hour', at: plus(3600_000) },
    { id: '1d', label: '1 day', at: plus(86400_000) },
    { id: 'friday', label: 'Until Friday', at: friday },
  ];
}

/** localInput renders a time as a datetime-local input's value in local time, to the second: "2026-12-04T18:00:00". */
export function localInput(d: Date): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** parseLocalInput reads a datetime-local value (local time); null when empty or malformed. */
export function parseLocalInput(s: string): Date | null {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?$/.exec(s);
  if (!m) return null;
  const d = new Date(Number(m[1]), Number(m[2]) - 1, Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6] ?? 0));
  return Number.isNaN(d.getTime()) || d.getDate() !== Number(m[3]) ? null : d;
}

/** expiryProblem says what is wrong with an expiry (null when it is fine): the console takes only the future, up to 90 days. */
export function expiryProblem(at: Date | null, now: Date): string | null {
  if (!at) return 'Choose when the override ends.';
  if (at.getTime() <= now.getTime()) return 'The end must be in the future.';
  if (at.getTime() - now.getTime() > maxOverrideDays * 86400_000) return `An override ends at most ${maxOverrideDays} days from now.`;
  return null;
}

// --- what a new limit changes -------------------------------------------------

const unitSeconds: Record<string, number> = { second: 1, minute: 60, hour: 3600, day: 86400, week: 604800, month: 2629746, year: 31556952 };

/** perMinute is a limit's rate per minute. */
export function perMinute(requestsPerUnit: number, unit: string): number {
  const s = unitSeconds[unit];
  return s ? (requestsPerUnit * 60) / s : 0;
}

/** OverrideEffect is what a new limit would have done to the value's 429s of one rule in the last hour. */
export interface OverrideEffect {
  rule: string;
  /** The value's 429s of the rule in the window (a lower bound when complete is false). */
  limited: number;
  /** Minutes of the window in which it was limited. */
  minutes: number;
  /** Of those 429s, how many the new limit would have admitted, and how many it would still have limited. */
  admitted: number;
  stillLimited: number;
  complete: boolean;
}

/**
 * overrideEffect estimates what the new limit would have done to the
 * value's 429s of one rule (from GET /stats/values). The console records
 * only the value's limited requests, not the ones it let through, so the
 * estimate assumes that in a minute the value was limited in, it used its
 * whole current limit (that is why it was limited): it asked for
 * limit-per-minute + limited requests, and the new limit admits up to its
 * own per-minute rate of them. A raise admits some or all of the 429s; a
 * lowering admits none (the extra 429s of a lowering cannot be known from
 * 429s alone). Units longer than a minute are spread evenly over their
 * minutes, which makes the figures rougher.
 */
export function overrideEffect(
  history: ValueHistory | null,
  rule: string,
  before: { requests_per_unit: number; unit: string },
  after: { requests_per_unit: number; unit: string },
  from: number,
): OverrideEffect {
  const r = history?.rules?.find((x) => x.rule === rule);
  const b = perMinute(before.requests_per_unit, before.unit);
  const a = perMinute(after.requests_per_unit, after.unit);
  let limited = 0;
  let minutes = 0;
  let admitted = 0;
  let complete = true;
  for (const p of r?.points ?? []) {
    if (p.t < from) continue;
    if (!p.complete) complete = false;
    if (p.limited <= 0) continue;
    limited += p.limited;
    minutes++;
    admitted += Math.min(p.limited, Math.max(0, Math.floor(a - b)));
  }
  return { rule, limited, minutes, admitted, stillLimited: limited - admitted, complete };
}

/** limitText says what a limit allows: "5 / hour". */
export function limitText(l: Pick<InspectedLimit, 'requests_per_unit' | 'unit' | 'unlimited'>): string {
  if (l.unlimited) return 'unlimited';
  return `${l.requests_per_unit.toLocaleString('en-US')} / ${l.unit}`;
}

/** customersHref is the Customers page of a value (and the rule it came from). */
export function customersHref(domain: string, value: string, rule?: string): string {
  const q = new URLSearchParams();
  q.set('domain', domain);
  if (rule) q.set('rule', rule);
  q.set('value', value);
  return `/customers?${q}`;
}
