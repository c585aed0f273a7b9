// The console's REST API, as the UI uses it. Sessions are cookies set by the
// console; writes also carry the CSRF token that the login answer returns.
//
// Every type of what goes over the wire comes from api.gen.ts, which
// `make generate` makes from backend/api/openapi.yaml; the API tests
// check every answer of the console against that document, so these types
// are what the server sends. The UI is embedded in the console it talks to:
// there is no older console to fall back for.
//
// A 401 on any call but login means the session ended: the handler set with
// onSessionEnded sends the user back to the sign-in page (drafts are kept in
// sessionStorage by the editor).
import type { components, paths } from './api.gen';
import { errorMessage } from './format';
import { quotaParams, type QuotaQuery } from './quotas';

type Schemas = components['schemas'];
type Method = 'get' | 'put' | 'post' | 'delete';
type Operation<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;
type JSONOf<R> = R extends { content: { 'application/json': infer B } } ? B : never;

/** Reply is the JSON that operation M of path P answers with status S. */
export type Reply<P extends keyof paths, M extends Method, S extends number = 200> =
  Operation<P, M> extends { responses: infer Rs } ? (S extends keyof Rs ? JSONOf<Rs[S]> : never) : never;

/** RequestBody is the JSON body operation M of path P takes. */
export type RequestBody<P extends keyof paths, M extends Method> = JSONOf<NonNullable<Operation<P, M>['requestBody']>>;

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
export type Me = Schemas['Me'];

/** login starts a session; the console sets the cookie and returns the CSRF token. */
export async function login(username: string, password: string): Promise<void> {
  const body: Schemas['LoginRequest'] = { username, password };
  const out = await request<Schemas['LoginResponse']>('POST', '/auth/login', body, { quiet401: true });
  rememberCSRF(out.csrf_token);
}

/** AuthMethods is how people sign in to this console (GET /api/v1/auth/methods). */
export type AuthMethods = Schemas['AuthMethods'];

/** authMethods asks the console which ways of signing in it offers. */
export function authMethods(): Promise<AuthMethods> {
  return request<AuthMethods>('GET', '/auth/methods', undefined, { quiet401: true });
}

/**
 * ssoLoginURL is where the browser goes to sign in with SSO: the console
 * redirects it to the identity provider and, once signed in, back to returnTo.
 */
export function ssoLoginURL(returnTo: string): string {
  return `${base}/auth/oidc/login${query({ return_to: returnTo })}`;
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

/** canSupport reports whether a role may reset counters and grant overrides (support, editor, admin). */
export function canSupport(role: string | undefined): boolean {
  return role === 'support' || canEdit(role);
}

/**
 * canEditDomain reports whether me may publish to domain: an editor or
 * admin whose role holds for that domain (every domain, or it is listed).
 * The console checks again; this only hides what would be refused.
 */
export function canEditDomain(me: Partial<Pick<Me, 'role' | 'domains' | 'all_domains' | 'read_only'>> | null | undefined, domain: string): boolean {
  if (!me || me.read_only || !canEdit(me.role)) return false;
  return me.all_domains !== false || (me.domains ?? []).includes(domain);
}

/** Session is a live sign-in of a user. */
export type Session = Schemas['Session'];

/** SessionsEnded is how many sessions a sign-out or revoke ended. */
type SessionsEnded = JSONOf<components['responses']['SessionsEnded']>;

/** signOutEverywhere ends every session of the signed-in user, this one included. */
export async function signOutEverywhere(): Promise<void> {
  try {
    await request<SessionsEnded>('DELETE', '/me/sessions', undefined, { quiet401: true });
  } finally {
    sessionStorage.removeItem(csrfKey);
  }
}

// --- rules -------------------------------------------------------------------

/** DomainRevision is a domain's YAML and the version that last changed it. */
export type DomainRevision = Schemas['DomainRevision'];

/** Ruleset is every domain at one version. */
export type Ruleset = Schemas['Snapshot'];

/** DomainDetail is GET /domains/{d}: the domain and the ruleset's current version. */
export type DomainDetail = Schemas['DomainDetail'];

/** ruleset returns the current version and every domain. */
export function ruleset(): Promise<Ruleset> {
  return request<Ruleset>('GET', '/ruleset');
}

/** domain returns one domain as of the latest version. */
export function domain(name: string): Promise<DomainDetail> {
  return request<DomainDetail>('GET', `/domains/${seg(name)}`);
}

type Published = JSONOf<components['responses']['Published']>;
type Proposed = JSONOf<components['responses']['Proposed']>;

/**
 * PublishResult is a publish's answer: a new version (200), or (four-eyes
 * on) the change request waiting for approval (202).
 */
export type PublishResult = Partial<Published> & Partial<Proposed>;

function publishResult(a: Answer<Published | Proposed>): PublishResult {
  if (a.status === 202) return { change: (a.body as Proposed).change };
  return a.body as Published;
}

/** RolloutSpec stages a publish to the nodes whose labels include all of labels. */
export type RolloutSpec = Schemas['RolloutSpec'];

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
  const body: Schemas['PublishRequest'] = { yaml, message, base_version: baseVersion };
  if (breakGlass !== '') body.break_glass_reason = breakGlass;
  if (rollout) body.rollout = rollout;
  return publishResult(await send('PUT', `/domains/${seg(name)}`, body));
}

