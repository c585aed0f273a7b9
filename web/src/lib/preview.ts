// The impact preview in the publish dialog: what a draft's changed limits
// would have done to the last hour of real traffic (POST /api/v1/preview).
import type { PreviewLimit } from './api';
import type { Series } from './traffic';

/**
 * previewSeries is a limit's points as the traffic chart's series: per
 * minute, what was actually limited (the chart's 429 line) and what the
 * draft would have limited (its would-limit line); the other lines are
 * empty.
 */
export function previewSeries(l: PreviewLimit): Series {
  const s: Series = { t: [], allowed: [], limited: [], shadow: [], errors: [] };
  for (const p of l.points) {
    s.t.push(p.t);
    s.allowed.push(0);
    s.limited.push(p.limited);
    s.shadow.push(p.would_limit);
    s.errors.push(0);
  }
  return s;
}

/** describeLimit says what a limit allows, like "100 / minute (fixed_window)". */
export function describeLimit(l: PreviewLimit['after'] | null): string {
  if (!l) return 'none';
  if (l.unlimited) return 'unlimited';
  return `${l.requests_per_unit} / ${l.unit ?? '?'} (${l.algorithm}${l.shadow_mode ? ', shadow mode' : ''})`;
}

/** range formats an estimate with its bounds: "120" when exact, "≈120 (110–130)" otherwise. */
export function range(est: number, low: number, high: number): string {
  if (low === high) return String(est);
  return `≈${est} (${low}–${high})`;
}

/** previewSummary is one sentence about a previewed limit, for people and screen readers. */
export function previewSummary(l: PreviewLimit): string {
  if (!l.previewable) return l.reason ?? 'This limit cannot be previewed.';
  const t = l.totals;
  const minutes = l.points.length;
  const would = range(t.would_limit, t.would_limit_low, t.would_limit_high);
  return (
    `Over the last ${minutes} minute${minutes === 1 ? '' : 's'} with traffic, ${would} of ${t.requests} requests ` +
    `would have been limited (${t.limited} actually were); at most ${t.values_max} distinct value${t.values_max === 1 ? '' : 's'} ` +
    `would have hit it in one minute.`
  );
}
