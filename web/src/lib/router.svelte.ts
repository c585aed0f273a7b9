// A small history-API router: the console serves index.html for every UI
// path (web/embed.go), so /domains/api survives a reload.

import { matchRoute } from './routes';

export type { Route } from './routes';

class Location {
  path = $state(window.location.pathname);
  search = $state(window.location.search);
  route = $derived(matchRoute(this.path));
  query = $derived(new URLSearchParams(this.search));
}

/** location is the current path and query, updated on navigation. */
export const location = new Location();

/** navigate goes to a UI path (with optional ?query). */
export function navigate(to: string, replace = false): void {
  const url = new URL(to, window.location.origin);
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  location.path = url.pathname;
  location.search = url.search;
  if (!replace) window.scrollTo(0, 0);
}

window.addEventListener('popstate', () => {
  location.path = window.location.pathname;
  location.search = window.location.search;
});

/**
 * interceptLinks makes same-origin <a href="/..."> clicks navigate in
 * place. Links to the API (CSV export), downloads, new tabs and modified
 * clicks keep the browser's behaviour.
 */
export function interceptLinks(root: HTMLElement): () => void {
  const onClick = (e: MouseEvent) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = (e.target as Element | null)?.closest('a');
    if (!a || a.target || a.hasAttribute('download')) return;
    const href = a.getAttribute('href');
    if (!href || !href.startsWith('/') || href.startsWith('//') || href.startsWith('/api/')) return;
    e.preventDefault();
    navigate(href);
  };
  root.addEventListener('click', onClick);
  return () => root.removeEventListener('click', onClick);
}
