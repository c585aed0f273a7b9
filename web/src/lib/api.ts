// The console's REST API, as the UI uses it. Sessions are cookies set by the
// console; writes also carry the CSRF token that the login answer returns.
//
// A 401 on any call but login means the session ended: the handler set with
// onSessionEnded sends the user back to the sign-in page (drafts are kept in
// sessionStorage by the editor). Routes that this console does not have yet
// answer 404 "no such route" or 405; isUnavailable tells those apart so pages
// can say "not available" instead of failing.
import { errorMessage } from './format';
import { quotaParams, type QuotaQuery } from './quotas';

/** The CSRF header sent on writes (POST, PUT, PATCH, DELETE). */
export const csrfHeader = 'X-CSRF-Token';

const csrfKey = 'sluice.csrf';
const base = '/api/v1';

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

  /** details is the console's error details (validation problems, conflict info). */
  get details(): unknown {
    return (this.body as { error?: { details?: unknown } } | null)?.error?.details;
  }
}

/** isUnavailable reports an error that means "this console has no such route". */
export function isUnavailable(err: unknown): boolean {
  if (!(err instanceof APIError)) return false;
  if (err.status === 405 || err.status === 501) return true;
  if (err.status !== 404) return false;
  const e = (err.body as { error?: { message?: unknown } } | null)?.error;
  // The console's NoRoute answer; a missing row says "not found".
  return e?.message === 'no such route' || err.body === null || typeof err.body === 'string';
}

let sessionEnded: () => void = () => {};

/** onSessionEnded sets what happens when a call answers 401 (not signed in any more). */
export function onSessionEnded(handler: () => void): void {
  sessionEnded = handler;
}

function csrfToken(): string {
  return sessionStorage.getItem(csrfKey) ?? '';
}

function rememberCSRF(token: string | undefined): void {
  if (token) sessionStorage.setItem(csrfKey, token);
}

interface RequestOptions {
  /** Don't treat 401 as the end of the session (login, me). */
  quiet401?: boolean;
}

/** Answer is a response's status with its parsed body. */
interface Answer<T> {
  status: number;
  body: T;
}