/** deleteDomain publishes a version without the domain. */
export async function deleteDomain(name: string, message: string, baseVersion: number): Promise<PublishResult> {
  const body: Schemas['DeleteRequest'] = { message, base_version: baseVersion };
  return publishResult(await send('DELETE', `/domains/${seg(name)}`, body));
}

/** Version is one published version, as GET /versions lists it. */
export type Version = Schemas['Version'];

/** Page is one page of a list; next asks for the following page, null on the last. */
export interface Page<T> {
  items: T[];
  next: PageCursor | null;
}

/** PageCursor asks for the page after another one (the console's next_cursor). */
export type PageCursor = { cursor: string };

function pageOf<T>(items: T[], nextCursor: string | null): Page<T> {
  return { items, next: nextCursor ? { cursor: nextCursor } : null };
}

/** versions lists versions, newest first. */
export async function versions(opts: { limit: number; after?: PageCursor | null }): Promise<Page<Version>> {
  const out = await request<Reply<'/api/v1/versions', 'get'>>('GET', `/versions${query({ limit: opts.limit, ...(opts.after ?? {}) })}`);
  return pageOf(out.versions, out.next_cursor);
}

/** VersionSnapshot is GET /versions/{n}: its metadata and every domain at it. */
export type VersionSnapshot = Reply<'/api/v1/versions/{n}', 'get'>;

/** version returns one version with its domains. */
export function version(n: number): Promise<VersionSnapshot> {
  return request<VersionSnapshot>('GET', `/versions/${seg(n)}`);
}

/**
 * ServerDiff is GET /versions/{a}/diff/{b}: the domains that differ, each
 * with its unified diff and structured changes (rules.DiffRulesets; the
 * one ruleset diff, which `sluice rules diff -json` prints too).
 */
export type ServerDiff = Schemas['Diff'];

/** DomainDiff is one domain's part of a ServerDiff. */
export type DomainDiff = Schemas['DomainDiff'];

/** StructuredChange is one limit (or domain) added, removed or changed. */
export type StructuredChange = Schemas['Change'];

/** versionDiff asks the console for its diff of a → b (0 is the empty ruleset). */
export function versionDiff(a: number, b: number): Promise<ServerDiff> {
  return request<ServerDiff>('GET', `/versions/${seg(a)}/diff/${seg(b)}`);
}

/**
 * rollback publishes a new version whose content is version n's. With
 * baseVersion, the console refuses (409) if the ruleset changed after the
 * version the user previewed.
 */
export async function rollback(n: number, message: string, baseVersion?: number): Promise<PublishResult> {
  const body: Schemas['RollbackRequest'] = { message };
  if (baseVersion !== undefined) body.base_version = baseVersion;
  return publishResult(await send('POST', `/versions/${seg(n)}/rollback`, body));
}

/** domainSchema fetches the JSON Schema of a domain file (GET /schema). */
export async function domainSchema(): Promise<Record<string, unknown>> {
  return request<Record<string, unknown>>('GET', '/schema');
}

// --- four-eyes -----------------------------------------------------------------

/** Settings are the console-wide options. */
export type Settings = Schemas['Settings'];

/** settings reads the console-wide options. */
export function settings(): Promise<Settings> {
  return request<Settings>('GET', '/settings');
}

/** setSessionLifetimes changes the session timeouts, in seconds (admin). */
export function setSessionLifetimes(idleS: number, absoluteS: number): Promise<Settings> {
  const body: Partial<Schemas['SettingsRequest']> = { session_idle_s: idleS, session_absolute_s: absoluteS };
  return request<Settings>('PUT', '/settings', body);
}

