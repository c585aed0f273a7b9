import { describe, expect, it } from 'vitest';
import type { NodeInfo } from './api';
import { decisionsPerSecond, formatRate, nodeState, rollout } from './nodes';

function node(over: Partial<NodeInfo>): NodeInfo {
  return { id: 'n', applied_version: 5, status: 'connected', last_seen: '2026-01-01T00:00:00Z', ...over };
}

describe('decisionsPerSecond', () => {
  it.each([
    [null, null],
    [{}, null],
    [{ decisions_per_second: 12.5 }, 12.5],
    [{ allowed: 10, limited: 2, shadow_limited: 1 }, 13],
  ])('rates %j → %s', (rates, want) => {
    expect(decisionsPerSecond({ rates })).toBe(want);
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
  const list = [node({ id: 'a', applied_version: 7 }), node({ id: 'b', applied_version: 6 }), node({ id: 'c', status: 'disconnected', applied_version: 7 })];

  it('prefers the console’s own count', () => {
    expect(rollout({ version: 7, applied_by: 3, connected: 4 }, list)).toEqual({ applied: 3, total: 4 });
  });

  it('counts connected nodes that run exactly this version', () => {
    expect(rollout({ version: 7 }, list)).toEqual({ applied: 1, total: 2 });
    expect(rollout({ version: 6 }, list)).toEqual({ applied: 1, total: 2 });
    expect(rollout({ version: 5 }, list)).toEqual({ applied: 0, total: 2 });
  });

  it('is unknown without either', () => {
    expect(rollout({ version: 7 }, null)).toBeNull();
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
