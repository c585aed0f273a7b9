// Words for the console's structured diff (GET
// /versions/{a}/diff/{b}): "limit_changed" with field before/after pairs
// becomes "requests_per_unit 100 → 7". Pure, for vitest.
import type { StructuredChange } from './api';

/** DescribedChange is a structured change in words: where, and what happened. */
export interface DescribedChange {
  where: string;
  what: string;
}

function entries(c: StructuredChange): string {
  const path = (c.path ?? []).map((e) => (e.value ? `${e.key}=${e.value}` : e.key)).join(' › ');
  const name = c.name ? ` “${c.name}”` : '';
  return (path || c.domain || '') + name;
}

function value(v: string): string {
  return v === '' ? '(not set)' : v;
}

/** describeChange renders one structured change for people. */
export function describeChange(c: StructuredChange): DescribedChange {
  switch (c.kind) {
    case 'domain_added':
      return { where: c.domain ?? '', what: 'domain added' };
    case 'domain_removed':
      return { where: c.domain ?? '', what: 'domain removed' };
    case 'limit_added':
      return { where: entries(c), what: 'limit added' };
    case 'limit_removed':
      return { where: entries(c), what: 'limit removed' };
    case 'limit_changed': {
      const fields = (c.fields ?? []).map((f) => `${f.field} ${value(f.before)} → ${value(f.after)}`);
      return { where: entries(c), what: fields.length > 0 ? fields.join('; ') : 'changed' };
    }
    default:
      return { where: entries(c), what: c.kind.replace(/_/g, ' ') };
  }
}
