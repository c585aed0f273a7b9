// Pure data transforms for the Live traffic page and the Domains page's
// sparklines: no DOM, no fetch, so vitest runs them in plain Node.
//
// The console's stats points are SPARSE (a second or bucket with no
// decision is left out); the chart wants dense columns with zeros, aligned
// to the step. The live window is 15 minutes at 1 s, fetched once from
// /stats/live and then moved along by the websocket's per-second ticks.
import type { Counts, Marker, RuleStats, Spike, StatsPoint, StatsWindow, TickRule, TopValue } from './api';

/** liveSpan is the live window's length in seconds: GET /stats/live has from = to-899 .. to, 900 seconds. */
export const liveSpan = 900;

/** maxTopValues is how many most-limited values a rule keeps between resyncs. */
const maxTopValues = 100;

/** Range is one choice of the page's time switch. */
export interface Range {
  id: 'live' | '1h' | '24h' | '7d' | '30d';
  label: string;
  seconds: number;
}

/** ranges are the page's time switch: live, then the history ranges. */
export const ranges: readonly Range[] = [
  { id: 'live', label: 'Live (15 min)', seconds: liveSpan },
  { id: '1h', label: '1 h', seconds: 3600 },
  { id: '24h', label: '24 h', seconds: 86400 },
  { id: '7d', label: '7 d', seconds: 7 * 86400 },
  { id: '30d', label: '30 d', seconds: 30 * 86400 },
];

/** rangeOf reads a ?range= value; anything unknown is live. */
export function rangeOf(id: string | null | undefined): Range {
  return ranges.find((r) => r.id === id) ?? ranges[0];
}

// The history steps: multiples of 60 s (the rollups' resolution).
const steps = [60, 300, 600, 3600, 21600, 86400];

/**
 * historyStep is the smallest rollup step that keeps a range within
 * maxPoints buckets: 1 h and 24 h → 60 s, 7 d → 600 s, 30 d → 3600 s.
 */
export function historyStep(rangeSeconds: number, maxPoints = 1500): number {
  for (const s of steps) if (Math.ceil(rangeSeconds / s) <= maxPoints) return s;
  return steps[steps.length - 1];
}

/** Series is dense columns for the chart: t (Unix seconds, step apart) and one value per t. */
export interface Series {
  t: number[];
  allowed: number[];
  limited: number[];
  shadow: number[];
  errors: number[];
}

function alignDown(t: number, step: number): number {
  return Math.floor(t / step) * step;
}

// A bound on the columns, whatever from/to say: 31 days at 60 s is 44,640.
const maxColumns = 50_000;

/**
 * fillSeries turns sparse points (of one or several rules, which are
 * summed) into dense columns from from to to inclusive, step apart, aligned
 * to the step, with zeros where no point is. Points outside are dropped.
 */
export function fillSeries(lists: Iterable<Iterable<StatsPoint>>, from: number, to: number, step: number): Series {
  const start = alignDown(from, step);
  const end = alignDown(to, step);
  const n = end < start ? 0 : Math.min(maxColumns, (end - start) / step + 1);
  const s: Series = { t: new Array(n), allowed: new Array(n).fill(0), limited: new Array(n).fill(0), shadow: new Array(n).fill(0), errors: new Array(n).fill(0) };
  for (let i = 0; i < n; i++) s.t[i] = start + i * step;
  for (const points of lists) {
    for (const p of points) {
      const i = (alignDown(p.t, step) - start) / step;
      if (i < 0 || i >= n) continue;
      s.allowed[i] += p.allowed || 0;
      s.limited[i] += p.limited || 0;
      s.shadow[i] += p.shadow_limited || 0;
      s.errors[i] += p.store_errors || 0;
    }
  }
  return s;
}

/** perSecond divides a series' counts per bucket by the step: rates for the chart. */
export function perSecond(s: Series, step: number): Series {
  if (step === 1) return s;
  const d = (a: number[]) => a.map((v) => v / step);
  return { t: s.t, allowed: d(s.allowed), limited: d(s.limited), shadow: d(s.shadow), errors: d(s.errors) };
}

/** Summary is the text next to the chart. Rates are per second; totals are counts. */
export interface Summary {
  /** Average rates over the last few buckets. */
  now: Counts;
  /** The highest 429/s of one bucket, and when (null when there were none). */
  peak: { perSecond: number; t: number } | null;
  total: Counts;
}

/** summarize reads a series of counts per bucket: the recent rates (last `recent` buckets), the peak and the totals. */
export function summarize(s: Series, step: number, recent: number): Summary {
  const n = s.t.length;
  const sum = (a: number[], from = 0) => {
    let x = 0;
    for (let i = Math.max(0, from); i < a.length; i++) x += a[i];
    return x;
  };
  const k = Math.max(1, Math.min(recent, n));
  const rate = (a: number[]) => (n === 0 ? 0 : sum(a, n - k) / (k * step));
  let peak: Summary['peak'] = null;
  for (let i = 0; i < n; i++) {
    if (s.limited[i] > 0 && (peak === null || s.limited[i] / step > peak.perSecond)) peak = { perSecond: s.limited[i] / step, t: s.t[i] };
  }
  return {
    now: { allowed: rate(s.allowed), limited: rate(s.limited), shadow_limited: rate(s.shadow), store_errors: rate(s.errors) },
    peak,
    total: { allowed: sum(s.allowed), limited: sum(s.limited), shadow_limited: sum(s.shadow), store_errors: sum(s.errors) },
  };
}

