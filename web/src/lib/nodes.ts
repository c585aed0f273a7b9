// Pure helpers for the nodes page and the rollout counts in the history.
import type { NodeInfo, Version } from './api';

/**
 * decisionsPerSecond reads a node's live decision rate from its `rates`
 * (issue 6). It accepts a total (decisions_per_second, decisions, total) or
 * per-outcome rates (allowed, limited, shadow_limited, ...) and adds them up;
 * null when the console reports no rates.
 */
export function decisionsPerSecond(node: Pick<NodeInfo, 'rates'>): number | null {
  const r = node.rates;
  if (!r || typeof r !== 'object') return null;
  for (const k of ['decisions_per_second', 'decisions', 'total', 'checks']) {
    if (typeof r[k] === 'number') return r[k] as number;
  }
  let sum = 0;
  let found = false;
  for (const k of ['allowed', 'limited', 'over_limit', 'shadow_limited', 'store_errors', 'errors']) {
    if (typeof r[k] === 'number') {
      sum += r[k] as number;
      found = true;
    }
  }
  return found ? sum : null;
}

/** formatRate renders decisions per second: "0", "12.5", "1,204". */
export function formatRate(v: number | null): string {
  if (v === null) return '—';
  if (v < 100) return String(Math.round(v * 10) / 10);
  return Math.round(v).toLocaleString('en-US');
}

/** Rollout is how many of the connected nodes run a version. */
export interface Rollout {
  applied: number;
  total: number;
}

/**
 * rollout counts the connected nodes that run a version. The console's own
 * count (applied_by of connected, issue 6) wins; otherwise it is computed
 * from the node list the same way: connected nodes whose applied version is
 * exactly this one (an older version's count drops as nodes move on).
 */
export function rollout(v: Pick<Version, 'version' | 'applied_by' | 'connected'>, list: readonly NodeInfo[] | null): Rollout | null {
  if (typeof v.applied_by === 'number' && typeof v.connected === 'number') {
    return { applied: v.applied_by, total: v.connected };
  }
  if (!list) return null;
  const connected = list.filter((n) => n.status === 'connected');
  return { applied: connected.filter((n) => n.applied_version === v.version).length, total: connected.length };
}

/** nodeState says what a node's row shows: in sync, behind, nacked or offline. */
export function nodeState(n: NodeInfo, latest: number): { label: string; tone: 'ok' | 'warn' | 'bad' | 'muted' } {
  if (n.status !== 'connected') return { label: 'offline', tone: 'muted' };
  if (n.nack_version != null && n.nack_version > n.applied_version) {
    return { label: `NACK v${n.nack_version}`, tone: 'bad' };
  }
  if (latest > 0 && n.applied_version < latest) return { label: `behind (v${n.applied_version})`, tone: 'warn' };
  return { label: 'ACK', tone: 'ok' };
}
