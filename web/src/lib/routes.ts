// Route matching for the UI's paths; pure, so vitest runs it in Node.

/** pages lists every page the UI has; tests walk it to visit each one. */
export const pages = [
  'domains',
  'domain',
  'new-domain',
  'history',
  'diff',
  'approvals',
  'audit',
  'nodes',
  'users',
  'tokens',
  'traffic',
  'alerts',
  'quotas',
  'customers',
  'not-found',
] as const;

/** Route is a matched page and its parameters. */
export interface Route {
  page: (typeof pages)[number];
  params: Record<string, string>;
}

/** matchRoute maps a path to a page. */
export function matchRoute(path: string): Route {
  const parts = path.split('/').filter((p) => p !== '').map(safeDecode);
  const [a, b, c, d] = parts;
  const r = (page: Route['page'], params: Record<string, string> = {}): Route => ({ page, params });
  if (parts.length === 0) return r('domains');
  switch (a) {
    case 'domains':
      if (parts.length === 1) return r('domains');
      if (parts.length === 2 && b === '~new') return r('new-domain');
      if (parts.length === 2) return r('domain', { name: b });
      break;
    case 'history':
      if (parts.length === 1) return r('history');
      if (parts.length === 4 && b === 'diff' && /^\d+$/.test(c) && /^\d+$/.test(d)) return r('diff', { a: c, b: d });
      break;
    case 'approvals':
    case 'audit':
    case 'nodes':
    case 'users':
    case 'tokens':
    case 'traffic':
    case 'alerts':
    case 'quotas':
    case 'customers':
      if (parts.length === 1) return r(a);
      break;
  }
  return r('not-found');
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}