/** ChangeRequest is a publish waiting for a second person (four-eyes). */
export type ChangeRequest = Schemas['ChangeRequest'];

/** ChangeView is GET /changes/{id}: the change and, while pending, the console's diff of it. */
export type ChangeView = Schemas['ChangeView'];

/** changes lists change requests with the given status. */
export async function changes(status = 'pending'): Promise<ChangeRequest[]> {
  const out = await request<Reply<'/api/v1/changes', 'get'>>('GET', `/changes${query({ status })}`);
  return out.changes;
}

/** change returns one change request with the difference it would make. */
export function change(id: number): Promise<ChangeView> {
  return request<ChangeView>('GET', `/changes/${seg(id)}`);
}

/** approve publishes a pending change request. */
export async function approve(id: number, message: string): Promise<PublishResult> {
  const body: Schemas['ReviewRequest'] = { message };
  return publishResult(await send('POST', `/changes/${seg(id)}/approve`, body));
}

/** reject closes a pending change request without publishing it. */
export async function reject(id: number, message: string): Promise<void> {
  const body: Schemas['ReviewRequest'] = { message };
  await request('POST', `/changes/${seg(id)}/reject`, body);
}

// --- audit ---------------------------------------------------------------------

/** AuditEvent is one entry of the audit trail. */
export type AuditEvent = Schemas['AuditEvent'];

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
  const out = await request<Reply<'/api/v1/audit', 'get'>>('GET', `/audit${query({ ...auditQuery(f), limit, ...(after ?? {}) })}`);
  return pageOf(out.events, out.next_cursor);
}

/** auditCSVURL is the link that downloads the filtered audit log as CSV. */
export function auditCSVURL(f: AuditFilter): string {
  return `${base}/audit${query({ ...auditQuery(f), format: 'csv' })}`;
}

/** Verification is the audit chain's state. */
export type Verification = Schemas['AuditVerification'];

/** verifyAudit checks the audit hash chain. */
export function verifyAudit(): Promise<Verification> {
  return request<Verification>('GET', '/audit/verify');
}

/** AuditStream is the SIEM webhook every audit event is delivered to, and its progress. */
export type AuditStream = Schemas['AuditStream'];

/** auditStream reads the audit stream's settings and progress (admin). */
export function auditStream(): Promise<AuditStream> {
  return request<AuditStream>('GET', '/audit/stream');
}

/** setAuditStream configures the audit stream; an empty secret keeps the one set (admin). */
export function setAuditStream(url: string, secret: string, enabled: boolean): Promise<AuditStream> {
  const body: Partial<Schemas['AuditStreamRequest']> = { url, enabled };
  if (secret !== '') body.secret = secret;
  return request<AuditStream>('PUT', '/audit/stream', body);
}

// --- nodes ---------------------------------------------------------------------

/** NodeInfo is an enforcer as the console last saw it. */
export type NodeInfo = Schemas['Node'];

/** NodeList is GET /nodes: the nodes, the current version and any staged rollout. */
export type NodeList = Reply<'/api/v1/nodes', 'get'>;

/** nodes lists every known enforcer. */
export function nodes(): Promise<NodeList> {
  return request<NodeList>('GET', '/nodes');
}

// --- users and tokens ------------------------------------------------------------

/** User is a console account. */
export type User = Schemas['User'];

/** users lists console accounts (admin). */
export async function users(): Promise<User[]> {
  const out = await request<Reply<'/api/v1/users', 'get'>>('GET', '/users');
  return out.users;
}

/** Role is what a console account may do. */
export type Role = User['role'];

/** parseDomains reads a comma- or space-separated domain list; empty means every domain. */
export function parseDomains(text: string): string[] {
  return [...new Set(text.split(/[\s,]+/).filter((d) => d !== ''))];
}

/** createUser adds an account (admin); domains [] means every domain. */
export function createUser(username: string, password: string, role: Role, domains: string[] = []): Promise<User> {
  const body: Schemas['UserCreateRequest'] = { username, password, role };
  if (domains.length) body.domains = domains;
  return request<User>('POST', '/users', body);
}

/** setUserDomains changes the domains a user's role holds for; [] means every domain (admin). */
export function setUserDomains(id: number, domains: string[]): Promise<User> {
  const body: Schemas['DomainsRequest'] = { domains };
  return request<User>('PUT', `/users/${seg(id)}/domains`, body);
}

