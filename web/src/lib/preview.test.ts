import { describe, expect, it } from 'vitest';
import type { PreviewLimit } from './api';
import { describeLimit, previewSeries, previewSummary, range } from './preview';

function limit(over: Partial<PreviewLimit>): PreviewLimit {
  return {
    name: 'per-key',
    change: 'limit_changed',
    before: null,
    after: {
      path: 'api_key',
      name: 'per-key',
      unit: 'minute',
      requests_per_unit: 10,
      burst: 10,
      algorithm: 'fixed_window',
      unlimited: false,
      shadow_mode: false,
      detailed_metric: false,
      failure_mode: 'open',
      calendar: false,
      shards: 1,
      lease: false,
      consistency: 'exact',
    },
    previewable: true,
    estimate: false,
    points: [
      { t: 60, span_s: 60, requests: 100, limited: 0, would_limit: 40, would_limit_low: 40, would_limit_high: 40, values: 2, values_low: 2, values_high: 2 },
      { t: 120, span_s: 60, requests: 50, limited: 5, would_limit: 12, would_limit_low: 10, would_limit_high: 14, values: 1, values_low: 1, values_high: 1 },
    ],
    totals: { requests: 150, limited: 5, would_limit: 52, would_limit_low: 50, would_limit_high: 54, values_max: 2 },
    ...over,
  };
}

describe('previewSeries', () => {
  it('puts actually limited on the 429 line and would-limit beside it', () => {
    const s = previewSeries(limit({}));
    expect(s.t).toEqual([60, 120]);
    expect(s.limited).toEqual([0, 5]);
    expect(s.shadow).toEqual([40, 12]);
    expect(s.allowed).toEqual([0, 0]);
  });
});

describe('previewSummary', () => {
  it('states the estimate with its bounds', () => {
    expect(previewSummary(limit({}))).toBe(
      'Over the last 2 minutes with traffic, ≈52 (50–54) of 150 requests would have been limited (5 actually were); at most 2 distinct values would have hit it in one minute.',
    );
  });
  it('says why a limit cannot be previewed', () => {
    expect(previewSummary(limit({ previewable: false, reason: 'a new limit' }))).toBe('a new limit');
  });
});

describe('range and describeLimit', () => {
  it.each([
    [7, 7, 7, '7'],
    [7, 6, 9, '≈7 (6–9)'],
  ])('range(%d, %d, %d) = %s', (e, l, h, want) => expect(range(e, l, h)).toBe(want));
  it('describes limits', () => {
    expect(describeLimit(null)).toBe('none');
    expect(describeLimit(limit({}).after)).toBe('10 / minute (fixed_window)');
  });
});