/** ruleKey names a (domain, rule) pair in maps. */
export function ruleKey(domain: string, rule: string): string {
  return `${domain}\u0000${rule}`;
}

/** Selection is the page's view: every domain, one domain, or one rule of a domain. */
export interface Selection {
  domain?: string;
  rule?: string;
}

/** selected reports whether a rule is in the view. */
export function selected(r: { domain: string; rule: string }, sel: Selection): boolean {
  if (sel.domain && r.domain !== sel.domain) return false;
  if (sel.domain && sel.rule && r.rule !== sel.rule) return false;
  return true;
}

/** LiveRule is one rule in the live window: points by second, limited counts by value. */
export interface LiveRule {
  domain: string;
  rule: string;
  points: Map<number, Counts>;
  top: Map<string, number>;
  masked: boolean;
}

/** Live is the live window, moved along by ticks. */
export interface Live {
  from: number;
  to: number;
  rules: Map<string, LiveRule>;
  markers: Marker[];
  spikes: Spike[];
}

function counts(c: Partial<Counts>): Counts {
  return { allowed: c.allowed || 0, limited: c.limited || 0, shadow_limited: c.shadow_limited || 0, store_errors: c.store_errors || 0 };
}

function liveRule(domain: string, rule: string): LiveRule {
  return { domain, rule, points: new Map(), top: new Map(), masked: false };
}

/** liveFrom makes the live window from GET /stats/live. */
export function liveFrom(w: StatsWindow): Live {
  const live: Live = { from: w.from, to: w.to, rules: new Map(), markers: [...w.markers], spikes: [...w.spikes] };
  if (live.to <= 0) live.to = Math.floor(Date.now() / 1000) - 1;
  if (live.from <= 0 || live.from > live.to) live.from = live.to - liveSpan + 1;
  for (const r of w.rules) {
    const lr = liveRule(r.domain, r.rule);
    lr.masked = r.masked === true;
    for (const p of r.points) lr.points.set(p.t, counts(p));
    for (const v of r.top_limited ?? []) lr.top.set(v.value, (lr.top.get(v.value) ?? 0) + v.count);
    live.rules.set(ruleKey(r.domain, r.rule), lr);
  }
  return live;
}

/**
 * mergeTick puts one second's counts into the live window. A tick replaces
 * what the window had for its second (so a tick seen twice, or one that
 * /stats/live already counted, is not counted again); rules missing from
 * it had no decision in that second. A tick newer than the window moves it
 * on: points, markers and ended spikes older than its start are dropped.
 * Ticks older than the window are ignored. Returns whether anything changed.
 */
export function mergeTick(live: Live, t: number, rules: readonly TickRule[]): boolean {
  if (t < live.from) return false;
  const already = t <= live.to;
  for (const r of live.rules.values()) r.points.delete(t);
  for (const tr of rules) {
    const key = ruleKey(tr.domain, tr.rule);
    let r = live.rules.get(key);
    if (!r) {
      r = liveRule(tr.domain, tr.rule);
      live.rules.set(key, r);
    }
    r.points.set(t, counts(tr));
    // The window's top values already include the seconds up to live.to.
    if (!already) for (const v of tr.top_limited ?? []) r.top.set(v.value, (r.top.get(v.value) ?? 0) + v.count);
    if (r.top.size > maxTopValues) trimTop(r.top);
  }
  if (t > live.to) {
    live.to = t;
    live.from = t - liveSpan + 1;
    for (const r of live.rules.values()) {
      for (const pt of r.points.keys()) if (pt < live.from) r.points.delete(pt);
    }
    live.markers = live.markers.filter((m) => m.t >= live.from);
    live.spikes = live.spikes.filter((s) => s.end === null || s.end >= live.from);
  }
  return true;
}

function trimTop(top: Map<string, number>): void {
  const keep = [...top].sort((a, b) => b[1] - a[1]).slice(0, maxTopValues);
  top.clear();
  for (const [v, c] of keep) top.set(v, c);
}

/** addMarker records a version event once (by version and kind). */
export function addMarker(markers: readonly Marker[], m: Marker): Marker[] {
  if (markers.some((x) => x.version === m.version && x.kind === m.kind)) return [...markers];
  return [...markers, m].sort((a, b) => a.t - b.t);
}

/** upsertSpike records a spike's start or end by its id. */
export function upsertSpike(spikes: readonly Spike[], s: Spike): Spike[] {
  const rest = spikes.filter((x) => x.id !== s.id);
  return [...rest, s].sort((a, b) => a.start - b.start);
}

/** livePoints lists a live rule's points, for fillSeries. */
export function livePoints(r: LiveRule): StatsPoint[] {
  return [...r.points].map(([t, c]) => ({ t, ...c }));
}

