// The console's REST API, as the UI uses it. Sessions are cookies set by the
// console; writes also carry the CSRF token that the login answer returns.
import { errorMessage, type Ruleset } from './format';

/** The CSRF header sent on writes (POST, PUT, DELETE). */
export const csrfHeader = 'X-CSRF-Token';

const csrfKey = 'sluice.csrf';

/** APIError is a non-2xx answer from the console. */
export class APIError extends Error {
  readonly status: number;
  readonly body: unknown;

  constructor(status: number, body: unknown) {
    super(errorMessage(status, body));
    this.name = 'APIError';
    this.status = status;
    this.body = body;
  }
}

/** Me is the signed-in user, as GET /api/v1/me answers. */
export interface Me {
  name?: string;
  username?: string;
  role?: string;
  csrf_token?: string;
}

function csrfToken(): string {
  return sessionStorage.getItem(csrfKey) ?? '';
}

function rememberCSRF(token: string | undefined): void {
  if (token) sessionStorage.setItem(csrfKey, token);
}

async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD') headers[csrfHeader] = csrfToken();

  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
  });
  const text = await res.text();
  let parsed: unknown = null;
  if (text !== '') {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  if (!res.ok) throw new APIError(res.status, parsed);
  return parsed as T;
}

/** login starts a session; the console sets the cookie and returns the CSRF token. */
export async function login(username: string, password: string): Promise<void> {
  const out = await request<{ csrf_token: string }>('POST', '/api/v1/auth/login', { username, password });
  rememberCSRF(out.csrf_token);
}

/** logout ends the session. */
export async function logout(): Promise<void> {
  try {
    await request<unknown>('POST', '/api/v1/auth/logout', {});
  } finally {
    sessionStorage.removeItem(csrfKey);
  }
}

/** me returns the signed-in user, or null when there is no session (401). */
export async function me(): Promise<Me | null> {
  try {
    const out = await request<Me>('GET', '/api/v1/me');
    rememberCSRF(out.csrf_token);
    return out;
  } catch (err) {
    if (err instanceof APIError && err.status === 401) return null;
    throw err;
  }
}

/** ruleset returns the current version and every domain. */
export function ruleset(): Promise<Ruleset> {
  return request<Ruleset>('GET', '/api/v1/ruleset');
}
