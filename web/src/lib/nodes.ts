// Pure helpers for the nodes page and the rollout counts in the history.
import type { NodeInfo, Version } from './api';

/**
 * decisionsPerSecond is a node's live decision rate, from its latest stats
 * report; null when the console has none (disconnected, not reporting).
 */
export function decisionsPerSecond(node: Pick<NodeInfo, 'rates'>): number | null {
  return node.rates ? node.rates.decisions_per_second : null;
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
 * rollout is the console's count of the connected nodes that run a version
 * (applied_by of connected); null when it could not count them.
 */
export function rollout(v: Pick<Version, 'applied_by' | 'connected'>): Rollout | null {
  if (v.applied_by === null || v.connected === null) return null;
  return { applied: v.applied_by, total: v.connected };
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

/** RegionSummary is one region's connected nodes and their decision rate. */
export interface RegionSummary {
  region: string;
  nodes: number;
  decisions: number;
}

/**
 * byRegion sums the connected nodes and their decisions per second by
 * region (sorted by name; "" for nodes that name none, last); empty unless
 * some node names a region.
 */
export function byRegion(nodes: Pick<NodeInfo, 'region' | 'status' | 'rates'>[]): RegionSummary[] {
  if (!nodes.some((n) => n.region)) return [];
  const m = new Map<string, RegionSummary>();
  for (const n of nodes) {
    if (n.status !== 'connected') continue;
    const r = m.get(n.region) ?? { region: n.region, nodes: 0, decisions: 0 };
    r.nodes++;
    r.decisions += decisionsPerSecond(n) ?? 0;
    m.set(n.region, r);
  }
  return [...m.values()].sort((a, b) =>
    a.region === b.region ? 0 : a.region === '' ? 1 : b.region === '' ? -1 : a.region < b.region ? -1 : 1,
  );
}

/**
 * kindLabel names a node fed over xDS (a stock envoyproxy/ratelimit); ""
 * for a Sluice enforcer.
 */
export function kindLabel(n: Pick<NodeInfo, 'kind'>): string {
  return n.kind === 'xds' ? 'envoyproxy/ratelimit (xDS)' : '';
}
