// The end-to-end harness: a fresh Postgres database, the real `sluice
// console` and two `sluice enforcer` processes on free ports, headless
// Chromium through playwright-core, and a small API client for setup.
//
// Needs bin/sluice and web/dist built (make build), Postgres at
// DATABASE_URL (a fresh database is created there and dropped after) and
// Redis at REDIS_URL. Nothing listens on a fixed port.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import axe from 'axe-core';
import { chromium, type Browser, type Page } from 'playwright-core';

const run = promisify(execFile);

/** repo is the repository root. */
export const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** chromiumPath is Debian's Chromium (never a downloaded browser). */
export const chromiumPath = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** launchBrowser starts headless Chromium. */
export function launchBrowser(): Promise<Browser> {
  return chromium.launch({
    executablePath: chromiumPath,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
}

/**
 * watch records in problems what must never happen on page: an uncaught
 * error, a native dialog (confirmations are the console's own), and a
 * Content-Security-Policy violation — except the browser's own one that the
 * console suite explains: typing over selected text in the YAML editor makes
 * Chrome wrap it in a styled span, which CSP blocks ("editor-native").
 */
export async function watch(page: Page, problems: string[]): Promise<void> {
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('dialog', (d) => {
    problems.push(`native ${d.type()} dialog: ${d.message()}`);
    void d.dismiss();
  });
  page.on('console', (msg) => {
    const t = msg.text();
    if (/^securitypolicyviolation/.test(t) && !/editor-native/.test(t)) problems.push(`CSP: ${t}`);
  });
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      const host = e.target instanceof Element ? e.target.getAttribute('data-testid') : null;
      const native = e.violatedDirective === 'style-src-attr' && e.sourceFile === '' && host === 'yaml-editor';
      console.error(
        `securitypolicyviolation${native ? ' editor-native' : ''}: ${e.violatedDirective} at ${e.sourceFile}:${e.lineNumber} sample=${e.sample} page=${location.pathname} target=${host ?? String(e.target)}`,
      );
    });
  });
}

