import { describe, expect, it } from 'vitest';
import { canSupport, type DomainConfig, type Override, type ValueHistory } from './api';
import {
  candidates,
  customersHref,
  entriesFor,
  entriesText,
  expiryChoices,
  expiryProblem,
  limitShapes,
  localInput,
  overrideEffect,
  overridesOf,
  parseLocalInput,
  parsePairs,
  perMinute,
  preselect,
} from './customers';

const config = {
  domain: 'api',
  descriptors: [
    {
      key: 'api_key',
      rate_limit: { unit: 'minute', requests_per_unit: 1000, name: 'per-key' },
      descriptors: [{ key: 'route', value: '/search', rate_limit: { unit: 'minute', requests_per_unit: 100 } }],
    },
    { key: 'plan', value: 'free', rate_limit: { unit: 'day', requests_per_unit: 10000 } },
    { key: 'user', descriptors: [{ key: 'org', rate_limit: { unit: 'hour', requests_per_unit: 5 } }] },
    { key: 'remote_address', rate_limit: { unit: 'second', requests_per_unit: 10 } },
    { key: 'tenant', value: 'acme*', rate_limit: { unit: 'second', requests_per_unit: 10 } },
  ],
} as unknown as DomainConfig;

describe('limit shapes', () => {
  it('names every limit as stats do and lists the levels that reach it, in YAML order', () => {
    expect(limitShapes(config)).toEqual([
      { rule: 'per-key', levels: [{ key: 'api_key' }] },
      { rule: 'api_key.route_/search', levels: [{ key: 'api_key' }, { key: 'route', value: '/search' }] },
      { rule: 'plan_free', levels: [{ key: 'plan', value: 'free' }] },
      { rule: 'user.org', levels: [{ key: 'user' }, { key: 'org' }] },
      { rule: 'remote_address', levels: [{ key: 'remote_address' }] },
      { rule: 'tenant_acme*', levels: [{ key: 'tenant', value: 'acme*' }] },
    ]);
    expect(limitShapes(null)).toEqual([]);
  });
});

describe('descriptors from a value', () => {
  const shapes = limitShapes(config);
  const by = (rule: string) => shapes.find((s) => s.rule === rule)!;

  it('gives open levels the value and fixed levels their own', () => {
    expect(entriesFor(by('per-key'), 'k1')).toEqual([{ key: 'api_key', value: 'k1' }]);
    expect(entriesFor(by('api_key.route_/search'), 'k1')).toEqual([
      { key: 'api_key', value: 'k1' },
      { key: 'route', value: '/search' },
    ]);
  });
  it('takes a fixed one-level value only when it is the value (wildcards included)', () => {
    expect(entriesFor(by('plan_free'), 'free')).toEqual([{ key: 'plan', value: 'free' }]);
    expect(entriesFor(by('plan_free'), 'k1')).toBeNull();
    expect(entriesFor(by('tenant_acme*'), 'acme-eu')).toEqual([{ key: 'tenant', value: 'acme-eu' }]);
    expect(entriesFor(by('tenant_acme*'), 'other')).toBeNull();
  });
  it("reads the stats' name of a several-entry value into its entries", () => {
    expect(entriesFor(by('user.org'), 'user=u1, org=o7')).toEqual([
      { key: 'user', value: 'u1' },
      { key: 'org', value: 'o7' },
    ]);
    // A value of other keys is the customer's value at each open level.
    expect(entriesFor(by('user.org'), 'a=b, c=d')).toEqual([
      { key: 'user', value: 'a=b, c=d' },
      { key: 'org', value: 'a=b, c=d' },
    ]);
    expect(entriesFor(by('per-key'), '')).toBeNull();
  });
  it('parses pairs and refuses what is not pairs', () => {
    expect(parsePairs('a=1, b=x=y')).toEqual([
      { key: 'a', value: '1' },
      { key: 'b', value: 'x=y' },
    ]);
    expect(parsePairs('plain')).toBeNull();
    expect(parsePairs('=v')).toBeNull();
    expect(entriesText([{ key: 'a', value: '1' }, { key: 'b', value: '2' }])).toBe('a=1, b=2');
  });
  it('offers one candidate per distinct descriptor and preselects the rule it came from', () => {
    const cs = candidates(shapes, 'k1');
    expect(cs.map((c) => c.id)).toEqual(['api_key=k1', 'api_key=k1, route=/search', 'user=k1, org=k1', 'remote_address=k1']);
    expect(preselect(cs, shapes, 'api_key.route_/search')).toEqual(['api_key=k1, route=/search']);
    // Without a rule: the one-entry per-customer limits.
    expect(preselect(cs, shapes, '')).toEqual(['api_key=k1', 'remote_address=k1']);
    expect(preselect(cs, shapes, 'no-such-rule')).toEqual(['api_key=k1', 'remote_address=k1']);
    const free = candidates(shapes, 'free');
    expect(preselect(free.filter((c) => c.id === 'plan=free'), shapes, '')).toEqual(['plan=free']);
    expect(preselect([], shapes, '')).toEqual([]);
  });
  it('merges limits whose shapes give the same descriptor', () => {
    const twice = limitShapes({
      domain: 'd',
      descriptors: [
        { key: 'k', rate_limit: { unit: 'second', requests_per_unit: 1, name: 'a' } },
        { key: 'k', rate_limit: { unit: 'minute', requests_per_unit: 9, name: 'b' } },
      ],
    } as unknown as DomainConfig);
    expect(candidates(twice, 'v')).toEqual([{ id: 'k=v', rules: ['a', 'b'], entries: [{ key: 'k', value: 'v' }] }]);
  });
});

