// The support desk's Customers page end to end: a real console (reading the
// enforcers' Redis through REDIS_URL, its --redis-url) and enforcer, checks
// through the enforcer's /json until one API key is limited, then headless
// Chromium signed in as a support person (an editor): they follow the
// limited value from the Live traffic table to the Customers page, see why
// it is limited (used == limit, nothing remaining), grant it an override for
// two minutes, see the limit change there and at the enforcer, end it, and
// see a second override, set to end a few seconds out, expire by itself.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { localInput, parseLocalInput } from '../src/lib/customers';
import {
  check,
  Client,
  createDatabase,
  eventually,
  launchBrowser,
  randomName,
  repo,
  secret,
  startConsole,
  startEnforcer,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const shots = join(repo, 'web/e2e/screenshots');
const domain = randomName('customers').replace(/_\d+_/, '_');
const key = 'cust-42';
// A sliding window of an hour: the customer stays at its limit for the whole run.
const yaml = `domain: ${domain}
descriptors:
  - key: api_key
    algorithm: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 5, name: per-key}
  - key: account
    algorithm: fixed_window
    calendar: true
    rate_limit: {unit: month, requests_per_unit: 1000, name: monthly}
`;

let db: TestDatabase;
let consoleProc: Proc;
let enforcer: Proc & { cleanup(): void };
let base: string;
let admin: Client;
let browser: Browser;
let page: Page;
const problems: string[] = [];
const viewerPassword = secret();

async function onVersion(v: number): Promise<void> {
  await eventually(
    async () => {
      const { nodes } = await admin.call<{ nodes: { status: string; applied_version: number }[] }>('GET', '/api/v1/nodes');
      if (!nodes.some((n) => n.status === 'connected' && n.applied_version >= v)) throw new Error(JSON.stringify(nodes));
    },
    15_000,
    `the enforcer on version ${v}`,
  );
}

// limit is the Customers page's card of the per-key limit, with what it shows.
async function limit(rule = 'per-key'): Promise<{ used: number; remaining: number; limit: number; text: string }> {
  const li = page.locator(`[data-testid=limit][data-rule="${rule}"]`);
  await li.waitFor({ timeout: 5_000 });
  const d = await li.evaluate((el) => ({ ...(el as HTMLElement).dataset }));
  return { used: Number(d.used), remaining: Number(d.remaining), limit: Number(d.limit), text: await li.innerText() };
}

async function limitIs(rpu: number, what: string): Promise<void> {
  await eventually(
    async () => {
      const l = await limit();
      if (l.limit !== rpu) throw new Error(JSON.stringify(l));
    },
    10_000,
    what,
  );
}

// grant opens the Grant override dialog of the per-key limit and fills it in.
async function grant(rate: number, message: string, expiry: () => Promise<void>): Promise<number> {
  await page.locator('[data-testid=limit][data-rule="per-key"]').getByRole('button', { name: 'Grant override…' }).click();
  const dialog = page.getByRole('dialog', { name: `Grant ${key} an override` });
  await dialog.waitFor();
  await dialog.getByLabel('Requests').fill(String(rate));
  await dialog.getByLabel('per', { exact: true }).selectOption('hour');
  await dialog.getByLabel('Why (kept in the audit trail)').fill(message);
  await expiry();
  if (rate === 100) await page.screenshot({ path: join(shots, '41-customer-grant-dialog.png') });
  await expect(dialog.getByTestId('preview-after').innerText()).resolves.toBe(`${rate} / hour`);
  await expect(dialog.getByTestId('override-preview').innerText()).resolves.toContain('5 / hour');
  await dialog.getByRole('button', { name: 'Grant override' }).click();
  await dialog.waitFor({ state: 'hidden' });
  const notice = page.getByText(new RegExp(`^Override published in version \\d+: ${rate} / hour`));
  await notice.waitFor();
  return Number(/version (\d+)/.exec(await notice.innerText())![1]);
}

beforeAll(async () => {
  mkdirSync(shots, { recursive: true });
  db = await createDatabase();
  const password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  admin.useToken((await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'customers-e2e-admin', role: 'admin' }, 201)).token);
  const node = await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'customers-e2e-node', role: 'node' }, 201);
  const { version } = await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml, message: 'Five an hour per key', base_version: 0 });
  const supportPassword = secret();
  await admin.call('POST', '/api/v1/users', { username: 'sam', password: supportPassword, role: 'editor' }, 201);
  await admin.call('POST', '/api/v1/users', { username: 'vic', password: viewerPassword, role: 'viewer' }, 201);
  enforcer = await startEnforcer(base, node.token, 'customers-e2e-1');
  await onVersion(version);

  browser = await launchBrowser();
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 }, colorScheme: 'dark' });
  page = await context.newPage();
  await watch(page, problems);
  await page.goto(`${base}/`);
  await page.getByLabel('Username').fill('sam');
  await page.getByLabel('Password').fill(supportPassword);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Domains' }).waitFor();
}, 90_000);