async function send<T>(method: string, path: string, body?: unknown, opts: RequestOptions = {}): Promise<Answer<T>> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD') headers[csrfHeader] = csrfToken();

  const res = await fetch(base + path, {
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
  if (!res.ok) {
    if (res.status === 401 && !opts.quiet401) sessionEnded();
    throw new APIError(res.status, parsed);
  }
  return { status: res.status, body: parsed as T };
}

async function request<T>(method: string, path: string, body?: unknown, opts?: RequestOptions): Promise<T> {
  return (await send<T>(method, path, body, opts)).body;
}

function query(params: Record<string, string | number | undefined | null>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s === '' ? '' : `?${s}`;
}

function seg(s: string | number): string {
  return encodeURIComponent(String(s));
}

// --- sessions ----------------------------------------------------------------

/** Me is the signed-in user, as GET /api/v1/me answers. */
export interface Me {
  name?: string;
  username?: string;
  role?: string;
  csrf_token?: string;
  /** The domains the role holds for, when all_domains is false. */
  domains?: string[];
  all_domains?: boolean;
  /** A read-only token: GET requests only. */
  read_only?: boolean;
}

/** login starts a session; the console sets the cookie and returns the CSRF token. */
export async function login(username: string, password: string): Promise<void> {
  const out = await request<{ csrf_token: string }>('POST', '/auth/login', { username, password }, { quiet401: true });
  rememberCSRF(out.csrf_token);
}

/** logout ends the session. */
export async function logout(): Promise<void> {
  try {
    await request<unknown>('POST', '/auth/logout', {}, { quiet401: true });
  } finally {
    sessionStorage.removeItem(csrfKey);
  }
}

/** me returns the signed-in user, or null when there is no session (401). */
export async function me(): Promise<Me | null> {
  try {
    const out = await request<Me>('GET', '/me', undefined, { quiet401: true });
    rememberCSRF(out.csrf_token);
    return out;
  } catch (err) {
    if (err instanceof APIError && err.status === 401) return null;
    throw err;
  }
}

/** canEdit reports whether a role may publish. */
export function canEdit(role: string | undefined): boolean {
  return role === 'editor' || role === 'admin';
}

/**
 * canEditDomain reports whether me may publish to domain: an editor or
 * admin whose role holds for that domain (every domain, or it is listed).
 * The console checks again; this only hides what would be refused.
 */
export function canEditDomain(me: Me | null | undefined, domain: string): boolean {
  if (!me || me.read_only || !canEdit(me.role)) return false;
  return me.all_domains !== false || (me.domains ?? []).includes(domain);
}

// --- rules -------------------------------------------------------------------

/** DomainRevision is a domain's YAML and the version that last changed it. */
export interface DomainRevision {
  name: string;
  yaml: string;
  version: number;
  /** When, by whom and why the domain last changed (issue 5's console). */
  changed_at?: string;
  author?: string;
  message?: string;
}

/** Ruleset is every domain at one version. */
export interface Ruleset {
  version: number;
  checksum?: string;
  domains: DomainRevision[];
}

/** DomainDetail is GET /domains/{d}: the domain and the ruleset's current version. */
export interface DomainDetail extends DomainRevision {
  current_version?: number;
}

/** ruleset returns the current version and every domain. */
export function ruleset(): Promise<Ruleset> {
  return request<Ruleset>('GET', '/ruleset');
}

/** domain returns one domain as of the latest version. */
export function domain(name: string): Promise<DomainDetail> {
  return request<DomainDetail>('GET', `/domains/${seg(name)}`);
}

/**
 * PublishResult is a publish's answer: a new version, or (four-eyes on) a
 * change request waiting for approval.
 */
export interface PublishResult {
  version?: number;
  change?: ChangeRequest;
}

function publishResult(a: Answer<unknown>): PublishResult {
  const b = (a.body ?? {}) as Record<string, unknown>;
  if (typeof b.version === 'number' && a.status !== 202) return { version: b.version };
  const change = (b.change_request ?? b.change ?? b) as ChangeRequest;
  return { change };
}

/**
 * publish validates and publishes a domain's YAML based on base_version.
 * breakGlass (admins, four-eyes on) publishes at once with an audited reason.
 */
export async function publish(
  name: string,
  yaml: string,
  message: string,
  baseVersion: number,
  breakGlass = '',
  rollout?: RolloutSpec,
): Promise<PublishResult> {
  const body: Record<string, unknown> = { yaml, message, base_version: baseVersion };
  if (breakGlass !== '') body.break_glass_reason = breakGlass;
  if (rollout) body.rollout = rollout;
  return publishResult(await send('PUT', `/domains/${seg(name)}`, body));
}

/** deleteDomain publishes a version without the domain. */
export async function deleteDomain(name: string, message: string, baseVersion: number): Promise<PublishResult> {
  return publishResult(await send('DELETE', `/domains/${seg(name)}`, { message, base_version: baseVersion }));
}

/** Version is one published version, as GET /versions lists it. */
export interface Version {
  version: number;
  created_at: string;
  author: string;
  message: string;
  rollback_of: number | null;
  checksum?: string;
  /** Nodes that applied this version (issue 6). */
  applied_by?: number;
  /** Nodes connected when counted (issue 6). */
  connected?: number;
  approved_by?: string | null;
  change_id?: number | null;
  /** The domains this version changed (issue 5). */
  domains?: string[];
  /** Set when the version was staged to labelled nodes (issue 19). */
  rollout?: Rollout | null;
}

/**
 * Page is one page of a list. next is how to ask for the following page:
 * the console's next_cursor when it pages with cursors (issue 5), else the
 * last item's key for the foundation's ?before=; null on the last page.
 */
export interface Page<T> {
  items: T[];
  next: PageCursor | null;
}

/** PageCursor asks for the page after another one. */
export type PageCursor = { cursor: string } | { before: number };

function pageOf<T>(items: T[], nextCursor: unknown, limit: number, key: (t: T) => number): Page<T> {
  if (nextCursor !== undefined) {
    return { items, next: typeof nextCursor === 'string' && nextCursor !== '' ? { cursor: nextCursor } : null };
  }
  const last = items[items.length - 1];
  return { items, next: items.length === limit && last ? { before: key(last) } : null };
}

/** versions lists versions, newest first. */
export async function versions(opts: { limit: number; after?: PageCursor | null }): Promise<Page<Version>> {
  const out = await request<{ versions: Version[]; next_cursor?: string | null }>(
    'GET',
    `/versions${query({ limit: opts.limit, ...(opts.after ?? {}) })}`,
  );
  return pageOf(out.versions ?? [], out.next_cursor, opts.limit, (v) => v.version);
}

/** VersionSnapshot is GET /versions/{n}: its metadata and every domain at it. */
export interface VersionSnapshot {
  version: Version;
  domains: DomainRevision[];
}

/** version returns one version with its domains. */
export function version(n: number): Promise<VersionSnapshot> {
  return request<VersionSnapshot>('GET', `/versions/${seg(n)}`);
}

/**
 * ServerDiff is GET /versions/{a}/diff/{b}: the domains that differ, each
 * with its unified diff and structured changes (rules.DiffRulesets; the
 * one ruleset diff, which `sluice rules diff -json` prints too).
 */
export interface ServerDiff {
  from: number;
  to: number;
  domains: DomainDiff[];
}

/** DomainDiff is one domain's part of a ServerDiff. */
export interface DomainDiff {
  name: string;
  change: 'added' | 'removed' | 'changed';
  /** Unified diff of the YAML ("diff -u"). */
  unified: string;
  /** Lines added and removed. */
  added: number;
  removed: number;
  /** Structured changes; empty when only the text changed, or when error is set. */
  changes: StructuredChange[];
  /** Set when one side's YAML no longer parses. */
  error?: string;
}

/** StructuredChange is one limit (or domain) added, removed or changed. */
export interface StructuredChange {
  kind: string;
  domain?: string;
  path?: { key: string; value?: string }[];
  name?: string;
  fields?: { field: string; before: string; after: string }[];
}

/** versionDiff asks the console for its diff of a → b. */
export function versionDiff(a: number, b: number): Promise<ServerDiff> {
  return request<ServerDiff>('GET', `/versions/${seg(a)}/diff/${seg(b)}`);
}

/**
 * rollback publishes a new version whose content is version n's. With
 * baseVersion, the console refuses (409) if the ruleset changed after the
 * version the user previewed; a console that does not know the field (the
 * foundation's strict JSON answers 400 naming it) gets the request without it.
 */
export async function rollback(n: number, message: string, baseVersion?: number): Promise<PublishResult> {
  const path = `/versions/${seg(n)}/rollback`;
  if (baseVersion === undefined) return publishResult(await send('POST', path, { message }));
  try {
    return publishResult(await send('POST', path, { message, base_version: baseVersion }));
  } catch (err) {
    if (err instanceof APIError && err.status === 400 && /unknown field "base_version"/.test(err.message)) {
      return publishResult(await send('POST', path, { message }));
    }
    throw err;
  }
}

/**
 * domainSchema fetches the JSON Schema of a domain file: GET /schema when
 * the console serves one, else the DomainConfig schema of its OpenAPI
 * document (GET /openapi.json, issue 5). null when neither is there.
 */
export async function domainSchema(): Promise<Record<string, unknown> | null> {
  try {
    const s = await request<unknown>('GET', '/schema');
    if (s && typeof s === 'object') return s as Record<string, unknown>;
  } catch (err) {
    if (!isUnavailable(err)) throw err;
  }
  try {
    const doc = await request<{ components?: { schemas?: Record<string, unknown> } }>('GET', '/openapi.json');
    if (doc?.components?.schemas?.DomainConfig) {
      // Refs inside stay "#/components/schemas/...", resolved against this root.
      return { $ref: '#/components/schemas/DomainConfig', components: doc.components };
    }
  } catch (err) {
    if (!isUnavailable(err)) throw err;
  }
  return null;
}

// --- four-eyes -----------------------------------------------------------------

/** Settings are the console-wide options (issue 5). */
export interface Settings {
  require_approval?: boolean;
  /** Seconds a session lasts without a request, and after sign-in at most. */
  session_idle_s?: number;
  session_absolute_s?: number;
}

/** setSessionLifetimes changes the session timeouts, in seconds (admin). */
export function setSessionLifetimes(idleS: number, absoluteS: number): Promise<Settings> {
  return request<Settings>('PUT', '/settings', { session_idle_s: idleS, session_absolute_s: absoluteS });
}

/** AuditStream is the SIEM webhook every audit event is delivered to. */
export interface AuditStream {
  url: string;
  enabled: boolean;
  secret_set: boolean;
  delivered_id: number;
  pending: number;
  last_error: string;
  last_attempt?: string | null;
}

/** auditStream reads the audit stream's settings and progress (admin). */
export function auditStream(): Promise<AuditStream> {
  return request<AuditStream>('GET', '/audit/stream');
}

/** setAuditStream configures the audit stream; an empty secret keeps the one set (admin). */
export function setAuditStream(url: string, secret: string, enabled: boolean): Promise<AuditStream> {
  const body: Record<string, unknown> = { url, enabled };
  if (secret !== '') body.secret = secret;
  return request<AuditStream>('PUT', '/audit/stream', body);
}

/** settings reads the console-wide options. */
export function settings(): Promise<Settings> {
  return request<Settings>('GET', '/settings');
}

/** ChangeRequest is a publish waiting for a second person (four-eyes). */
export interface ChangeRequest {
  id: number;
  created_at?: string;
  author?: string;
  kind?: string;
  domain?: string;
  yaml?: string;
  deleted?: boolean;
  base_version?: number;
  rollback_of?: number | null;
  message?: string;
  status?: string;
  reviewer?: string;
  reviewed_at?: string | null;
  review_message?: string;
  version?: number | null;
  /** edits are the domains a change of kind "ruleset" (sluice ctl rules apply) sets or removes. */
  edits?: { domain: string; yaml?: string; deleted?: boolean }[];
}

/** changes lists change requests with the given status. */
export async function changes(status = 'pending'): Promise<ChangeRequest[]> {
  const out = await request<{ changes?: ChangeRequest[]; change_requests?: ChangeRequest[] }>('GET', `/changes${query({ status })}`);
  return out.changes ?? out.change_requests ?? [];
}

/** approve publishes a pending change request. */
export async function approve(id: number, message: string): Promise<PublishResult> {
  return publishResult(await send('POST', `/changes/${seg(id)}/approve`, { message }));
}

/** reject closes a pending change request without publishing it. */
export async function reject(id: number, message: string): Promise<void> {
  await request('POST', `/changes/${seg(id)}/reject`, { message });
}

// --- audit ---------------------------------------------------------------------

/** AuditEvent is one entry of the audit trail. */
export interface AuditEvent {
  id: number;
  at: string;
  actor: string;
  action: string;
  target: string;
  before: unknown;
  after: unknown;
  message: string;
  ip: string;
  user_agent: string;
  request_id: string;
  prev_hash?: string;
  hash?: string;
}

/** AuditFilter narrows the audit log; times are RFC 3339. */
export interface AuditFilter {
  actor?: string;
  action?: string;
  target?: string;
  since?: string;
  until?: string;
}

function auditQuery(f: AuditFilter): Record<string, string | undefined> {
  return { actor: f.actor, action: f.action, target: f.target, since: f.since, until: f.until };
}

/** audit lists audit events, newest first. */
export async function audit(f: AuditFilter, limit: number, after?: PageCursor | null): Promise<Page<AuditEvent>> {
  const out = await request<{ events: AuditEvent[]; next_cursor?: string | null }>(
    'GET',
    `/audit${query({ ...auditQuery(f), limit, ...(after ?? {}) })}`,
  );
  return pageOf(out.events ?? [], out.next_cursor, limit, (e) => e.id);
}

/** auditCSVURL is the link that downloads the filtered audit log as CSV. */
export function auditCSVURL(f: AuditFilter): string {
  return `${base}/audit${query({ ...auditQuery(f), format: 'csv' })}`;
}

/** Verification is the audit chain's state. */
export interface Verification {
  ok: boolean;
  events: number;
  broken_id?: number;
  reason?: string;
}

/** verifyAudit checks the audit hash chain. */
export function verifyAudit(): Promise<Verification> {
  return request<Verification>('GET', '/audit/verify');
}

// --- nodes ---------------------------------------------------------------------

/** NodeInfo is an enforcer as the console last saw it. */
export interface NodeInfo {
  id: string;
  applied_version: number;
  status: string;
  last_seen: string;
  labels?: Record<string, string> | null;
  build?: string;
  address?: string;
  connected_since?: string | null;
  nack_version?: number | null;
  nack_error?: string;
  nacked_at?: string | null;
  /** The console replica holding the connection (issue 6). */
  console?: string;
  /** Live decision rates (issue 6); see decisionsPerSecond. */
  rates?: Record<string, unknown> | null;
}

/** NodeList is GET /nodes: the nodes and (issue 6) the current version. */
export interface NodeList {
  nodes: NodeInfo[];
  current_version?: number;
}

/** nodes lists every known enforcer. */
export async function nodes(): Promise<NodeList> {
  const out = await request<NodeList>('GET', '/nodes');
  return { nodes: out.nodes ?? [], current_version: out.current_version };
}

// --- users and tokens ------------------------------------------------------------

/** User is a console account. */
export interface User {
  id: number;
  username: string;
  role: string;
  disabled: boolean;
  created_at: string;
  /** The domains the role holds for; [] means every domain. */
  domains?: string[];
}

/** Session is a live sign-in of a user. */
export interface Session {
  id: number;
  created_at: string;
  last_seen: string;
  expires_at: string;
  ip: string;
  user_agent: string;
  current?: boolean;
}

/** setUserDomains changes the domains a user's role holds for; [] means every domain (admin). */
export function setUserDomains(id: number, domains: string[]): Promise<User> {
  return request<User>('PUT', `/users/${seg(id)}/domains`, { domains });
}

/** userSessions lists a user's live sessions (admin). */
export async function userSessions(id: number): Promise<Session[]> {
  return (await request<{ sessions: Session[] }>('GET', `/users/${seg(id)}/sessions`)).sessions;
}

/** endSessions ends one session of a user, or all of them when sid is omitted (admin). */
export async function endSessions(id: number, sid?: number): Promise<number> {
  const path = sid === undefined ? `/users/${seg(id)}/sessions` : `/users/${seg(id)}/sessions/${seg(sid)}`;
  return (await request<{ ended: number }>('DELETE', path)).ended;
}

/** signOutEverywhere ends every session of the signed-in user, this one included. */
export async function signOutEverywhere(): Promise<void> {
  await request('DELETE', '/me/sessions');
}

/** users lists console accounts (admin). */
export async function users(): Promise<User[]> {
  const out = await request<{ users: User[] }>('GET', '/users');
  return out.users ?? [];
}

/** createUser adds an account (admin). */
export function createUser(username: string, password: string, role: string, domains: string[] = []): Promise<User> {
  return request<User>('POST', '/users', domains.length ? { username, password, role, domains } : { username, password, role });
}

/** setUserDisabled disables or re-enables an account (admin). */
export async function setUserDisabled(id: number, disabled: boolean): Promise<void> {
  await request('POST', `/users/${seg(id)}/${disabled ? 'disable' : 'enable'}`, {});
}

/** setUserRole changes an account's role (admin); 409 for the last enabled admin. */
export function setUserRole(id: number, role: string): Promise<User> {
  return request<User>('PUT', `/users/${seg(id)}/role`, { role });
}

/** resetPassword sets an account's password (admin); the user's sessions end. */
export function resetPassword(id: number, password: string): Promise<User> {
  return request<User>('PUT', `/users/${seg(id)}/password`, { password });
}

/** Token is an API token without its secret. */
export interface Token {
  id: number;
  name: string;
  role: string;
  last4: string;
  created_by?: string;
  created_at?: string;
  expires_at?: string | null;
  disabled?: boolean;
  rotated_at?: string | null;
  /** The token's own domain grants; [] means every domain. */
  domains?: string[];
  node_id?: string | null;
  read_only?: boolean;
  fleet?: boolean;
  /** The user it acts for; null for a token the console made. */
  owner?: string | null;
  owner_disabled?: boolean;
  /** What it may do now: the lower of its role and its owner's. */
  effective_role?: string;
}

/** TokenOptions are a new token's scope: its domains, read-only flag, and (node tokens) fleet flag. */
export interface TokenOptions {
  domains?: string[];
  read_only?: boolean;
  fleet?: boolean;
}

/** parseDomains reads a comma- or space-separated domain list; empty means every domain. */
export function parseDomains(text: string): string[] {
  return [...new Set(text.split(/[\s,]+/).map((d) => d.trim()).filter((d) => d !== ''))];
}

/** NewToken is a token with its secret, shown once. */
export interface NewToken {
  id: number;
  token: string;
  name?: string;
  role?: string;
  last4?: string;
  expires_at?: string | null;
}

/** tokens lists API tokens (admin). */
export async function tokens(): Promise<Token[]> {
  const out = await request<{ tokens: Token[] }>('GET', '/tokens');
  return out.tokens ?? [];
}

/** createToken makes a token; expiresIn is a Go duration ("720h") or "" for never. */
export function createToken(name: string, role: string, expiresIn: string, opts: TokenOptions = {}): Promise<NewToken> {
  const body: Record<string, unknown> = { name, role };
  if (expiresIn !== '') body.expires_in = expiresIn;
  if (opts.domains?.length) body.domains = opts.domains;
  if (opts.read_only) body.read_only = true;
  if (opts.fleet) body.fleet = true;
  return request<NewToken>('POST', '/tokens', body);
}

/** disableToken stops a token from working, at once. */
export async function disableToken(id: number): Promise<void> {
  await request('POST', `/tokens/${seg(id)}/disable`, {});
}

/** rotateToken replaces a token's secret; the new one is shown once. */
export function rotateToken(id: number): Promise<NewToken> {
  return request<NewToken>('POST', `/tokens/${seg(id)}/rotate`, {});
}

// --- live traffic (issue 14) -------------------------------------------------------

/** Counts are one rule's decisions in one second or one step bucket. */
export interface Counts {
  allowed: number;
  limited: number;
  shadow_limited: number;
  store_errors: number;
}

/** StatsPoint is one rule's counts at t (Unix seconds; the start of the bucket). */
export interface StatsPoint extends Counts {
  t: number;
}

/** TopValue is a descriptor value and how often it was limited. */
export interface TopValue {
  value: string;
  count: number;
}

/** RuleStats is one rule's points: SPARSE, a missing t means all zeros. */
export interface RuleStats {
  domain: string;
  rule: string;
  points: StatsPoint[];
  /** Most limited values over the window, most first (live only). */
  top_limited?: TopValue[];
  /** Set when the values are shown to this viewer in masked form. */
  masked?: boolean;
}

/** Marker is a version event on the time axis. */
export interface Marker {
  t: number;
  version: number;
  kind: 'publish' | 'rollback' | 'promote' | string;
  author: string;
  message: string;
}

/** Spike is a stretch of unusual 429s of one rule; end is null while it lasts. */
export interface Spike {
  id: number;
  domain: string;
  rule: string;
  start: number;
  end: number | null;
  peak_limited_per_s: number;
  baseline_per_s: number;
}

/** StatsWindow is GET /stats/live or /stats/history. */
export interface StatsWindow {
  step_s: number;
  from: number;
  to: number;
  rules: RuleStats[];
  markers: Marker[];
  spikes: Spike[];
}

function statsWindow(w: Partial<StatsWindow>): StatsWindow {
  return {
    step_s: w.step_s ?? 1,
    from: w.from ?? 0,
    to: w.to ?? 0,
    rules: (w.rules ?? []).map((r) => ({ ...r, points: r.points ?? [] })),
    markers: w.markers ?? [],
    spikes: w.spikes ?? [],
  };
}

/** statsLive returns the last 15 minutes at 1 s, of one domain or of all. */
export async function statsLive(domain?: string): Promise<StatsWindow> {
  return statsWindow(await request<Partial<StatsWindow>>('GET', `/stats/live${query({ domain })}`));
}

/** HistoryQuery picks a stretch of the per-minute rollups; from/to are Unix seconds. */
export interface HistoryQuery {
  domain?: string;
  rule?: string;
  from: number;
  to: number;
  step: number;
}

/** statsHistory returns the rollups in [from, to) in buckets of step seconds. */
export async function statsHistory(q: HistoryQuery): Promise<StatsWindow> {
  const iso = (s: number) => new Date(s * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  const path = `/stats/history${query({ domain: q.domain, rule: q.domain ? q.rule : undefined, from: iso(q.from), to: iso(q.to), step: q.step })}`;
  return statsWindow(await request<Partial<StatsWindow>>('GET', path));
}

/** DomainSparkline is one domain's last 15 minutes, dense, one count per step bucket. */
export interface DomainSparkline {
  domain: string;
  limited: number[];
  allowed: number[];
}

/** DomainStats is GET /stats/domains. */
export interface DomainStats {
  step_s: number;
  from: number;
  domains: DomainSparkline[];
}

/** statsDomains returns every domain's 429s of the last 15 minutes (the Domains page's sparklines). */
export async function statsDomains(): Promise<DomainStats> {
  const out = await request<Partial<DomainStats>>('GET', '/stats/domains');
  return { step_s: out.step_s ?? 10, from: out.from ?? 0, domains: out.domains ?? [] };
}

/** TickRule is one rule's counts in a tick (rules with all-zero counts are left out). */
export interface TickRule extends Counts {
  domain: string;
  rule: string;
  /** This second's most limited values. */
  top_limited?: TopValue[];
}

/** StreamMessage is what the stats websocket sends. */
export type StreamMessage =
  | { type: 'tick'; t: number; rules: TickRule[] }
  | ({ type: 'marker' } & Marker)
  | ({ type: 'spike'; state: 'start' | 'end' } & Spike);

/** statsStreamURL is the websocket of the per-second ticks (the session cookie authenticates it). */
export function statsStreamURL(domain?: string): string {
  const proto = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${proto}//${window.location.host}${base}/stats/stream${query({ domain })}`;
}

// --- alerts (admin, issue 14) --------------------------------------------------------

/** SpikeEvent is what a webhook can be sent. */
export type SpikeEvent = 'spike.start' | 'spike.end';

/** Webhook is an alert target. */
export interface Webhook {
  url: string;
  events: SpikeEvent[];
}

/** SpikeSettings are when a spike starts: 429/s over floor_per_s and factor × baseline for for_s seconds. */
export interface SpikeSettings {
  floor_per_s: number;
  factor: number;
  for_s: number;
}

/** DomainAlertSettings override the spike defaults for one domain; mask_values hides values from viewers. */
export interface DomainAlertSettings extends Partial<SpikeSettings> {
  mask_values?: boolean;
}

/** Delivery is one webhook POST and its state. */
export interface Delivery {
  id: number;
  event: string;
  url: string;
  domain?: string;
  rule?: string;
  status: 'pending' | 'delivered' | 'failed' | string;
  attempts: number;
  last_error?: string;
  created_at: string;
  delivered_at?: string | null;
}

/** AlertSettings is what PUT /alerts takes. */
export interface AlertSettings {
  webhooks: Webhook[];
  spike_defaults: SpikeSettings;
  domains: Record<string, DomainAlertSettings>;
}

/** Alerts is GET /alerts: the settings and the recent deliveries. */
export interface Alerts extends AlertSettings {
  deliveries: Delivery[];
}

function alertsOf(a: Partial<Alerts>): Alerts {
  return {
    webhooks: a.webhooks ?? [],
    spike_defaults: a.spike_defaults ?? { floor_per_s: 5, factor: 5, for_s: 3 },
    domains: a.domains ?? {},
    deliveries: a.deliveries ?? [],
  };
}

/** alerts reads the alert settings and recent deliveries (admin). */
export async function alerts(): Promise<Alerts> {
  return alertsOf(await request<Partial<Alerts>>('GET', '/alerts'));
}

/** saveAlerts replaces the alert settings (admin); the answer is the new state. */
export async function saveAlerts(s: AlertSettings): Promise<Alerts> {
  return alertsOf(await request<Partial<Alerts>>('PUT', '/alerts', s));
}

/** testAlert queues an alert.test delivery to every webhook; returns how many. */
export async function testAlert(): Promise<number> {
  const out = await request<{ queued?: number }>('POST', '/alerts/test', {});
  return out.queued ?? 0;
}

// --- quotas ------------------------------------------------------------------

/** QuotaUsage is one value's usage of one quota in one period (GET /quotas). */
export interface QuotaUsage {
  domain: string;
  rule: string;
  unit: 'day' | 'week' | 'month' | 'year';
  value: string;
  masked?: boolean;
  period_start: string;
  period_end: string;
  used: number;
  limit: number;
}

/** quotas lists quota usage, most used first, limit rows from offset on. */
export async function quotas(q: QuotaQuery, limit: number, offset = 0): Promise<{ usage: QuotaUsage[]; next: number | null }> {
  const out = await request<{ usage?: QuotaUsage[]; next_offset?: number | null }>('GET', `/quotas${quotaParams(q, { limit, offset })}`);
  return { usage: out.usage ?? [], next: out.next_offset ?? null };
}

/** quotasCSVURL is the link that downloads the selected usage as CSV. */
export function quotasCSVURL(q: QuotaQuery): string {
  return `${base}/quotas${quotaParams({ ...q, value: undefined }, { format: 'csv' })}`;
}

// --- staged rollout (issue 19) ---------------------------------------------------

/** AutoHalt rolls a staged version back by itself when its canary limits far more than the rest. */
export interface AutoHalt {
  factor: number;
  min_limited_per_s: number;
  for_s?: number;
}

/** RolloutSpec stages a publish to the nodes whose labels include all of labels. */
export interface RolloutSpec {
  labels: Record<string, string>;
  auto_halt?: AutoHalt;
}

/** Rollout is a staged version's rollout and how it ended. */
export interface Rollout {
  version: number;
  base_version: number;
  labels: Record<string, string>;
  auto_halt: AutoHalt | null;
  state: 'staged' | 'promoted' | 'rolled_back' | 'halted';
  created_at: string;
  created_by: string;
  ended_at: string | null;
  ended_by?: string;
  ended_in: number | null;
  reason?: string;
}

/** promote sends staged version n to every node. */
export async function promote(n: number, message: string): Promise<number> {
  const out = await request<{ version: number }>('POST', `/versions/${seg(n)}/promote`, { message });
  return out.version;
}

/** CohortPoint is one second of a staged version's canary and the other nodes. */
export interface CohortPoint {
  t: number;
  canary_allowed: number;
  canary_limited: number;
  rest_allowed: number;
  rest_limited: number;
}

/** Cohorts is GET /versions/{n}/cohorts. */
export interface Cohorts {
  rollout: Rollout;
  domains: string[];
  from: number;
  to: number;
  points: CohortPoint[];
}

/** cohorts returns a staged version's canary against the others, per second. */
export function cohorts(n: number): Promise<Cohorts> {
  return request<Cohorts>('GET', `/versions/${seg(n)}/cohorts`);
}

// --- impact preview (issue 19) -------------------------------------------------

/** PreviewPoint is one span (a minute) of a previewed limit. */
export interface PreviewPoint {
  t: number;
  span_s: number;
  requests: number;
  /** What the rule actually limited then (shadow-limited included). */
  limited: number;
  would_limit: number;
  would_limit_low: number;
  would_limit_high: number;
  /** Distinct values the draft limit would have limited. */
  values: number;
  values_low: number;
  values_high: number;
}

/** PreviewLimit is what one changed or new limit would have done to the last hour. */
export interface PreviewLimit {
  name: string;
  change: 'limit_added' | 'limit_changed';
  before: LimitInfo | null;
  after: LimitInfo;
  rule?: string;
  previewable: boolean;
  reason?: string;
  estimate: boolean;
  estimate_reason?: string;
  error?: string;
  points: PreviewPoint[];
  totals: {
    requests: number;
    limited: number;
    would_limit: number;
    would_limit_low: number;
    would_limit_high: number;
    values_max: number;
  };
}

/** LimitInfo is the part of an effective limit the preview shows. */
export interface LimitInfo {
  name: string;
  unit?: string;
  requests_per_unit: number;
  algorithm: string;
  unlimited: boolean;
  shadow_mode: boolean;
}

/** Preview is the answer of POST /preview. */
export interface Preview {
  domain: string;
  window_s: number;
  limits: PreviewLimit[];
}

/** previewDraft replays the last hour of traffic against a draft (editor+); invalid YAML gets the publish's 422. */
export function previewDraft(domain: string, yaml: string): Promise<Preview> {
  return request<Preview>('POST', '/preview', { domain, yaml });
}
