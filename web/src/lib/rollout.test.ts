import { describe, expect, it } from 'vitest';
import { cohortRates, formatShare, parseSelector, rolloutLabel, selectorText } from './rollout';

describe('parseSelector', () => {
  it('reads labels and ignores spaces', () => {
    expect(parseSelector(' canary=true , zone=eu-1 ')).toEqual({ labels: { canary: 'true', zone: 'eu-1' }, error: '' });
    expect(parseSelector('  ')).toEqual({ labels: null, error: '' });
  });
  it.each([
    ['canary', 'not key=value'],
    ['=x', 'not key=value'],
    ['a=1,a=2', 'twice'],
    ['bad key=1', 'label key'],
    ['canary=', 'value must be'],
    ['k=a b', 'value must be'],
    [`k=${'x'.repeat(64)}`, 'value must be'],
  ])('refuses %s', (input, want) => {
    const r = parseSelector(input);
    expect(r.labels).toBeNull();
    expect(r.error).toContain(want);
  });
});

describe('cohortRates', () => {
  it('computes each side’s share of limited decisions', () => {
    const r = cohortRates([
      { t: 10, canary_allowed: 1, canary_limited: 3, rest_allowed: 9, rest_limited: 1 },
      { t: 11, canary_allowed: 0, canary_limited: 0, rest_allowed: 5, rest_limited: 0 },
    ]);
    expect(r.t).toEqual([10, 11]);
    expect(r.canary).toEqual([0.75, null]);
    expect(r.rest).toEqual([0.1, 0]);
    expect(r.canaryTotal).toEqual({ rate: 0.75, decisions: 4 });
    expect(r.restTotal).toEqual({ rate: 1 / 15, decisions: 15 });
  });
  it('has no rate without traffic', () => {
    expect(cohortRates([]).canaryTotal.rate).toBeNull();
  });
});

describe('labels and states', () => {
  it('renders', () => {
    expect(selectorText({ zone: 'a', canary: 'true' })).toBe('canary=true, zone=a');
    expect(formatShare(0.0123)).toBe('1.2%');
    expect(formatShare(0.5)).toBe('50%');
    expect(formatShare(null)).toBe('—');
    const base = { version: 4, base_version: 3, labels: { canary: 'true' }, auto_halt: null, created_at: '', created_by: 'x', ended_at: null, ended_in: null };
    expect(rolloutLabel({ ...base, state: 'staged' })).toBe('staged to canary=true');
    expect(rolloutLabel({ ...base, state: 'halted', ended_in: 5 })).toBe('halted automatically (v5)');
  });
});