/** userSessions lists a user's live sessions (admin). */
export async function userSessions(id: number): Promise<Session[]> {
  const out = await request<Reply<'/api/v1/users/{id}/sessions', 'get'>>('GET', `/users/${seg(id)}/sessions`);
  return out.sessions;
}

/** endSessions ends one session of a user, or all of them when sid is omitted (admin); returns how many ended. */
export async function endSessions(id: number, sid?: number): Promise<number> {
  const path = sid === undefined ? `/users/${seg(id)}/sessions` : `/users/${seg(id)}/sessions/${seg(sid)}`;
  return (await request<SessionsEnded>('DELETE', path)).ended;
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
  const body: Schemas['PasswordResetRequest'] = { password };
  return request<User>('PUT', `/users/${seg(id)}/password`, body);
}

/** Token is an API token without its secret. */
export type Token = Schemas['Token'];

/** NewToken is a token with its secret, shown once. */
export type NewToken = Schemas['TokenSecret'];

/** tokens lists API tokens (admin). */
export async function tokens(): Promise<Token[]> {
  const out = await request<Reply<'/api/v1/tokens', 'get'>>('GET', '/tokens');
  return out.tokens;
}

/** TokenOptions are a new token's scope: its domains and read-only flag, or (node tokens) its fleet flag. */
export type TokenOptions = Pick<Schemas['TokenCreateRequest'], 'domains' | 'read_only' | 'fleet'>;

/** createToken makes a token; expiresIn is a Go duration ("720h") or "" for never. */
export function createToken(name: string, role: Token['role'], expiresIn: string, opts: TokenOptions = {}): Promise<NewToken> {
  const body: Schemas['TokenCreateRequest'] = { name, role };
  if (expiresIn !== '') body.expires_in = expiresIn;
  if (opts.domains?.length) body.domains = opts.domains;
  if (opts.read_only) body.read_only = true;
  if (opts.fleet) body.fleet = true;
  return request<NewToken>('POST', '/tokens', body);
}

/** setTokenOwner hands a token to another enabled user, whom it then acts for (admin). */
export function setTokenOwner(id: number, owner: string): Promise<Token> {
  const body: Schemas['TokenOwnerRequest'] = { owner };
  return request<Token>('PUT', `/tokens/${seg(id)}/owner`, body);
}

/** disableToken stops a token from working, at once. */
export async function disableToken(id: number): Promise<void> {
  await request('POST', `/tokens/${seg(id)}/disable`, {});
}

/** rotateToken replaces a token's secret; the new one is shown once. */
export function rotateToken(id: number): Promise<NewToken> {
  return request<NewToken>('POST', `/tokens/${seg(id)}/rotate`, {});
}

// --- live traffic ------------------------------------------------------------------

/** Counts are one rule's decisions in one second or one step bucket. */
export type Counts = Pick<Schemas['RuleCounts'], 'allowed' | 'limited' | 'shadow_limited' | 'store_errors'>;

/** StatsPoint is one rule's counts at t (Unix seconds; the start of the bucket). */
export type StatsPoint = Schemas['StatsPoint'];

/** StatsWindow is GET /stats/live or /stats/history. */
export type StatsWindow = Schemas['StatsView'];

/** RuleStats is one rule's points: SPARSE, a missing t means all zeros. */
export type RuleStats = StatsWindow['rules'][number];

/** TopValue is a descriptor value and how often it was limited. */
export type TopValue = NonNullable<RuleStats['top_limited']>[number];

/** Marker is a version event on the time axis. */
export type Marker = StatsWindow['markers'][number];

/** Spike is a stretch of unusual 429s of one rule; end is null while it lasts. */
export type Spike = Schemas['Spike'];

