// Team-owned domains in the UI: an editor of some domains sees the edit
// controls on theirs only (and is told why elsewhere), and an admin grants
// domains and ends a user's sessions from the Users page.
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, createDatabase, launchBrowser, secret, signIn, startConsole, watch, type Proc, type TestDatabase } from './harness';

let db: TestDatabase;
let consoleProc: Proc;
let base: string;
let admin: Client;
let password: string;
let browser: Browser;
let teamContext: BrowserContext;
let adminContext: BrowserContext;
let team: Page;
let adminPage: Page;
const problems: string[] = [];
const teamPassword = secret();

const yaml = (domain: string) => `domain: ${domain}\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 10}\n`;

beforeAll(async () => {
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  admin.useToken((await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'scope-e2e', role: 'admin' }, 201)).token);
  let base_version = 0;
  for (const d of ['api', 'search']) {
    base_version = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${d}`, { yaml: yaml(d), message: 'seed', base_version })).version;
  }
  await admin.call('POST', '/api/v1/users', { username: 'apiteam', password: teamPassword, role: 'editor', domains: ['api'] }, 201);
  browser = await launchBrowser();
  teamContext = await browser.newContext();
  adminContext = await browser.newContext();
  team = await teamContext.newPage();
  adminPage = await adminContext.newPage();
  await watch(team, problems);
  await watch(adminPage, problems);
});

afterAll(async () => {
  await browser?.close();
  await consoleProc?.stop();
  await db?.drop();
});

describe('team-owned domains', () => {
  it('shows an editor of api the publish controls on api only', async () => {
    await team.goto(base);
    await team.getByLabel('Username').fill('apiteam');
    await team.getByLabel('Password').fill(teamPassword);
    await team.getByRole('button', { name: 'Sign in' }).click();
    await team.getByRole('heading', { level: 1, name: 'Domains' }).waitFor();
    expect(await team.getByTestId('who-domains').textContent()).toContain('api');

    await team.goto(`${base}/domains/api`);
    await team.getByRole('button', { name: 'Review and publish…' }).waitFor();
    expect(await team.getByRole('button', { name: 'Delete domain…' }).count()).toBe(1);
    expect(await team.getByTestId('scope-notice').count()).toBe(0);

    await team.goto(`${base}/domains/search`);
    const notice = team.getByTestId('scope-notice');
    await notice.waitFor();
    expect(await notice.textContent()).toContain('api only');
    expect(await team.getByRole('button', { name: 'Review and publish…' }).count()).toBe(0);
    expect(await team.getByRole('button', { name: 'Delete domain…' }).count()).toBe(0);
    // Not an admin of every domain: no Users or API tokens in the menu.
    expect(await team.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Users' }).count()).toBe(0);
  });

  it('offers the review of a pending change only to an editor of the domains it touches', async () => {
    await admin.call('PUT', '/api/v1/settings', { require_approval: true });
    const { version } = await admin.call<{ version: number }>('GET', '/api/v1/ruleset');
    const ids: Record<string, number> = {};
    for (const d of ['api', 'search']) {
      const body = { yaml: yaml(d).replace('10}', '20}'), message: `raise ${d}`, base_version: version };
      ids[d] = (await admin.call<{ change: { id: number } }>('PUT', `/api/v1/domains/${d}`, body, 202)).change.id;
    }
    try {
      await team.goto(`${base}/approvals`);
      const card = (d: string) => team.locator('section', { has: team.locator(`#change-${ids[d]}`) });
      await card('search').waitFor();
      await card('api').getByRole('button', { name: 'Approve and publish' }).waitFor();
      expect(await card('search').getByRole('button', { name: 'Approve and publish' }).count()).toBe(0);
      expect(await card('search').getByRole('button', { name: 'Reject' }).count()).toBe(0);
      expect(await card('search').getByTestId('scope-review').textContent()).toContain('holds for api only');
    } finally {
      for (const id of Object.values(ids)) await admin.call('POST', `/api/v1/changes/${id}/reject`, { message: 'test over' });
      await admin.call('PUT', '/api/v1/settings', { require_approval: false });
    }
    expect(problems).toEqual([]);
  });

  it('lets an admin grant domains and end a user’s session', async () => {
    await signIn(adminPage, base, password);
    await adminPage.goto(`${base}/users`);
    const row = adminPage.getByTestId('users').locator('tr', { has: adminPage.locator('td strong').getByText('apiteam', { exact: true }) });
    await row.waitFor();
    expect(await row.textContent()).toContain('api');
    await row.getByRole('button', { name: 'Domains…' }).click();
    await adminPage.getByRole('dialog').getByLabel('Domains').fill('api, search');
    await adminPage.getByRole('button', { name: 'Save domains' }).click();
    await expect.poll(async () => row.textContent()).toContain('api, search');
    const users = await admin.call<{ users: { username: string; domains: string[] }[] }>('GET', '/api/v1/users');
    expect(users.users.find((u) => u.username === 'apiteam')?.domains).toEqual(['api', 'search']);

    // The grant reaches the signed-in editor on their next page load.
    await team.goto(`${base}/domains/search`);
    await team.getByRole('button', { name: 'Review and publish…' }).waitFor();

    await row.getByRole('button', { name: 'Sessions…' }).click();
    const sessions = adminPage.getByTestId('sessions');
    await sessions.getByRole('button', { name: 'End' }).first().waitFor();
    expect(await sessions.getByRole('listitem').count()).toBe(1);
    await sessions.getByRole('button', { name: 'End' }).click();
    await sessions.getByText('apiteam is not signed in anywhere.').waitFor();

    // The ended session is out at its next request.
    await team.goto(`${base}/domains`);
    await team.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
    expect(problems).toEqual([]);
  });

  it('lets an admin set the session lifetimes and turn on the audit stream', async () => {
    await adminPage.goto(`${base}/users`);
    await adminPage.getByTestId('audit-stream').getByText('Delivered up to event').waitFor(); // loaded
    await adminPage.getByLabel('Sign out after idle (hours)').fill('2');
    await adminPage.getByRole('button', { name: 'Save lifetimes' }).click();
    await adminPage.getByText('Saved the session lifetimes').waitFor();
    const card = adminPage.getByTestId('audit-stream');
    await card.getByLabel('Webhook URL').fill('https://siem.example.com/in');
    await card.getByLabel('Signing secret').fill('a-secret-of-some-length');
    await card.getByLabel('Deliver').check();
    await card.getByRole('button', { name: 'Save audit stream' }).click();
    await adminPage.getByText('The audit stream is on.').waitFor();
    const settings = await admin.call<{ session_idle_s: number }>('GET', '/api/v1/settings');
    expect(settings.session_idle_s).toBe(7200);
    const stream = await admin.call<Record<string, unknown>>('GET', '/api/v1/audit/stream');
    expect(stream).toMatchObject({ url: 'https://siem.example.com/in', enabled: true, secret_set: true });
    expect(JSON.stringify(stream)).not.toContain('a-secret-of-some-length');
    expect(problems).toEqual([]);
  });

  it('creates a token scoped to domains, read-only, and hands it over to a user it then acts for', async () => {
    await adminPage.goto(`${base}/tokens`);
    const form = adminPage.locator('form', { has: adminPage.getByRole('heading', { name: 'New token' }) });
    await form.getByLabel('Name').fill('search-bot');
    await form.getByLabel('Role').selectOption('admin');
    await form.getByTestId('token-domains').fill('search');
    await form.getByLabel('Read-only').check();
    await form.getByRole('button', { name: 'Create token' }).click();
    await adminPage.getByTestId('new-token').waitFor();
    const row = adminPage.getByTestId('tokens').locator('tr', { has: adminPage.locator('td strong').getByText('search-bot', { exact: true }) });
    await expect.poll(async () => row.textContent()).toContain('read-only');
    expect(await row.textContent()).toContain('search');

    await row.getByRole('button', { name: 'Hand over…' }).click();
    await adminPage.getByRole('dialog').getByLabel('New owner (username)').fill('apiteam');
    await adminPage.getByRole('dialog').getByRole('button', { name: 'Hand over' }).click();
    await adminPage.getByText('Token search-bot now acts for apiteam (as editor).').waitFor();
    await expect.poll(async () => row.textContent()).toContain('acts for apiteam');
    expect(await row.textContent()).toContain('acts as editor');
    const list = await admin.call<{ tokens: { name: string; domains: string[]; read_only: boolean; owner: string; effective_role: string }[] }>(
      'GET',
      '/api/v1/tokens',
    );
    expect(list.tokens.find((t) => t.name === 'search-bot')).toMatchObject({ domains: ['search'], read_only: true, owner: 'apiteam', effective_role: 'editor' });
    expect(problems).toEqual([]);
  });

  it('signs out everywhere: every session of the user ends, not just this one', async () => {
    const otherContext = await browser.newContext();
    try {
      const other = await otherContext.newPage();
      await watch(other, problems);
      await signIn(other, base, password);
      await adminPage.goto(`${base}/domains`);
      await adminPage.getByRole('button', { name: 'Sign out everywhere' }).click();
      await adminPage.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
      await other.goto(`${base}/domains`);
      await other.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
      expect(await other.evaluate(() => fetch('/api/v1/me').then((r) => r.status))).toBe(401);
    } finally {
      await otherContext.close();
    }
    expect(problems).toEqual([]);
  });
});