describe('overrides of a customer', () => {
  const o = (id: number, entries: { key: string; value: string }[]) => ({ id, entries }) as unknown as Override;
  it('keeps those for one of the descriptors or naming the value', () => {
    const list = [o(1, [{ key: 'api_key', value: 'k1' }]), o(2, [{ key: 'api_key', value: 'k2' }]), o(3, [{ key: 'x', value: 'y' }, { key: 'route', value: 'k1' }]), o(4, [{ key: 'z', value: 'w' }])];
    expect(overridesOf(list, [[{ key: 'z', value: 'w' }]], 'k1').map((x) => x.id)).toEqual([1, 3, 4]);
    expect(overridesOf(list, [], 'nobody')).toEqual([]);
  });
});

describe('expiry', () => {
  // A Wednesday, 10:00 local time.
  const now = new Date(2026, 11, 2, 10, 0, 0);
  it('offers 2 minutes, an hour, a day and Friday evening', () => {
    const cs = expiryChoices(now);
    expect(cs.map((c) => c.id)).toEqual(['2m', '1h', '1d', 'friday']);
    expect(cs[0].at.getTime() - now.getTime()).toBe(120_000);
    expect(cs[1].at.getTime() - now.getTime()).toBe(3600_000);
    expect(cs[2].at.getTime() - now.getTime()).toBe(86400_000);
    expect(localInput(cs[3].at)).toBe('2026-12-04T18:00:00');
  });
  it('means this Friday before 18:00 on a Friday and next Friday after', () => {
    expect(localInput(expiryChoices(new Date(2026, 11, 4, 9, 0, 0))[3].at)).toBe('2026-12-04T18:00:00');
    expect(localInput(expiryChoices(new Date(2026, 11, 4, 18, 0, 0))[3].at)).toBe('2026-12-11T18:00:00');
    expect(localInput(expiryChoices(new Date(2026, 11, 5, 12, 0, 0))[3].at)).toBe('2026-12-11T18:00:00');
  });
  it('round-trips the datetime-local form and refuses malformed ones', () => {
    const d = new Date(2026, 0, 9, 7, 5, 3);
    expect(localInput(d)).toBe('2026-01-09T07:05:03');
    expect(parseLocalInput(localInput(d))?.getTime()).toBe(d.getTime());
    expect(parseLocalInput('2026-01-09T07:05')?.getTime()).toBe(new Date(2026, 0, 9, 7, 5, 0).getTime());
    for (const bad of ['', 'tomorrow', '2026-02-30T10:00', '2026-01-09 07:05']) expect(parseLocalInput(bad)).toBeNull();
  });
  it('takes the future up to 90 days', () => {
    expect(expiryProblem(null, now)).toMatch(/Choose/);
    expect(expiryProblem(now, now)).toMatch(/future/);
    expect(expiryProblem(new Date(now.getTime() + 1000), now)).toBeNull();
    expect(expiryProblem(new Date(now.getTime() + 90 * 86400_000), now)).toBeNull();
    expect(expiryProblem(new Date(now.getTime() + 90 * 86400_000 + 1000), now)).toMatch(/90 days/);
  });
});

describe('what an override changes', () => {
  const history = {
    domain: 'api',
    value: 'k1',
    from: 0,
    to: 7200,
    step_s: 60,
    rules: [
      {
        rule: 'per-key',
        complete: false,
        points: [
          { t: 60, limited: 500, complete: true }, // before the last hour
          { t: 3660, limited: 30, complete: true },
          { t: 3720, limited: 3, complete: true },
          { t: 3780, limited: 0, complete: false },
        ],
      },
    ],
  } as ValueHistory;
  it('admits, of each minute, up to the raise of the per-minute rate', () => {
    const e = overrideEffect(history, 'per-key', { requests_per_unit: 10, unit: 'minute' }, { requests_per_unit: 20, unit: 'minute' }, 3600);
    expect(e).toEqual({ rule: 'per-key', limited: 33, minutes: 2, admitted: 13, stillLimited: 20, complete: false });
  });
  it('admits nothing more for a lowering, and everything for a large raise', () => {
    expect(overrideEffect(history, 'per-key', { requests_per_unit: 10, unit: 'minute' }, { requests_per_unit: 1, unit: 'minute' }, 3600).admitted).toBe(0);
    expect(overrideEffect(history, 'per-key', { requests_per_unit: 10, unit: 'minute' }, { requests_per_unit: 100, unit: 'second' }, 3600).stillLimited).toBe(0);
  });
  it('counts nothing for a rule without 429s', () => {
    expect(overrideEffect(history, 'other', { requests_per_unit: 1, unit: 'hour' }, { requests_per_unit: 2, unit: 'hour' }, 0)).toEqual({
      rule: 'other',
      limited: 0,
      minutes: 0,
      admitted: 0,
      stillLimited: 0,
      complete: true,
    });
    expect(overrideEffect(null, 'x', { requests_per_unit: 1, unit: 'hour' }, { requests_per_unit: 2, unit: 'hour' }, 0).limited).toBe(0);
  });
  it('spreads units over minutes', () => {
    expect(perMinute(120, 'hour')).toBe(2);
    expect(perMinute(1, 'second')).toBe(60);
    expect(perMinute(5, 'fortnight')).toBe(0);
  });
});

describe('links', () => {
  it('carries the domain, rule and value', () => {
    expect(customersHref('api', 'k 1&x', 'per-key')).toBe('/customers?domain=api&rule=per-key&value=k+1%26x');
    expect(customersHref('api', 'k1')).toBe('/customers?domain=api&value=k1');
  });
});

describe('roles', () => {
  it('lets support staff, editors and admins reset and grant overrides, not viewers', () => {
    expect(['viewer', 'support', 'editor', 'admin', 'node', undefined].map((r) => canSupport(r))).toEqual([false, true, true, true, false, false]);
  });
});
