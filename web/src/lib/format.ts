// Pure helpers for the UI: no DOM, no fetch, so vitest runs them in plain Node.

/** Named is anything listed by name, like a domain. */
export interface Named {
  name: string;
}

/**
 * errorMessage turns a failed API response into one line for people.
 * The console answers errors as {"error":{"code","message","details"}};
 * anything else (a proxy's HTML page, an empty body) falls back to the status.
 */
export function errorMessage(status: number, body: unknown): string {
  if (typeof body === 'object' && body !== null && 'error' in body) {
    const err = (body as { error: unknown }).error;
    if (typeof err === 'object' && err !== null) {
      const { message, details } = err as { message?: unknown; details?: unknown };
      if (typeof message === 'string' && message !== '') {
        if (Array.isArray(details) && details.length > 0) {
          return `${message} (${details.length} problem${details.length === 1 ? '' : 's'})`;
        }
        return message;
      }
    }
  }
  if (status === 401) return 'Not signed in.';
  if (status === 403) return 'You are not allowed to do that.';
  if (status === 429) return 'Too many attempts; wait a moment and try again.';
  if (status >= 500) return `The console failed (HTTP ${status}).`;
  return `Request failed (HTTP ${status}).`;
}

/** sortDomains returns the domains ordered by name, leaving the input as it was. */
export function sortDomains<T extends Named>(domains: readonly T[]): T[] {
  return [...domains].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** lineCount is the number of lines of a YAML document (0 for an empty one). */
export function lineCount(text: string): number {
  if (text === '') return 0;
  const n = text.split('\n').length;
  return text.endsWith('\n') ? n - 1 : n;
}

/** formatTime renders an RFC 3339 time in the viewer's zone: "2026-05-01 14:03:07". */
export function formatTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** ago renders how long before now a time was: "12 s ago", "3 min ago", "2 h ago", "5 d ago". */
export function ago(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return '—';
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return iso;
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** actorName shortens an audit actor for tables: "user:alice" → "alice"; tokens keep their prefix. */
export function actorName(actor: string | null | undefined): string {
  if (!actor) return '—';
  return actor.startsWith('user:') ? actor.slice(5) : actor;
}

/** toRFC3339 turns a datetime-local input's value ("2026-05-01T14:03") into RFC 3339, or "" when empty. */
export function toRFC3339(local: string): string {
  if (local === '') return '';
  const d = new Date(local);
  return Number.isNaN(d.getTime()) ? '' : d.toISOString();
}
