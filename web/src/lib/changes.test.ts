import { describe, expect, it } from 'vitest';
import type { StructuredChange } from './api';
import { describeChange, type DescribedChange } from './changes';

describe('describeChange', () => {
  it.each<[StructuredChange, DescribedChange]>([
    [{ kind: 'domain_added', domain: 'api' }, { where: 'api', what: 'domain added' }],
    [{ kind: 'domain_removed', domain: 'api' }, { where: 'api', what: 'domain removed' }],
    [
      { kind: 'limit_added', domain: 'api', path: [{ key: 'api_key' }, { key: 'route', value: '/search' }] },
      { where: 'api_key › route=/search', what: 'limit added' },
    ],
    [
      {
        kind: 'limit_changed',
        domain: 'api',
        path: [{ key: 'user' }],
        name: 'per-user',
        fields: [
          { field: 'rate_limit.requests_per_unit', before: '100', after: '7' },
          { field: 'burst', before: '', after: '20' },
        ],
      },
      { where: 'user “per-user”', what: 'rate_limit.requests_per_unit 100 → 7; burst (not set) → 20' },
    ],
    [{ kind: 'request_descriptors_changed', domain: 'api' }, { where: 'api', what: 'request descriptors changed' }],
  ])('%j', (c, want) => {
    expect(describeChange(c)).toEqual(want);
  });
});