afterAll(async () => {
  await browser?.close();
  await enforcer?.stop();
  enforcer?.cleanup();
  await consoleProc?.stop();
  await db?.drop();
});

describe('the Customers page', () => {
  it('is reached from a limited value of the Live traffic table and shows why it is limited', async () => {
    let limited = 0;
    for (let i = 0; i < 8; i++) if ((await check(enforcer.addr, domain, [{ key: 'api_key', value: key }])).status === 429) limited++;
    expect(limited).toBe(3);
    for (let i = 0; i < 2; i++) expect((await check(enforcer.addr, domain, [{ key: 'account', value: key }])).status).toBe(200);

    await page.getByRole('link', { name: 'Live traffic', exact: true }).click();
    await page.getByLabel('Domain', { exact: true }).selectOption(domain);
    const link = page.getByTestId('top-limited').getByRole('link', { name: `Look up the customer ${key}` });
    await link.waitFor({ timeout: 10_000 });
    await link.click();
    await page.getByRole('heading', { level: 1, name: 'Customers' }).waitFor();
    const url = new URL(page.url());
    expect(Object.fromEntries(url.searchParams)).toEqual({ domain, rule: 'per-key', value: key });
    await expect(page.getByRole('link', { name: 'Customers', exact: true }).getAttribute('aria-current')).resolves.toBe('page');

    // The descriptor is built from the value and the rule it came from.
    await expect(page.getByRole('checkbox', { name: `api_key=${key}` }).isChecked()).resolves.toBe(true);
    const l = await limit();
    expect(l).toMatchObject({ used: 5, remaining: 0, limit: 5 });
    expect(l.text).toContain('5 / hour');
    expect(l.text).toContain('limited');
    expect(l.text).toMatch(/5 used of 5,\s*0 remaining · back to full at \d{4}-/);
    await page.getByRole('meter', { name: 'per-key used' }).waitFor();
    // The publish of the domain's limits is a marker on the 429 chart.
    await page.locator('[data-testid=traffic-chart] [data-testid=marker][data-version="1"]').waitFor({ timeout: 5_000 });
    await page.getByTestId('overrides').or(page.getByText('No override for this customer.')).waitFor();
    await page.screenshot({ path: join(shots, '40-customer-limited.png'), fullPage: true });
  });

  it('grants an override for two minutes, and the limit changes on the page and at the enforcer', async () => {
    let picked = 0;
    const v = await grant(100, 'ticket 42: 100/hour for the launch', async () => {
      const dialog = page.getByRole('dialog');
      await dialog.getByRole('button', { name: '2 min' }).click();
      picked = parseLocalInput(await dialog.getByLabel('End (your local time)').inputValue())!.getTime();
      await expect(dialog.getByRole('button', { name: '2 min' }).getAttribute('aria-pressed')).resolves.toBe('true');
    });
    expect(Math.abs(picked - (Date.now() + 120_000))).toBeLessThan(10_000);
    await limitIs(100, 'inspect showing the override');
    await page.locator('[data-testid=limit][data-rule="per-key"]').getByTestId('overridden').waitFor({ timeout: 5_000 });
    const active = page.locator('[data-testid=override][data-status=active]');
    await active.waitFor();
    await expect(active.innerText()).resolves.toMatch(/100 \/ hour[\s\S]*ticket 42/);
    const { overrides } = await admin.call<{ overrides: { expires_at: string; status: string }[] }>('GET', `/api/v1/overrides?domain=${domain}`);
    expect(overrides).toHaveLength(1);
    expect(Math.abs(new Date(overrides[0].expires_at).getTime() - picked)).toBeLessThan(1000);

    await onVersion(v);
    const r = await check(enforcer.addr, domain, [{ key: 'api_key', value: key }]);
    expect(r.status).toBe(200);
    expect(r.limit).toBe(100);
    await page.screenshot({ path: join(shots, '42-customer-override.png'), fullPage: true });
  });

  it('ends the override early, and sees a second one expire by itself', async () => {
    await page.locator('[data-testid=override][data-status=active]').getByRole('button', { name: 'End override…' }).click();
    const dialog = page.getByRole('dialog', { name: 'End this override now?' });
    await dialog.getByLabel('Why (kept in the audit trail)').fill('ticket 42: launch is over');
    await dialog.getByRole('button', { name: 'End override' }).click();
    await page.locator('[data-testid=override][data-status=ended]').waitFor({ timeout: 10_000 });
    await limitIs(5, 'inspect back at the domain limit');

    // A few seconds out, through the picker's own datetime.
    await grant(50, 'ticket 43: a short burst', async () => {
      await page.getByRole('dialog').getByLabel('End (your local time)').fill(localInput(new Date(Date.now() + 6_000)));
    });
    await limitIs(50, 'inspect showing the second override');
    const expired = page.locator('[data-testid=override][data-status=expired]');
    await expired.waitFor({ timeout: 20_000 });
    await expect(expired.innerText()).resolves.toMatch(/50 \/ hour[\s\S]*by system/);
    await limitIs(5, 'inspect back at the domain limit after the expiry');
    await eventually(
      async () => {
        const r = await check(enforcer.addr, domain, [{ key: 'api_key', value: key }]);
        if (r.status !== 429 || r.limit !== 5) throw new Error(JSON.stringify(r));
      },
      10_000,
      'the enforcer limiting at 5 again',
    );
    await page.screenshot({ path: join(shots, '43-customer-expired.png'), fullPage: true });
  });

  it('resets the counters of the customer after asking why', async () => {
    await page.getByRole('button', { name: 'Reset counters…' }).click();
    const dialog = page.getByRole('dialog', { name: `Reset the counters of ${key}?` });
    await expect(dialog.innerText()).resolves.toContain(`per-key (5 used) for api_key=${key}`);
    // The message is required: without it nothing is sent.
    await dialog.getByRole('button', { name: 'Reset counters' }).click();
    await expect(dialog.isVisible()).resolves.toBe(true);
    expect((await limit()).used).toBe(5);
    await dialog.getByLabel('Why (kept in the audit trail)').fill('ticket 44: fresh start after the launch');
    await dialog.getByRole('button', { name: 'Reset counters' }).click();
    await page.getByText(`Reset 1 limit of ${key}.`).waitFor();
    await eventually(
      async () => {
        const l = await limit();
        if (l.used !== 0 || l.remaining !== 5) throw new Error(JSON.stringify(l));
      },
      10_000,
      'the counters reset on the page',
    );
    // The enforcer that rejected the key asks Redis again within a second
    // (its over-limit cache rechecks), and then admits it.
    await eventually(
      async () => {
        const r = await check(enforcer.addr, domain, [{ key: 'api_key', value: key }]);
        if (r.status !== 200) throw new Error(`check after the reset: ${r.status}`);
      },
      10_000,
      'the enforcer to admit the reset customer',
    );
    const { events } = await admin.call<{ events: { action: string; actor: string }[] }>('GET', '/api/v1/audit?action=counter.reset');
    expect(events.map((e) => e.actor)).toEqual([expect.stringContaining('sam')]);
  });

  it('shows a viewer the same customer without Reset and Grant override', async () => {
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Username').fill('vic');
    await page.getByLabel('Password').fill(viewerPassword);
    await page.getByRole('button', { name: 'Sign in' }).click();
    // Signed in again on the page they left; start from an empty search.
    await page.getByRole('heading', { level: 1, name: 'Customers' }).waitFor();
    await page.goto(`${base}/customers`);
    await page.getByLabel('Value').fill(key);
    await page.getByLabel('Domain').selectOption(domain);
    await page.getByRole('button', { name: 'Look up' }).click();
    expect((await limit()).limit).toBe(5);
    await page.locator('[data-testid=override][data-status=expired]').waitFor();
    for (const name of ['Reset counters…', 'Grant override…', 'End override…']) expect(await page.getByRole('button', { name }).count()).toBe(0);
    await page.getByText('Support staff, editors and admins can also reset its counters').waitFor();

    // From the Quotas page's value to the same customer, its quota picked.
    await eventually(
      async () => {
        await page.goto(`${base}/quotas?domain=${domain}`);
        await page.getByTestId('quotas').getByRole('link', { name: `Look up the customer ${key}` }).click({ timeout: 1_000 });
      },
      20_000,
      'the quota usage reported and linked',
    );
    await page.getByRole('heading', { level: 1, name: 'Customers' }).waitFor();
    expect(new URL(page.url()).searchParams.get('rule')).toBe('monthly');
    await expect(page.getByRole('checkbox', { name: `account=${key}` }).isChecked()).resolves.toBe(true);
    await expect(page.getByRole('checkbox', { name: `api_key=${key}` }).isChecked()).resolves.toBe(false);
    await page.getByRole('meter', { name: 'monthly quota used' }).waitFor();
    await expect(page.getByRole('meter', { name: 'monthly quota used' }).getAttribute('aria-valuetext')).resolves.toBe('2 of 1,000 (<1 %)');
    expect((await limit('monthly')).used).toBe(2);
  });

  it('logged no CSP violation and no uncaught error', () => {
    expect(problems).toEqual([]);
  });
});