/** TopRow is a row of the most-limited table. */
export interface TopRow extends TopValue {
  domain: string;
  rule: string;
  masked: boolean;
}

/** topRows merges the selected rules' most limited values, most first, at most limit rows. */
export function topRows(rules: Iterable<LiveRule | RuleStats>, sel: Selection, limit = 10): TopRow[] {
  const out: TopRow[] = [];
  for (const r of rules) {
    if (!selected(r, sel)) continue;
    const masked = r.masked === true;
    const top = 'top' in r ? [...r.top].map(([value, count]) => ({ value, count })) : (r.top_limited ?? []);
    for (const v of top) if (v.count > 0) out.push({ domain: r.domain, rule: r.rule, value: v.value, count: v.count, masked });
  }
  out.sort((a, b) => b.count - a.count || (a.value < b.value ? -1 : a.value > b.value ? 1 : 0));
  return out.slice(0, limit);
}

/** Band is a shaded stretch of the chart (a spike): start..end in Unix seconds. */
export interface Band {
  start: number;
  end: number;
  ongoing: boolean;
  spike: Spike;
}

/** spikeBands are the selected rules' spikes clipped to [from, to]; an ongoing one runs to `to`. */
export function spikeBands(spikes: readonly Spike[], sel: Selection, from: number, to: number): Band[] {
  const out: Band[] = [];
  for (const s of spikes) {
    if (!selected(s, sel)) continue;
    const end = s.end ?? to;
    if (end < from || s.start > to) continue;
    out.push({ start: Math.max(from, s.start), end: Math.min(to, end), ongoing: s.end === null, spike: s });
  }
  return out;
}

/** markersIn are the markers within [from, to], oldest first. */
export function markersIn(markers: readonly Marker[], from: number, to: number): Marker[] {
  return markers.filter((m) => m.t >= from && m.t <= to).sort((a, b) => a.t - b.t);
}

/** markerHref is where a marker links: the diff that version made (the history for version 1). */
export function markerHref(version: number): string {
  return version > 1 ? `/history/diff/${version - 1}/${version}` : `/history?highlight=${version}`;
}

/** trafficHref is the Live traffic page showing a domain (and a rule). */
export function trafficHref(domain?: string, rule?: string, range?: Range['id']): string {
  const q = new URLSearchParams();
  if (domain) q.set('domain', domain);
  if (domain && rule) q.set('rule', rule);
  if (range && range !== 'live') q.set('range', range);
  const s = q.toString();
  return s === '' ? '/traffic' : `/traffic?${s}`;
}

/** reconnectDelay is the wait before the attempt-th reconnect (0-based): 1 s doubling to 30 s, with jitter of up to half. */
export function reconnectDelay(attempt: number, random: () => number = Math.random): number {
  const full = Math.min(30_000, 1000 * 2 ** Math.max(0, attempt));
  return Math.round(full / 2 + (full / 2) * random());
}

/** formatPerSecond renders a rate: "0", "0.35", "12.5", "1,204". */
export function formatPerSecond(v: number): string {
  if (v === 0) return '0';
  if (v < 1) return String(Math.round(v * 100) / 100);
  if (v < 100) return String(Math.round(v * 10) / 10);
  return Math.round(v).toLocaleString('en-US');
}

/** sparkline is an SVG polyline's points for values scaled into width × height (the top is the maximum, at least 1). */
export function sparkline(values: readonly number[], width: number, height: number): string {
  if (values.length === 0) return '';
  const max = Math.max(1, ...values);
  const dx = values.length > 1 ? width / (values.length - 1) : 0;
  const r = (n: number) => Math.round(n * 100) / 100;
  return values.map((v, i) => `${r(i * dx)},${r(height - (Math.max(0, v) / max) * height)}`).join(' ');
}

/** RuleTotals is one rule's row in the per-rule table: counts over the view and over its last seconds. */
export interface RuleTotals {
  domain: string;
  rule: string;
  total: Counts;
  recent: Counts;
}

/**
 * ruleTotals adds up each selected rule's points in [from, to], and
 * separately those at or after recentFrom; rules with nothing in range
 * are left out. Sorted by limited, then allowed, most first.
 */
export function ruleTotals(rules: Iterable<{ domain: string; rule: string; points: Iterable<StatsPoint> }>, sel: Selection, from: number, to: number, recentFrom: number): RuleTotals[] {
  const out: RuleTotals[] = [];
  for (const r of rules) {
    if (!selected(r, sel)) continue;
    const total = counts({});
    const recent = counts({});
    let any = false;
    for (const p of r.points) {
      if (p.t < from || p.t > to) continue;
      any = true;
      for (const c of p.t >= recentFrom ? [total, recent] : [total]) {
        c.allowed += p.allowed || 0;
        c.limited += p.limited || 0;
        c.shadow_limited += p.shadow_limited || 0;
        c.store_errors += p.store_errors || 0;
      }
    }
    if (any) out.push({ domain: r.domain, rule: r.rule, total, recent });
  }
  return out.sort((a, b) => b.total.limited - a.total.limited || b.total.allowed - a.total.allowed || (a.rule < b.rule ? -1 : 1));
}
