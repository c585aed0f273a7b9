// Accessibility end to end: axe-core on every page of the UI (the list in
// web/src/lib/routes.ts, so a new page is covered when it is added there),
// signed out and signed in as admin, in the light and the dark theme, and
// on the dialogs a click opens. Any violation fails, listed by rule and
// element.
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { matchRoute, pages, type Route } from '../src/lib/routes';
import {
  Client,
  createDatabase,
  expectAccessible,
  freeAddress,
  launchBrowser,
  randomName,
  secret,
  signIn,
  startConsole,
  startEnforcer,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const domain = randomName('a11y').replace(/_\d+_/, '_');
const yaml = (limit: number) => `domain: ${domain}
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: ${limit}, name: per-user}
  - key: route
    value: /search
    rate_limit: {unit: minute, requests_per_unit: 50}
    shadow_mode: true
`;

let db: TestDatabase;
let consoleProc: Proc;
let enforcer: (Proc & { cleanup(): void }) | undefined;
let base: string;
let password: string;
let browser: Browser;
let page: Page;
let first = 0;
let second = 0;
const problems: string[] = [];

// pathOf is a path that shows page: /<page> unless the page needs more.
function pathOf(p: Route['page']): string {
  switch (p) {
    case 'domains':
      return '/domains';
    case 'domain':
      return `/domains/${domain}`;
    case 'new-domain':
      return '/domains/~new';
    case 'diff':
      return `/history/diff/${first}/${second}`;
    case 'not-found':
      return '/no-such-page';
    default:
      return `/${p}`;
  }
}

// visit opens path and waits until its page has loaded what it shows.
async function visit(path: string): Promise<void> {
  await page.goto(base + path);
  await page.locator('main h1').first().waitFor();
  await page.waitForFunction(() => !document.querySelector('main')?.textContent?.includes('Loading…'), undefined, { timeout: 15_000 });
}

// signedIn signs admin in unless the page shows a signed-in console.
async function signedIn(): Promise<void> {
  if (!(await page.getByRole('button', { name: 'Sign out', exact: true }).isVisible())) await signIn(page, base + '/domains', password);
}

// useTheme picks t with the header's toggle (system → light → dark).
async function useTheme(t: 'light' | 'dark'): Promise<void> {
  for (let i = 0; i < 3; i++) {
    if ((await page.evaluate(() => document.documentElement.dataset.theme)) === t) return;
    await page.getByRole('button', { name: /Change theme/ }).click();
  }
  throw new Error(`the theme toggle never reached ${t}`);
}

beforeAll(async () => {
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  const admin = new Client(base);
  await admin.login('admin', password);
  first = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(100), message: 'Seed', base_version: 0 })).version;
  second = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(70), message: 'Lower the per-user limit', base_version: first }))
    .version;
  // Four-eyes approval on, with one change waiting: the approvals page
  // shows a pending request and its diff.
  await admin.call('PUT', '/api/v1/settings', { require_approval: true });
  await admin.call('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(50), message: 'Lower it again (needs review)', base_version: second }, 202);
  // A connected node, so the nodes page has a row to show.
  const token = (await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'a11y-node', role: 'node' }, 201)).token;
  enforcer = await startEnforcer(base, token, 'a11y-node');

  browser = await launchBrowser();
  const context = await browser.newContext({ viewport: { width: 1366, height: 800 }, colorScheme: 'light' });
  page = await context.newPage();
  await watch(page, problems);
});

afterAll(async () => {
  await browser?.close();
  await enforcer?.stop();
  enforcer?.cleanup();
  await consoleProc?.stop();
  await db?.drop();
});

