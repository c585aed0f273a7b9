// Single sign-on end to end: the real console configured for OpenID Connect
// against a real provider process (internal/oidcop: zitadel's certified op
// package over HTTP), passwords limited to the break-glass admin, headless
// Chromium signing in through the provider's own login page. The provider
// is down at first: the SSO button leads to a page that says so and the
// break-glass password still works; once it is up, SSO signs people in
// with the role their groups map to, and a person whose groups have none is
// told why; when it goes down again, the SSO button says so again.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  createDatabase,
  freeAddress,
  launchBrowser,
  secret,
  signIn,
  startConsole,
  startOIDCProvider,
  repo,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const shots = join(repo, 'web/e2e/screenshots');

let db: TestDatabase;
let consoleProc: Proc;
let provider: Proc | undefined;
let base: string;
let opAddr: string;
let browser: Browser;
let dir: string;
const problems: string[] = [];
const adminPassword = secret();
const clientSecret = secret();

beforeAll(async () => {
  db = await createDatabase();
  dir = mkdtempSync(join(tmpdir(), 'sluice-sso-e2e-'));
  writeFileSync(join(dir, 'client-secret'), clientSecret);
  opAddr = await freeAddress();
  const listen = await freeAddress();
  base = `http://${listen}`;
  consoleProc = await startConsole(db.url, adminPassword, {
    listen,
    env: {
      SLUICE_OIDC_ISSUER: `http://${opAddr}`,
      SLUICE_OIDC_CLIENT_ID: 'sluice-console',
      SLUICE_OIDC_CLIENT_SECRET_FILE: join(dir, 'client-secret'),
      SLUICE_OIDC_REDIRECT_URL: `${base}/api/v1/auth/oidc/callback`,
      SLUICE_OIDC_ROLE_MAP: 'sre=admin; team-api=editor:api; staff=viewer',
      SLUICE_PASSWORD_LOGIN: 'break-glass',
    },
  });
  const admin = new Client(base);
  await admin.login('admin', adminPassword);
  await admin.call('POST', '/api/v1/users', { username: 'alice', password: 'alice-password', role: 'editor' }, 201);
  browser = await launchBrowser();
  mkdirSync(shots, { recursive: true });
});

afterAll(async () => {
  await browser?.close();
  await provider?.stop();
  await consoleProc?.stop();
  await db?.drop();
  if (dir) rmSync(dir, { recursive: true, force: true });
  expect(problems).toEqual([]);
});

async function freshPage(): Promise<Page> {
  const context = await browser.newContext();
  const page = await context.newPage();
  await watch(page, problems);
  return page;
}

async function me(page: Page): Promise<{ username?: string; role?: string }> {
  return page.evaluate(async () => (await fetch('/api/v1/me')).json());
}

describe('single sign-on', () => {
  it('with the provider down, says so, and the break-glass admin still signs in with a password', async () => {
    const page = await freshPage();
    await page.goto(base);
    const sso = page.getByRole('link', { name: 'Sign in with SSO' });
    await sso.waitFor();
    await expect(page.getByText('Break-glass accounts only:').isVisible()).resolves.toBe(true);
    await page.screenshot({ path: join(shots, 'sso-login.png') });
    await sso.click();
    await page.getByRole('heading', { level: 1, name: 'The identity provider is unavailable' }).waitFor();
    await page.screenshot({ path: join(shots, 'sso-provider-down.png') });
    await expect(page.getByRole('alert').textContent()).resolves.toContain('break-glass account can still sign in with a password');

    // Someone who is not a break-glass account is told to use SSO.
    await page.getByRole('link', { name: 'Back to sign-in' }).click();
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill('alice-password');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await page.getByRole('alert').getByText('sign in with SSO').waitFor();

    await signIn(page, base, adminPassword);
    await expect(me(page)).resolves.toMatchObject({ username: 'admin', role: 'admin' });
    await page.context().close();
  });

  it('signs a person in through the provider, with the role their groups map to', async () => {
    provider = await startOIDCProvider({
      listen: opAddr,
      clientID: 'sluice-console',
      clientSecret,
      redirectURI: `${base}/api/v1/auth/oidc/callback`,
      users: ['bob:bob-password:team-api,staff', 'dan:dan-password:contractors'],
    });
    const page = await freshPage();
    await page.goto(`${base}/history`);
    await page.getByRole('link', { name: 'Sign in with SSO' }).click();
    await page.getByRole('heading', { name: 'Test identity provider' }).waitFor();
    expect(new URL(page.url()).host).toBe(opAddr);
    await page.getByLabel('Username').fill('bob');
    await page.getByLabel('Password').fill('bob-password');
    await page.getByRole('button', { name: 'Sign in at the provider' }).click();
    await page.getByTestId('who').getByText('bob').waitFor();
    expect(new URL(page.url()).pathname).toBe('/history');
    await expect(me(page)).resolves.toMatchObject({ username: 'bob', role: 'editor' });
    await page.context().close();
  });

  it('tells a person whose groups have no role why they cannot sign in', async () => {
    const page = await freshPage();
    await page.goto(base);
    await page.getByRole('link', { name: 'Sign in with SSO' }).click();
    await page.getByLabel('Username').fill('dan');
    await page.getByLabel('Password').fill('dan-password');
    await page.getByRole('button', { name: 'Sign in at the provider' }).click();
    await page.getByRole('heading', { level: 1, name: 'No access to Sluice' }).waitFor();
    await expect(page.getByRole('alert').textContent()).resolves.toContain('none of your groups (contractors)');
    await expect(me(page)).resolves.toMatchObject({ error: { code: 'unauthorized' } });
    await page.context().close();
  });

  it('says so when the provider goes down after people have signed in through it', async () => {
    await provider?.stop();
    const page = await freshPage();
    await page.goto(base);
    await page.getByRole('link', { name: 'Sign in with SSO' }).click();
    await page.getByRole('heading', { level: 1, name: 'The identity provider is unavailable' }).waitFor();
    await page.context().close();
  });
});
