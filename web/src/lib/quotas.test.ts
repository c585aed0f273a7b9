import { describe, expect, it } from 'vitest';
import { isoWeek, periodOf, periodProblem, quotaParams, usageFraction, usageLabel, usageTone } from './quotas';

describe('periods', () => {
  it('names the UTC period of each unit', () => {
    const d = new Date('2026-12-01T10:00:00Z');
    expect(periodOf('day', d)).toBe('2026-12-01');
    expect(periodOf('week', d)).toBe('2026-W49');
    expect(periodOf('month', d)).toBe('2026-12');
    expect(periodOf('year', d)).toBe('2026');
    // UTC, not the local day: late on the 31st in UTC is still December.
    expect(periodOf('month', new Date('2026-12-31T23:59:59Z'))).toBe('2026-12');
  });
  it('numbers ISO weeks across year ends', () => {
    expect(isoWeek(new Date('2027-01-01T00:00:00Z'))).toEqual({ year: 2026, week: 53 });
    expect(isoWeek(new Date('2024-12-30T00:00:00Z'))).toEqual({ year: 2025, week: 1 });
    expect(isoWeek(new Date('2026-01-05T00:00:00Z'))).toEqual({ year: 2026, week: 2 });
  });
  it('explains a bad period and accepts good ones', () => {
    for (const ok of ['', '2026', '2026-12', '2026-12-31', '2026-W01', '2026-W53', '2028-02-29']) expect(periodProblem(ok)).toBeNull();
    expect(periodProblem('2026-13')).toMatch(/01 to 12/);
    expect(periodProblem('2027-02-29')).toMatch(/No such date/);
    expect(periodProblem('2025-W53')).toMatch(/weeks 01 to 52/);
    expect(periodProblem('1969')).toMatch(/1970/);
    expect(periodProblem('December')).toMatch(/Use 2026/);
  });
});

describe('usage', () => {
  it('draws and labels usage against the limit', () => {
    expect(usageFraction({ used: 25, limit: 100 })).toBe(0.25);
    expect(usageFraction({ used: 150, limit: 100 })).toBe(1);
    expect(usageFraction({ used: 0, limit: 0 })).toBe(1);
    expect(usageTone({ used: 79, limit: 100 })).toBe('ok');
    expect(usageTone({ used: 80, limit: 100 })).toBe('warn');
    expect(usageTone({ used: 100, limit: 100 })).toBe('bad');
    expect(usageLabel({ used: 1204, limit: 10000 })).toBe('1,204 of 10,000 (12 %)');
    expect(usageLabel({ used: 1, limit: 1000 })).toBe('1 of 1,000 (<1 %)');
    expect(usageLabel({ used: 3, limit: 0 })).toBe('3 (no requests allowed)');
  });
  it('builds query parameters without empty fields', () => {
    expect(quotaParams({ domain: 'bill', rule: '', value: ' a b ', period: '2026-12' }, { format: 'csv' })).toBe(
      '?domain=bill&value=a+b&period=2026-12&format=csv',
    );
    expect(quotaParams({})).toBe('');
  });
});
