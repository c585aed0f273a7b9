import { describe, expect, it } from 'vitest';
import type { NodeInfo } from './api';
import { byRegion, decisionsPerSecond, formatRate, kindLabel, nodeState, rollout } from './nodes';

function node(over: Partial<NodeInfo>): NodeInfo {
  return {
    id: 'n',
    applied_version: 5,
    status: 'connected',
    labels: {},
    region: '',
    build: '',
    address: '',
    connected_since: null,
    last_seen: '2026-01-01T00:00:00Z',
    protocol: 1,
    console: 'c1',
    nack_version: null,
    nack_error: '',
    nacked_at: null,
    token_id: null,
    token_name: null,
    rates: null,
    kind: 'sluice',
    unsupported_domains: [],
    ...over,
  };
}

const rates = {
  at: '2026-01-01T00:00:00Z',
  decisions_per_second: 12.5,
  allowed_per_second: 10,
  limited_per_second: 2.5,
  shadow_limited_per_second: 0,
  store_errors_per_second: 0,
};

describe('decisionsPerSecond', () => {
  it('is the report’s rate, or null without one', () => {
    expect(decisionsPerSecond({ rates })).toBe(12.5);
    expect(decisionsPerSecond({ rates: null })).toBeNull();
  });

  it.each([
    [null, '—'],
    [0, '0'],
    [12.34, '12.3'],
    [1204.4, '1,204'],
  ])('formatRate(%s) = %s', (v, want) => {
    expect(formatRate(v)).toBe(want);
  });
});

describe('rollout', () => {
  it('is the console’s count', () => {
    expect(rollout({ applied_by: 3, connected: 4 })).toEqual({ applied: 3, total: 4 });
  });

  it('is unknown when the console could not count', () => {
    expect(rollout({ applied_by: null, connected: null })).toBeNull();
  });
});

describe('nodeState', () => {
  it.each([
    [node({}), 5, 'ACK', 'ok'],
    [node({ applied_version: 4 }), 5, 'behind (v4)', 'warn'],
    [node({ nack_version: 6, nack_error: 'bad' }), 6, 'NACK v6', 'bad'],
    [node({ nack_version: 3 }), 5, 'ACK', 'ok'],
    [node({ status: 'disconnected' }), 5, 'offline', 'muted'],
  ])('%j at latest %i', (n, latest, label, tone) => {
    expect(nodeState(n, latest)).toEqual({ label, tone });
  });
});

describe('byRegion', () => {
  it('is empty when no node names a region', () => {
    expect(byRegion([node({}), node({ id: 'b' })])).toEqual([]);
  });
  it('sums connected nodes and rates per region, unnamed last', () => {
    const got = byRegion([
      node({ id: 'a', region: 'us-east', rates }),
      node({ id: 'b', region: 'eu-west', rates }),
      node({ id: 'c', region: 'us-east', rates }),
      node({ id: 'd', region: 'us-east', status: 'disconnected', rates }),
      node({ id: 'e' }),
    ]);
    expect(got).toEqual([
      { region: 'eu-west', nodes: 1, decisions: 12.5 },
      { region: 'us-east', nodes: 2, decisions: 25 },
      { region: '', nodes: 1, decisions: 0 },
    ]);
  });
});

describe('kindLabel', () => {
  it('names xDS clients and leaves Sluice enforcers plain', () => {
    expect(kindLabel(node({ kind: 'xds' }))).toBe('envoyproxy/ratelimit (xDS)');
    expect(kindLabel(node({ kind: 'sluice' }))).toBe('');
  });
});
