// The Users page's admin actions end to end: an admin changes users' roles
// and resets a password through the dialogs, the console applies them (the
// user's sessions end, the new password works, the audit trail has them),
// cancelling changes nothing, and the console's refusal to demote the last
// admin is shown in place.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  createDatabase,
  launchBrowser,
  repo,
  secret,
  signIn,
  startConsole,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const shots = join(repo, 'web/e2e/screenshots');

let db: TestDatabase;
let consoleProc: Proc;
let base: string;
let admin: Client;
let password: string;
let browser: Browser;
let context: BrowserContext;
let page: Page;
const problems: string[] = [];
const alicePassword = secret();
/** The id of the setup client's token, which acts for its owner (admin until handed over). */
let setupToken = 0;

interface User {
  id: number;
  username: string;
  role: string;
  disabled: boolean;
}

async function user(name: string): Promise<User> {
  const { users } = await admin.call<{ users: User[] }>('GET', '/api/v1/users');
  const u = users.find((x) => x.username === name);
  if (!u) throw new Error(`no user ${name}`);
  return u;
}

function row(name: string) {
  // By the name in the user cell: a role badge may say "admin" too.
  return page.getByTestId('users').locator('tr', { has: page.locator('td strong').getByText(name, { exact: true }) });
}

// unlabelled lists the visible form controls without an accessible name.
function unlabelled(): Promise<string[]> {
  return page.evaluate(() => {
    const out: string[] = [];
    for (const el of document.querySelectorAll<HTMLElement>('input, select, textarea, button')) {
      if (el.offsetParent === null || el.getAttribute('type') === 'hidden') continue;
      const named =
        (el as HTMLInputElement).labels?.length ||
        el.getAttribute('aria-label') ||
        el.getAttribute('aria-labelledby') ||
        (el.tagName === 'BUTTON' && el.textContent?.trim());
      if (!named) out.push(el.outerHTML.slice(0, 120));
    }
    return out;
  });
}

beforeAll(async () => {
  mkdirSync(shots, { recursive: true });
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  const made = await admin.call<{ id: number; token: string }>('POST', '/api/v1/tokens', { name: 'users-e2e', role: 'admin' }, 201);
  setupToken = made.id;
  admin.useToken(made.token);
  await admin.call('POST', '/api/v1/users', { username: 'alice', password: alicePassword, role: 'viewer' }, 201);
  await admin.call('POST', '/api/v1/users', { username: 'bob', password: secret(), role: 'editor' }, 201);

  browser = await launchBrowser();
  context = await browser.newContext({ viewport: { width: 1366, height: 800 } });
  page = await context.newPage();
  await watch(page, problems);
  await signIn(page, base + '/users', password, 'Users');
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await consoleProc?.stop();
  await db?.drop();
});

