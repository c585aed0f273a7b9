import { describe, expect, it } from 'vitest';
import { matchRoute } from './routes';

describe('matchRoute', () => {
  it.each([
    ['/', 'domains', {}],
    ['/domains', 'domains', {}],
    ['/domains/api', 'domain', { name: 'api' }],
    ['/domains/my.domain-1', 'domain', { name: 'my.domain-1' }],
    ['/domains/~new', 'new-domain', {}],
    ['/history', 'history', {}],
    ['/history/diff/3/7', 'diff', { a: '3', b: '7' }],
    ['/history/diff/x/7', 'not-found', {}],
    ['/audit/', 'audit', {}],
    ['/nodes', 'nodes', {}],
    ['/users', 'users', {}],
    ['/tokens', 'tokens', {}],
    ['/approvals', 'approvals', {}],
    ['/traffic', 'traffic', {}],
    ['/alerts', 'alerts', {}],
    ['/quotas', 'quotas', {}],
    ['/customers', 'customers', {}],
    ['/nope', 'not-found', {}],
    ['/domains/%E0%A4%A', 'domain', { name: '%E0%A4%A' }],
  ])('%s → %s', (path, page, params) => {
    expect(matchRoute(path)).toEqual({ page, params });
  });
});