/** statsLive returns the last 15 minutes at 1 s, of one domain or of all. */
export function statsLive(domain?: string): Promise<StatsWindow> {
  return request<StatsWindow>('GET', `/stats/live${query({ domain })}`);
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
export function statsHistory(q: HistoryQuery): Promise<StatsWindow> {
  const iso = (s: number) => new Date(s * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  const path = `/stats/history${query({ domain: q.domain, rule: q.domain ? q.rule : undefined, from: iso(q.from), to: iso(q.to), step: q.step })}`;
  return request<StatsWindow>('GET', path);
}

/** DomainStats is GET /stats/domains. */
export type DomainStats = Reply<'/api/v1/stats/domains', 'get'>;

/** DomainSparkline is one domain's last 15 minutes, dense, one count per step bucket. */
export type DomainSparkline = DomainStats['domains'][number];

/** statsDomains returns every domain's 429s of the last 15 minutes (the Domains page's sparklines). */
export function statsDomains(): Promise<DomainStats> {
  return request<DomainStats>('GET', '/stats/domains');
}

/**
 * TickRule is one rule's counts in a tick (rules with all-zero counts are
 * left out). The websocket's messages are described in the OpenAPI
 * document's text (GET /stats/stream), so these are built from its parts.
 */
export type TickRule = Pick<Schemas['RuleCounts'], 'domain' | 'rule'> &
  Counts & {
    /** This second's most limited values. */
    top_limited?: TopValue[];
  };

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

// --- alerts (admin) ------------------------------------------------------------------

/** Webhook is an alert target. */
export type Webhook = Schemas['Webhook'];

/** SpikeEvent is what a webhook can be sent. */
export type SpikeEvent = Webhook['events'][number];

/** SpikeSettings are when a spike starts: 429/s over floor_per_s and factor × baseline for for_s seconds. */
export type SpikeSettings = Schemas['SpikeSettings'];

/** DomainAlertSettings override the spike defaults for one domain; mask_values hides values from viewers. */
export type DomainAlertSettings = Schemas['DomainStatsSettings'];

/** Alerts is GET /alerts: the settings and the recent deliveries. */
export type Alerts = Schemas['Alerts'];

/** Delivery is one webhook POST and its state. */
export type Delivery = Alerts['deliveries'][number];

/** AlertSettings is what PUT /alerts takes. */
export type AlertSettings = RequestBody<'/api/v1/alerts', 'put'>;

/** alerts reads the alert settings and recent deliveries (admin). */
export function alerts(): Promise<Alerts> {
  return request<Alerts>('GET', '/alerts');
}

/** saveAlerts replaces the alert settings (admin); the answer is the new state. */
export function saveAlerts(s: AlertSettings): Promise<Alerts> {
  return request<Alerts>('PUT', '/alerts', s);
}

/** testAlert queues an alert.test delivery to every webhook; returns how many. */
export async function testAlert(): Promise<number> {
  const out = await request<Reply<'/api/v1/alerts/test', 'post', 202>>('POST', '/alerts/test', {});
  return out.queued;
}

// --- quotas ------------------------------------------------------------------

type QuotaPage = Reply<'/api/v1/quotas', 'get'>;

/** QuotaUsage is one value's usage of one quota in one period (GET /quotas). */
export type QuotaUsage = QuotaPage['usage'][number];

/** quotas lists quota usage, most used first, limit rows from offset on. */
export async function quotas(q: QuotaQuery, limit: number, offset = 0): Promise<{ usage: QuotaUsage[]; next: number | null }> {
  const out = await request<QuotaPage>('GET', `/quotas${quotaParams(q, { limit, offset })}`);
  return { usage: out.usage, next: out.next_offset };
}

/** quotasCSVURL is the link that downloads the selected usage as CSV. */
export function quotasCSVURL(q: QuotaQuery): string {
  return `${base}/quotas${quotaParams({ ...q, value: undefined }, { format: 'csv' })}`;
}

// --- staged rollout ---------------------------------------------------

/** AutoHalt rolls a staged version back by itself when its canary limits far more than the rest. */
export type AutoHalt = Schemas['AutoHalt'];

/** Rollout is a staged version's rollout and how it ended. */
export type Rollout = Schemas['Rollout'];

/** promote sends staged version n to every node. */
export async function promote(n: number, message: string): Promise<number> {
  const body: Schemas['PromoteRequest'] = { message };
  const out = await request<Reply<'/api/v1/versions/{n}/promote', 'post'>>('POST', `/versions/${seg(n)}/promote`, body);
  return out.version;
}

/** Cohorts is GET /versions/{n}/cohorts. */
export type Cohorts = Schemas['Cohorts'];

/** CohortPoint is one second of a staged version's canary and the other nodes. */
export type CohortPoint = Cohorts['points'][number];

/** cohorts returns a staged version's canary against the others, per second. */
export function cohorts(n: number): Promise<Cohorts> {
  return request<Cohorts>('GET', `/versions/${seg(n)}/cohorts`);
}

// --- impact preview -------------------------------------------------

/** Preview is the answer of POST /preview. */
export type Preview = Schemas['Preview'];

/** PreviewLimit is what one changed or new limit would have done to the last hour. */
export type PreviewLimit = Schemas['PreviewLimit'];

/** PreviewPoint is one span (a minute) of a previewed limit. */
export type PreviewPoint = Schemas['PreviewPoint'];

/** LimitInfo is an effective limit, defaults filled in. */
export type LimitInfo = Schemas['Limit'];

/** previewDraft replays the last hour of traffic against a draft (editor+); invalid YAML gets the publish's 422. */
export function previewDraft(domain: string, yaml: string): Promise<Preview> {
  const body: Schemas['PreviewRequest'] = { domain, yaml };
  return request<Preview>('POST', '/preview', body);
}

// --- support desk ----------------------------------------------------

/** DomainConfig is a domain's structured form, field for field like its YAML. */
export type DomainConfig = Schemas['DomainConfig'];

/** Entry is one key and value of a request descriptor. */
export type Entry = Schemas['Entry'];

/** Inspection is POST /inspect: the limits a customer's descriptors match, with their live counters. */
export type Inspection = Schemas['Inspection'];

/** InspectedLimit is one matched limit and its counter. */
export type InspectedLimit = Schemas['InspectedLimit'];

/** inspect reads the limits the descriptors match and their counters (reading consumes nothing). */
export function inspect(domain: string, descriptors: Entry[][]): Promise<Inspection> {
  const body: Schemas['InspectRequest'] = { domain, descriptors: descriptors.map((entries) => ({ entries })) };
  return request<Inspection>('POST', '/inspect', body);
}

/** ResetResult is what POST /inspect/reset reset. */
export type ResetResult = Schemas['ResetResult'];

/** resetCounters starts the counters of the descriptors' limits afresh (support+; audited with the message). */
export function resetCounters(domain: string, descriptors: Entry[][], message: string): Promise<ResetResult> {
  const body: Schemas['ResetRequest'] = { domain, descriptors: descriptors.map((entries) => ({ entries })), message };
  return request<ResetResult>('POST', '/inspect/reset', body);
}

/** Override is a temporary override and its status. */
export type Override = Schemas['Override'];

/** OverrideRequest is what POST /overrides takes. */
export type OverrideRequest = Schemas['OverrideRequest'];

/** overrides lists a domain's overrides, newest first (one page of at most limit). */
export async function overrides(domain: string, limit = 100): Promise<Override[]> {
  const out = await request<Reply<'/api/v1/overrides', 'get'>>('GET', `/overrides${query({ domain, limit })}`);
  return out.overrides;
}

/**
 * OverrideResult is an override's answer: published (201, its id and
 * version), or (four-eyes on, not urgent) the change request (202).
 */
export type OverrideResult = Partial<Reply<'/api/v1/overrides', 'post', 201>> & Partial<Proposed>;

/** createOverride publishes a temporary override (support+). */
export async function createOverride(o: OverrideRequest): Promise<OverrideResult> {
  const a = await send<Reply<'/api/v1/overrides', 'post', 201> | Proposed>('POST', '/overrides', o);
  if (a.status === 202) return { change: (a.body as Proposed).change };
  return a.body as Reply<'/api/v1/overrides', 'post', 201>;
}

/** endOverride publishes a version without the override (support+). */
export async function endOverride(id: number, message: string): Promise<number> {
  const body: Schemas['ReviewRequest'] = { message };
  const out = await request<Published>('DELETE', `/overrides/${seg(id)}`, body);
  return out.version;
}

/** RecentValue is a value limited in the last 24 hours or with quota usage now. */
export type RecentValue = Schemas['RecentValue'];

/** recentValues lists a domain's recent values starting with prefix (autocomplete). */
export async function recentValues(domain: string, prefix: string, limit = 20): Promise<RecentValue[]> {
  const out = await request<Reply<'/api/v1/stats/values/recent', 'get'>>('GET', `/stats/values/recent${query({ domain, prefix, limit })}`);
  return out.values;
}

/** ValueHistory is one value's 429s per rule and minute. */
export type ValueHistory = Schemas['ValueHistory'];

/** valueHistory returns one value's 429s per minute over the last 24 hours. */
export function valueHistory(domain: string, value: string): Promise<ValueHistory> {
  return request<ValueHistory>('GET', `/stats/values${query({ domain, value })}`);
}
