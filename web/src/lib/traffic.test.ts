import { describe, expect, it } from 'vitest';
import type { Spike, StatsWindow } from './api';
import {
  addMarker,
  fillSeries,
  formatPerSecond,
  historyStep,
  liveFrom,
  livePoints,
  markerHref,
  markersIn,
  mergeTick,
  perSecond,
  rangeOf,
  reconnectDelay,
  ruleKey,
  ruleTotals,
  sparkline,
  spikeBands,
  summarize,
  topRows,
  trafficHref,
  upsertSpike,
} from './traffic';

const p = (t: number, allowed = 0, limited = 0, shadow_limited = 0, store_errors = 0) => ({ t, allowed, limited, shadow_limited, store_errors });

function window(over: Partial<StatsWindow> = {}): StatsWindow {
  return {
    step_s: 1,
    from: 1000,
    to: 1900,
    rules: [
      { domain: 'api', rule: 'per-key', points: [p(1890, 10, 3), p(1900, 5, 1)], top_limited: [{ value: 'k1', count: 4 }] },
      { domain: 'api', rule: 'global', points: [p(1900, 2, 0, 1)] },
      { domain: 'web', rule: 'per-ip', points: [p(1500, 1, 1)], top_limited: [{ value: '10.0.0.1', count: 1 }], masked: true },
    ],
    markers: [{ t: 1200, version: 3, kind: 'publish', author: 'admin', message: 'raise', domains: ['api'] }],
    spikes: [],
    ...over,
  };
}

describe('fillSeries', () => {
  it('fills the seconds without a point with zeros', () => {
    const s = fillSeries([[p(11, 2, 1), p(13, 0, 4, 1, 1)]], 10, 14, 1);
    expect(s.t).toEqual([10, 11, 12, 13, 14]);
    expect(s.allowed).toEqual([0, 2, 0, 0, 0]);
    expect(s.limited).toEqual([0, 1, 0, 4, 0]);
    expect(s.shadow).toEqual([0, 0, 0, 1, 0]);
    expect(s.errors).toEqual([0, 0, 0, 1, 0]);
  });

  it('sums several rules and drops points outside the range', () => {
    const s = fillSeries([[p(10, 1), p(99, 7)], [p(10, 2), p(5, 9)]], 10, 12, 1);
    expect(s.allowed).toEqual([3, 0, 0]);
  });

  it('aligns buckets to the step', () => {
    const s = fillSeries([[p(120, 6), p(185, 3)]], 100, 250, 60);
    expect(s.t).toEqual([60, 120, 180, 240]);
    expect(s.allowed).toEqual([0, 6, 3, 0]);
  });

  it('is empty for an inverted range', () => {
    expect(fillSeries([[p(1)]], 10, 5, 1).t).toEqual([]);
  });
});

describe('perSecond and summarize', () => {
  it('divides counts per bucket by the step', () => {
    expect(perSecond(fillSeries([[p(60, 120, 30)]], 60, 60, 60), 60).limited).toEqual([0.5]);
  });

  it('reports recent rates, the peak and totals', () => {
    const s = fillSeries([[p(1, 10, 2), p(3, 4, 6), p(4, 2, 2, 1)]], 0, 4, 1);
    const sum = summarize(s, 1, 2);
    expect(sum.now).toEqual({ allowed: 3, limited: 4, shadow_limited: 0.5, store_errors: 0 });
    expect(sum.peak).toEqual({ perSecond: 6, t: 3 });
    expect(sum.total).toEqual({ allowed: 16, limited: 10, shadow_limited: 1, store_errors: 0 });
  });

  it('has no peak without 429s', () => {
    expect(summarize(fillSeries([], 0, 3, 1), 1, 5).peak).toBeNull();
  });
});