describe('the Users page', () => {
  it('promotes a user after saying what changes', async () => {
    await row('alice').getByRole('button', { name: 'Change role…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Change the role of alice' });
    await dialog.getByText('alice is a viewer.').waitFor();
    const save = dialog.getByRole('button', { name: 'Change role' });
    expect(await save.isDisabled()).toBe(true); // nothing to change yet
    await dialog.getByLabel('New role').selectOption('editor');
    await expect(dialog.getByTestId('role-effect').innerText()).resolves.toMatch(/Promote alice to editor\?.*alice becomes an editor/s);
    expect(await unlabelled()).toEqual([]);
    await page.screenshot({ path: join(shots, 'users-role-dialog.png') });
    await save.click();
    await dialog.waitFor({ state: 'hidden' });
    await row('alice').getByText('editor', { exact: true }).waitFor();
    expect((await user('alice')).role).toBe('editor');
    const audit = await admin.call<{ events: { action: string; target: string; after: { role?: string } }[] }>('GET', '/api/v1/audit?action=user.role');
    expect(audit.events.some((e) => e.action === 'user.role' && e.after?.role === 'editor')).toBe(true);
  });

  it('changes nothing when cancelled', async () => {
    await row('bob').getByRole('button', { name: 'Change role…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Change the role of bob' });
    await dialog.getByLabel('New role').selectOption('viewer');
    await expect(dialog.getByTestId('role-effect').innerText()).resolves.toMatch(/Demote bob to viewer\?.*can no longer publish/s);
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'hidden' });
    expect((await user('bob')).role).toBe('editor');
    await row('bob').getByText('editor', { exact: true }).waitFor();
  });

  it("shows the console's refusal to demote the last admin in the dialog", async () => {
    await row('admin').getByRole('button', { name: 'Change role…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Change the role of admin' });
    await dialog.getByLabel('New role').selectOption('viewer');
    await expect(dialog.getByTestId('role-effect').innerText()).resolves.toMatch(/You lose access to this page/);
    await dialog.getByRole('button', { name: 'Change role' }).click();
    await expect(dialog.getByRole('alert').innerText()).resolves.toMatch(/last enabled admin; make another admin first/);
    await page.screenshot({ path: join(shots, 'users-last-admin.png') });
    expect(await dialog.isVisible()).toBe(true); // still open, to try something else
    expect((await user('admin')).role).toBe('admin');
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'hidden' });
  });

  it('resets a password: checks it first, ends the sessions, and the new one works', async () => {
    const alice = new Client(base);
    await alice.login('alice', alicePassword);
    await alice.call('GET', '/api/v1/me');

    expect(await row('admin').getByRole('button', { name: 'Reset password…' }).count()).toBe(0); // it would end the admin's own session
    await row('alice').getByRole('button', { name: 'Reset password…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Reset the password of alice' });
    const save = dialog.getByRole('button', { name: 'Reset password' });
    await dialog.getByLabel('New password').fill('short');
    await expect(dialog.getByTestId('password-problem').innerText()).resolves.toMatch(/at least 8/);
    expect(await save.isDisabled()).toBe(true);
    await dialog.getByLabel('New password').fill('long-enough-password');
    await dialog.getByLabel('Repeat it').fill('long-enough-passwort');
    await expect(dialog.getByTestId('password-problem').innerText()).resolves.toMatch(/differ/);
    expect(await save.isDisabled()).toBe(true);

    await dialog.getByRole('button', { name: 'Generate a password' }).click();
    const generated = await dialog.getByLabel('New password').inputValue();
    expect(generated).toMatch(/^[a-km-zA-HJ-NP-Z2-9]{20}$/);
    expect(await dialog.getByLabel('New password').getAttribute('type')).toBe('text'); // shown, to hand over
    expect(await dialog.getByLabel('Repeat it').inputValue()).toBe(generated);
    expect(await dialog.getByTestId('password-problem').count()).toBe(0);
    expect(await unlabelled()).toEqual([]);
    await page.screenshot({ path: join(shots, 'users-reset-dialog.png') });
    await save.click();
    await dialog.waitFor({ state: 'hidden' });
    await page.getByText('Reset the password of alice; their sessions ended.').waitFor();

    await alice.call('GET', '/api/v1/me', undefined, 401); // her session ended
    await expect(new Client(base).login('alice', alicePassword)).rejects.toThrow(/401/);
    await new Client(base).login('alice', generated);
  });

  it('lets an admin hand over and step down, and then follows the new role', async () => {
    await admin.call('PUT', `/api/v1/users/${(await user('alice')).id}/role`, { role: 'admin' });
    // A token never holds more than its owner: hand the setup token to
    // alice before admin steps down, or it would step down with them.
    await admin.call('PUT', `/api/v1/tokens/${setupToken}/owner`, { owner: 'alice' });
    await page.reload();
    await row('admin').getByRole('button', { name: 'Change role…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Change the role of admin' });
    await dialog.getByLabel('New role').selectOption('editor');
    await expect(dialog.getByTestId('role-effect').innerText()).resolves.toMatch(/Make yourself an editor\?/);
    await dialog.getByRole('button', { name: 'Change role' }).click();
    await page.getByText('Only admins manage users.').waitFor();
    expect((await user('admin')).role).toBe('editor');
    expect(problems).toEqual([]);
  });
});

describe('the create form beside the row actions', () => {
  it("keeps the form's labels unambiguous", async () => {
    await admin.call('PUT', `/api/v1/users/${(await user('admin')).id}/role`, { role: 'admin' });
    await page.reload();
    await page.getByRole('heading', { level: 1, name: 'Users' }).waitFor();
    await row('bob').waitFor();
    for (const label of ['Username', 'Password', 'Role']) {
      expect(await page.getByLabel(label).count(), label).toBe(1);
    }
  });
});
