// Pure helpers for the UI: no DOM, no fetch, so vitest runs them in plain Node.

/** One domain of the current ruleset, as GET /api/v1/ruleset returns it. */
export interface Domain {
  name: string;
  yaml: string;
  version: number;
}

/** The current ruleset: its version and every domain. */
export interface Ruleset {
  version: number;
  domains: Domain[];
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
export function sortDomains(domains: readonly Domain[]): Domain[] {
  return [...domains].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** lineCount is the number of lines of a YAML document (0 for an empty one). */
export function lineCount(text: string): number {
  if (text === '') return 0;
  const n = text.split('\n').length;
  return text.endsWith('\n') ? n - 1 : n;
}