describe('historyStep', () => {
  it.each([
    [3600, 60],
    [86400, 60],
    [7 * 86400, 600],
    [30 * 86400, 3600],
  ])('%i s → step %i', (range, step) => {
    expect(historyStep(range)).toBe(step);
    expect(range / historyStep(range)).toBeLessThanOrEqual(1500);
  });
});

describe('the live window', () => {
  it('starts from /stats/live', () => {
    const live = liveFrom(window());
    expect(live.from).toBe(1000);
    expect(live.to).toBe(1900);
    expect(live.rules.get(ruleKey('api', 'per-key'))?.points.get(1890)).toEqual({ allowed: 10, limited: 3, shadow_limited: 0, store_errors: 0 });
    expect(live.rules.get(ruleKey('web', 'per-ip'))?.masked).toBe(true);
  });

  it('moves on with a newer tick and forgets what fell out', () => {
    const live = liveFrom(window());
    expect(mergeTick(live, 2401, [{ domain: 'api', rule: 'per-key', allowed: 1, limited: 2, shadow_limited: 0, store_errors: 0, top_limited: [{ value: 'k2', count: 2 }] }])).toBe(true);
    expect(live.to).toBe(2401);
    expect(live.from).toBe(1502);
    expect(live.rules.get(ruleKey('web', 'per-ip'))?.points.size).toBe(0); // t=1500 fell out
    expect(live.markers).toEqual([]); // t=1200 fell out
    expect(live.rules.get(ruleKey('api', 'per-key'))?.top.get('k2')).toBe(2);
    const s = fillSeries([livePoints(live.rules.get(ruleKey('api', 'per-key'))!)], live.from, live.to, 1);
    expect(s.t.length).toBe(900);
    expect(s.limited.reduce((a, b) => a + b)).toBe(6); // 1890's 3 and 1900's 1 are still in (≥ 1502), plus the tick's 2
  });

  it('replaces a second instead of counting it twice', () => {
    const live = liveFrom(window());
    const tick = [{ domain: 'api', rule: 'per-key', allowed: 5, limited: 1, shadow_limited: 0, store_errors: 0, top_limited: [{ value: 'k1', count: 1 }] }];
    mergeTick(live, 1901, tick);
    mergeTick(live, 1901, tick);
    const r = live.rules.get(ruleKey('api', 'per-key'))!;
    expect(r.points.get(1901)?.limited).toBe(1);
    // /stats/live already counted 1900, which a late tick repeats.
    mergeTick(live, 1900, tick);
    expect(r.points.get(1900)?.limited).toBe(1);
    expect(r.top.get('k1')).toBe(5); // 4 from the window + 1 from the new second, once
  });

  it('clears a rule that a tick leaves out for its second', () => {
    const live = liveFrom(window());
    mergeTick(live, 1900, []);
    expect(live.rules.get(ruleKey('api', 'global'))?.points.has(1900)).toBe(false);
  });

  it('ignores ticks older than the window', () => {
    const live = liveFrom(window());
    expect(mergeTick(live, 999, [{ domain: 'api', rule: 'x', allowed: 1, limited: 0, shadow_limited: 0, store_errors: 0 }])).toBe(false);
    expect(live.rules.has(ruleKey('api', 'x'))).toBe(false);
  });

  it('adds a new rule seen first in a tick', () => {
    const live = liveFrom(window());
    mergeTick(live, 1901, [{ domain: 'new', rule: 'r', allowed: 0, limited: 9, shadow_limited: 0, store_errors: 0 }]);
    expect(live.rules.get(ruleKey('new', 'r'))?.points.get(1901)?.limited).toBe(9);
  });
});

describe('topRows', () => {
  it('merges the selected rules, most limited first', () => {
    const live = liveFrom(window());
    expect(topRows(live.rules.values(), {}).map((r) => r.value)).toEqual(['k1', '10.0.0.1']);
    expect(topRows(live.rules.values(), { domain: 'web' })).toEqual([{ domain: 'web', rule: 'per-ip', value: '10.0.0.1', count: 1, masked: true }]);
    expect(topRows(live.rules.values(), { domain: 'api', rule: 'global' })).toEqual([]);
    expect(topRows(window().rules, { domain: 'api' }).map((r) => r.value)).toEqual(['k1']);
  });
});