/** signIn signs admin in through the login form of the page at url and waits for its heading. */
export async function signIn(page: Page, url: string, password: string, heading = 'Domains'): Promise<void> {
  await page.goto(url);
  await page.getByLabel('Username').fill('admin');
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

/**
 * axeTags are the axe-core rule sets expectAccessible runs: WCAG 2.0, 2.1
 * and 2.2 at levels A and AA, and axe's best practices (one main landmark,
 * all content in landmarks, skip links that land somewhere).
 */
export const axeTags = ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa', 'best-practice'];

/**
 * expectAccessible runs axe-core on the page as it is now and throws one
 * error listing every violation (rule, impact, the elements' selectors and
 * what to fix), labelled with where. axe is evaluated through the DevTools
 * protocol, so the console's Content-Security-Policy stays as strict as it
 * is for users (an injected <script> tag would be refused).
 */
export async function expectAccessible(page: Page, where: string): Promise<void> {
  if (!(await page.evaluate(() => 'axe' in window))) await page.evaluate(axe.source);
  const violations = await page.evaluate(async (tags) => {
    const w = window as unknown as { axe: typeof axe };
    const r = await w.axe.run(document, {
      runOnly: { type: 'tag', values: tags },
      // A visible label that is not part of the accessible name
      // (WCAG 2.5.3) is still marked experimental in axe.
      rules: { 'label-content-name-mismatch': { enabled: true } },
      resultTypes: ['violations'],
    });
    return r.violations.map((v) => ({
      id: v.id,
      impact: v.impact ?? '',
      help: v.help,
      nodes: v.nodes.map((n) => ({ target: n.target.map(String).join(' >> '), summary: n.failureSummary ?? '' })),
    }));
  }, axeTags);
  if (violations.length === 0) return;
  const lines = violations.flatMap((v) => [
    `${v.id} (${v.impact}): ${v.help}`,
    ...v.nodes.map((n) => `    ${n.target}\n      ${n.summary.replace(/\n/g, '\n      ')}`),
  ]);
  throw new Error(`${violations.length} accessibility violation(s) on ${where}:\n  ${lines.join('\n  ')}`);
}

function randomName(prefix: string): string {
  return `${prefix}_${process.pid}_${randomBytes(4).toString('hex')}`;
}

/** TestDatabase is a database created for one run and dropped after it. */
export interface TestDatabase {
  name: string;
  url: string;
  sql(query: string): Promise<string>;
  drop(): Promise<void>;
}

/** createDatabase makes a fresh database on the server at DATABASE_URL. */
export async function createDatabase(): Promise<TestDatabase> {
  const server = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable';
  const name = randomName('sluice_ui_e2e');
  await run('psql', [server, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-c', `CREATE DATABASE ${name}`]);
  const u = new URL(server);
  u.pathname = `/${name}`;
  const url = u.toString();
  return {
    name,
    url,
    async sql(query: string) {
      const { stdout } = await run('psql', [url, '-X', '-q', '-tA', '-v', 'ON_ERROR_STOP=1', '-c', query]);
      return stdout.trim();
    },
    async drop() {
      await run('psql', [server, '-X', '-q', '-c', `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`]);
    },
  };
}

/** Proc is a started sluice process and the address it logged. */
export interface Proc {
  child: ChildProcess;
  addr: string;
  log: () => string;
  stop(): Promise<void>;
}

// startSluice runs bin/sluice with args and waits for a log line matching
// ready, whose first group is the address it listens on.
function startSluice(args: string[], env: Record<string, string>, ready: RegExp, what: string): Promise<Proc> {
  return startProcess(join(repo, 'bin/sluice'), args, env, ready, what);
}

// startProcess runs bin with args and waits for output matching ready.
function startProcess(bin: string, args: string[], env: Record<string, string>, ready: RegExp, what: string): Promise<Proc> {
  const child = spawn(bin, args, {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const stop = () =>
    new Promise<void>((res) => {
      if (child.exitCode !== null || child.signalCode !== null) return res();
      const kill = setTimeout(() => child.kill('SIGKILL'), 10_000);
      child.once('exit', () => {
        clearTimeout(kill);
        res();
      });
      child.kill('SIGTERM');
    });
  return new Promise((res, rej) => {
    const timeout = setTimeout(() => {
      void stop();
      rej(new Error(`${what} did not start within 30 s:\n${output}`));
    }, 30_000);
    const onData = (b: Buffer) => {
      output += b.toString();
      const m = ready.exec(output);
      if (m) {
        clearTimeout(timeout);
        res({ child, addr: m[1], log: () => output, stop });
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('exit', (code) => {
      clearTimeout(timeout);
      rej(new Error(`${what} exited with ${code}:\n${output}`));
    });
  });
}

/**
 * startConsole runs `sluice console` with user admin, on a free port or the
 * listen address given; env adds environment variables (SLUICE_*).
 */
export function startConsole(
  databaseURL: string,
  adminPassword: string,
  opts: { listen?: string; env?: Record<string, string> } = {},
): Promise<Proc> {
  return startSluice(
    ['console', '--listen', opts.listen ?? '127.0.0.1:0', '--database-url', databaseURL],
    { SLUICE_ADMIN_PASSWORD: adminPassword, SLUICE_LOG_LEVEL: 'info', ...opts.env },
    /msg="console listening".*?address=(\S+)/,
    'console',
  );
}

/** freeAddress finds a free 127.0.0.1 port (for a process started later on it). */
export function freeAddress(): Promise<string> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.once('error', rej);
    srv.listen(0, '127.0.0.1', () => {
      const a = srv.address();
      const port = typeof a === 'object' && a ? a.port : 0;
      srv.close(() => res(`127.0.0.1:${port}`));
    });
  });
}

/**
 * startOIDCProvider builds and runs the test OpenID provider
 * (internal/oidcop/cmd/oidcop, zitadel's op package over HTTP) on listen,
 * with one client and the users given as NAME:PASSWORD:GROUP,GROUP. The
 * Proc's addr is the issuer URL.
 */
export async function startOIDCProvider(opts: {
  listen: string;
  clientID: string;
  clientSecret: string;
  redirectURI: string;
  users: string[];
}): Promise<Proc> {
  const bin = join(repo, 'bin/oidcop');
  await run('go', ['build', '-o', bin, './internal/oidcop/cmd/oidcop'], { cwd: repo });
  const args = ['--listen', opts.listen, '--client-id', opts.clientID, '--client-secret', opts.clientSecret, '--redirect-uri', opts.redirectURI];
  for (const u of opts.users) args.push('--user', u);
  return startProcess(bin, args, {}, /oidcop issuer=(\S+)/, 'oidc provider');
}

/** startEnforcer runs `sluice enforcer` on free ports against the console. */
export async function startEnforcer(consoleURL: string, token: string, nodeID: string, extra: string[] = []): Promise<Proc & { cleanup(): void }> {
  const state = mkdtempSync(join(tmpdir(), 'sluice-ui-e2e-'));
  const p = await startSluice(
    [
      'enforcer',
      '--console-url',
      consoleURL,
      '--node-token',
      token,
      '--node-id',
      nodeID,
      '--redis-url',
      process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0',
      '--listen',
      '127.0.0.1:0',
      '--grpc-listen',
      '127.0.0.1:0',
      '--state-dir',
      state,
      // Counts must not fail open because a loaded two-core machine
      // answered Redis late (the default bound is 50 ms).
      '--redis-timeout',
      '2s',
      ...extra,
    ],
    {},
    /msg="enforcer listening".*?http_addr=(\S+)/,
    `enforcer ${nodeID}`,
  );
  return { ...p, cleanup: () => rmSync(state, { recursive: true, force: true }) };
}

/**
 * Client is an API client for setup and probes: signed in with a session
 * cookie and its CSRF token (login), or with a Bearer token (useToken).
 */
export class Client {
  private cookie = '';
  private csrf = '';
  private bearer = '';
  constructor(readonly base: string) {}

  useToken(token: string): void {
    this.bearer = token;
  }

  async login(username: string, password: string): Promise<void> {
    const res = await fetch(`${this.base}/api/v1/auth/login`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ username, password }),
    });
    if (res.status !== 200) throw new Error(`login: ${res.status} ${await res.text()}`);
    this.csrf = ((await res.json()) as { csrf_token: string }).csrf_token;
    this.cookie = (res.headers.getSetCookie()[0] ?? '').split(';')[0];
  }

  async call<T>(method: string, path: string, body?: unknown, want = 200): Promise<T> {
    const res = await fetch(`${this.base}${path}`, {
      method,
      headers: this.bearer
        ? { 'Content-Type': 'application/json', Authorization: `Bearer ${this.bearer}` }
        : { 'Content-Type': 'application/json', Cookie: this.cookie, 'X-CSRF-Token': this.csrf },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status !== want) throw new Error(`${method} ${path}: ${res.status} ${text}, want ${want}`);
    return (text ? JSON.parse(text) : null) as T;
  }
}

/** check asks an enforcer's Lyft-compatible /json endpoint about one descriptor. */
export async function check(
  enforcer: string,
  domain: string,
  entries: { key: string; value: string }[],
): Promise<{ status: number; limit?: number; body: unknown }> {
  const res = await fetch(`http://${enforcer}/json`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ domain, descriptors: [{ entries }] }),
  });
  const body = (await res.json()) as { statuses?: { currentLimit?: { requestsPerUnit?: number } }[] };
  return { status: res.status, limit: body.statuses?.[0]?.currentLimit?.requestsPerUnit, body };
}

/** eventually retries fn until it returns without throwing, or the time is up. */
export async function eventually<T>(fn: () => Promise<T>, timeoutMs = 15_000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`${what} not met within ${timeoutMs} ms: ${last instanceof Error ? last.message : String(last)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** secret makes a random password or token-ish string. */
export function secret(): string {
  return randomBytes(18).toString('base64url');
}

export { randomName };