describe('accessibility', () => {
  it('walks a path to every page', () => {
    for (const p of pages) expect(matchRoute(pathOf(p)).page, `path for page ${p}`).toBe(p);
  });

  it.each(['light', 'dark'] as const)('has no violations on the sign-in page (%s)', async (scheme) => {
    // Signed out there is no toggle: the page follows the system's scheme.
    await page.emulateMedia({ colorScheme: scheme });
    await page.goto(base + '/domains');
    await page.getByRole('heading', { level: 1, name: 'Sign in to Sluice' }).waitFor();
    await expectAccessible(page, `the sign-in page (${scheme})`);
  });

  it.each(['light', 'dark'] as const)('has no violations on any page signed in (%s)', async (theme) => {
    await page.emulateMedia({ colorScheme: 'light' });
    await signedIn();
    await useTheme(theme);
    const failures: string[] = [];
    for (const p of pages) {
      await visit(pathOf(p));
      // The states worth checking are on screen: a change waiting for
      // review (with its diff), a connected node.
      if (p === 'approvals') await page.locator('main figure.diff').first().waitFor();
      if (p === 'nodes') await page.locator('main').getByText('a11y-node').first().waitFor();
      await expectAccessible(page, `${pathOf(p)} (${theme})`).catch((err: Error) => failures.push(err.message));
    }
    expect(failures.join('\n\n')).toBe('');
  });

  it.each(['light', 'dark'] as const)('has no violations in the editor and its dialogs (%s)', async (theme) => {
    await signedIn();
    await useTheme(theme);
    const failures: string[] = [];
    const check = (where: string) => expectAccessible(page, `${where} (${theme})`).catch((err: Error) => failures.push(err.message));

    await visit(pathOf('domain'));
    await page.getByRole('tab', { name: 'YAML' }).click();
    await page.locator('.cm-content').waitFor();
    await check('the YAML editor');
    await page.getByRole('tab', { name: 'Form' }).click();
    const perUser = page.locator('fieldset[data-testid=descriptor]').first().getByLabel('Requests per unit');
    await perUser.fill('40');
    await page.getByTestId('unsaved').waitFor();
    await check('the form with an unsaved edit');
    await page.getByRole('button', { name: 'Review and publish…' }).click();
    const publish = page.getByRole('dialog', { name: `Publish ${domain}` });
    await publish.waitFor();
    await check('the publish dialog');
    await publish.getByRole('button', { name: 'Request approval' }).click(); // no message yet
    await publish.getByRole('alert').waitFor();
    await publish.getByLabel(/Break glass/).check();
    await publish.getByLabel('Why it cannot wait').waitFor();
    await check('the publish dialog with an error and break glass');
    await publish.getByRole('button', { name: 'Cancel' }).click();
    await publish.waitFor({ state: 'hidden' });
    await page.getByRole('button', { name: 'Discard changes' }).click();
    const discard = page.getByRole('dialog', { name: `Discard your changes to ${domain}?` });
    await discard.waitFor();
    await check('the confirmation dialog');
    await discard.getByRole('button', { name: 'Discard', exact: true }).click();
    await page.getByTestId('unsaved').waitFor({ state: 'hidden' });

    await visit(pathOf('history'));
    await page.getByRole('button', { name: `Roll back to v${first}…` }).click();
    const rollback = page.getByRole('dialog', { name: `Roll back to version ${first}` });
    await rollback.locator('figure.diff').first().waitFor();
    await check('the rollback dialog');
    await rollback.getByRole('button', { name: 'Cancel' }).click();
    await rollback.waitFor({ state: 'hidden' });
    expect(failures.join('\n\n')).toBe('');
  });

  it.each(['light', 'dark'] as const)('has no violations on the sign-in page after the session ended (%s)', async (theme) => {
    await signedIn();
    await useTheme(theme);
    await visit('/domains');
    await db.sql('DELETE FROM sessions');
    await page.getByRole('link', { name: 'History' }).click();
    await page.getByRole('heading', { level: 1, name: 'Sign in to Sluice' }).waitFor();
    await page.getByText('Your session has ended').waitFor();
    await expectAccessible(page, `the sign-in page after the session ended (${theme})`);
  });

  it('saw no page errors, native dialogs or CSP violations', () => {
    expect(problems).toEqual([]);
  });
});

describe('accessibility with single sign-on', () => {
  let ssoDB: TestDatabase | undefined;
  let sso: Proc | undefined;

  beforeAll(async () => {
    ssoDB = await createDatabase();
    // Discovery is lazy, so an issuer nobody answers at still shows the
    // SSO button: the sign-in page is all this console is for.
    const consoleAddr = await freeAddress();
    sso = await startConsole(ssoDB.url, secret(), {
      listen: consoleAddr,
      env: {
        SLUICE_OIDC_ISSUER: `http://${await freeAddress()}`,
        SLUICE_OIDC_CLIENT_ID: 'sluice-console',
        SLUICE_OIDC_REDIRECT_URL: `http://${consoleAddr}/api/v1/auth/oidc/callback`,
        SLUICE_OIDC_ROLE_MAP: 'staff=viewer',
        SLUICE_PASSWORD_LOGIN: 'break-glass',
      },
    });
  });

  afterAll(async () => {
    await sso?.stop();
    await ssoDB?.drop();
  });

  it.each(['light', 'dark'] as const)('has no violations on the sign-in page with SSO (%s)', async (scheme) => {
    const p = await browser.newPage({ colorScheme: scheme });
    try {
      await p.goto(`http://${sso?.addr}/domains`);
      await p.getByRole('link', { name: 'Sign in with SSO' }).waitFor();
      await p.getByText('Break-glass accounts only:').waitFor();
      await expectAccessible(p, `the sign-in page with SSO (${scheme})`);
    } finally {
      await p.close();
    }
  });
});
