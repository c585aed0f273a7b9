// Pure helpers for the Quotas page: quota periods in the console's format
// (GET /api/v1/quotas?period=), usage against a limit, the CSV link.

/** QuotaUnit is the length of a quota period. */
export type QuotaUnit = 'day' | 'week' | 'month' | 'year';

export const quotaUnits: readonly QuotaUnit[] = ['day', 'week', 'month', 'year'];

const pad = (n: number, w = 2) => String(n).padStart(w, '0');

/** isoWeek returns the ISO 8601 week-numbering year and week of a UTC date. */
export function isoWeek(d: Date): { year: number; week: number } {
  const t = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()));
  const day = (t.getUTCDay() + 6) % 7; // Monday = 0
  t.setUTCDate(t.getUTCDate() - day + 3); // the Thursday of this week
  const year = t.getUTCFullYear();
  const week = 1 + Math.floor((t.getTime() - Date.UTC(year, 0, 1)) / 86_400_000 / 7);
  return { year, week };
}

/** periodOf names the UTC period of unit that holds d: 2026-12-01, 2026-W49, 2026-12, 2026. */
export function periodOf(unit: QuotaUnit, d: Date): string {
  const y = d.getUTCFullYear();
  switch (unit) {
    case 'day':
      return `${y}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
    case 'week': {
      const w = isoWeek(d);
      return `${w.year}-W${pad(w.week)}`;
    }
    case 'month':
      return `${y}-${pad(d.getUTCMonth() + 1)}`;
    case 'year':
      return String(y);
  }
}

/**
 * periodProblem says what is wrong with a period as typed, or null when the
 * console will accept it (it checks again and answers 400 with the reason).
 */
export function periodProblem(p: string): string | null {
  const s = p.trim();
  if (s === '') return null; // the current periods
  let m: RegExpExecArray | null;
  if (/^\d{4}$/.test(s)) return Number(s) >= 1970 ? null : 'The year must be 1970 or later.';
  if ((m = /^(\d{4})-W(\d{2})$/.exec(s))) {
    const y = Number(m[1]);
    const w = Number(m[2]);
    const last = isoWeek(new Date(Date.UTC(y, 11, 28))).week; // 28 December is always in the last week
    return w >= 1 && w <= last ? null : `${y} has weeks 01 to ${pad(last)}.`;
  }
  if ((m = /^(\d{4})-(\d{2})$/.exec(s))) return Number(m[2]) >= 1 && Number(m[2]) <= 12 ? null : 'The month must be 01 to 12.';
  if ((m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s))) {
    const [y, mo, d] = [Number(m[1]), Number(m[2]), Number(m[3])];
    const t = new Date(Date.UTC(y, mo - 1, d));
    return t.getUTCFullYear() === y && t.getUTCMonth() === mo - 1 && t.getUTCDate() === d ? null : 'No such date.';
  }
  return 'Use 2026 (a year), 2026-12 (a month), 2026-W49 (an ISO week) or 2026-12-01 (a day).';
}

/** Usage is how much of a limit a value used. */
export interface Usage {
  used: number;
  limit: number;
}

/** usageFraction is used/limit clamped to 0..1 for drawing; 1 when the limit is 0. */
export function usageFraction(u: Usage): number {
  if (u.limit <= 0) return 1;
  return Math.min(Math.max(u.used / u.limit, 0), 1);
}

/** usageTone colours a bar: ok under 80 %, warn to 100 %, bad when the limit is used up. */
export function usageTone(u: Usage): 'ok' | 'warn' | 'bad' {
  if (u.limit <= 0 || u.used >= u.limit) return 'bad';
  return u.used / u.limit >= 0.8 ? 'warn' : 'ok';
}

/** usageLabel reads "1,204 of 10,000 (12 %)". */
export function usageLabel(u: Usage): string {
  const n = (v: number) => v.toLocaleString('en-US');
  if (u.limit <= 0) return `${n(u.used)} (no requests allowed)`;
  const pct = (u.used / u.limit) * 100;
  const shown = pct > 0 && pct < 1 ? '<1' : String(Math.floor(pct));
  return `${n(u.used)} of ${n(u.limit)} (${shown} %)`;
}

/** QuotaQuery is what the page asks the console for. */
export interface QuotaQuery {
  domain?: string;
  rule?: string;
  value?: string;
  period?: string;
}

/** quotaParams turns a query into URL parameters, leaving out empty fields. */
export function quotaParams(q: QuotaQuery, extra: Record<string, string | number> = {}): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries({ ...q, ...extra })) {
    const s = typeof v === 'number' ? String(v) : (v ?? '').trim();
    if (s !== '') p.set(k, s);
  }
  const s = p.toString();
  return s === '' ? '' : `?${s}`;
}