describe('markers and spikes', () => {
  const spike = (id: number, start: number, end: number | null, rule = 'per-key'): Spike => ({
    id,
    domain: 'api',
    rule,
    start,
    end,
    peak_limited_per_s: 100,
    baseline_per_s: 2,
  });

  it('clips spike bands to the window; an ongoing one runs to its end', () => {
    const bands = spikeBands([spike(1, 900, 1100), spike(2, 1800, null), spike(3, 10, 20), spike(4, 1500, 1600, 'other')], { domain: 'api', rule: 'per-key' }, 1000, 1900);
    expect(bands.map((b) => [b.start, b.end, b.ongoing])).toEqual([
      [1000, 1100, false],
      [1800, 1900, true],
    ]);
  });

  it('updates a spike by id when it ends', () => {
    const list = upsertSpike([spike(1, 10, null)], spike(1, 10, 50));
    expect(list).toEqual([spike(1, 10, 50)]);
  });

  it('adds a marker once and keeps them in time order', () => {
    const m = { t: 5, version: 2, kind: 'publish' as const, author: 'a', message: 'm', domains: [] };
    const list = addMarker(addMarker([{ ...m, t: 9, version: 3 }], m), m);
    expect(list.map((x) => x.version)).toEqual([2, 3]);
    expect(markersIn(list, 6, 10).map((x) => x.version)).toEqual([3]);
  });

  it('links a marker to the diff its version made', () => {
    expect(markerHref(12)).toBe('/history/diff/11/12');
    expect(markerHref(1)).toBe('/history?highlight=1');
  });
});

describe('small helpers', () => {
  it('builds traffic links', () => {
    expect(trafficHref()).toBe('/traffic');
    expect(trafficHref('api')).toBe('/traffic?domain=api');
    expect(trafficHref('a b', 'per-key', '24h')).toBe('/traffic?domain=a+b&rule=per-key&range=24h');
    expect(trafficHref(undefined, 'per-key')).toBe('/traffic');
  });

  it('reads the range, live when unknown', () => {
    expect(rangeOf('7d').seconds).toBe(604800);
    expect(rangeOf('nope').id).toBe('live');
    expect(rangeOf(null).id).toBe('live');
  });

  it('backs off from 1 s to 30 s with jitter', () => {
    expect(reconnectDelay(0, () => 0)).toBe(500);
    expect(reconnectDelay(0, () => 1)).toBe(1000);
    expect(reconnectDelay(3, () => 1)).toBe(8000);
    expect(reconnectDelay(20, () => 1)).toBe(30000);
  });

  it('formats rates', () => {
    expect([0, 0.333, 12.34, 1204.4].map(formatPerSecond)).toEqual(['0', '0.33', '12.3', '1,204']);
  });

  it('draws a sparkline scaled to its maximum', () => {
    expect(sparkline([0, 5, 10], 20, 10)).toBe('0,10 10,5 20,0');
    expect(sparkline([0, 0], 10, 10)).toBe('0,10 10,10');
    expect(sparkline([], 10, 10)).toBe('');
  });
});

describe('ruleTotals', () => {
  it('adds each selected rule up, most limited first, recent seconds apart', () => {
    const rows = ruleTotals(window().rules, { domain: 'api' }, 1000, 1900, 1895);
    expect(rows.map((r) => [r.rule, r.total.limited, r.total.allowed, r.recent.allowed])).toEqual([
      ['per-key', 4, 15, 5],
      ['global', 0, 2, 2],
    ]);
    expect(ruleTotals(window().rules, {}, 1000, 1400, 1395)).toEqual([]);
  });
});
