// The Quotas page end to end: a real console and enforcer, checks
// through the enforcer's /json against a monthly calendar quota, the
// enforcer stopped (its last usage goes out at shutdown), then headless
// Chromium: the top consumers in order, one value against its limit, the
// CSV download, and a bad period explained before anything is asked.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  check,
  Client,
  createDatabase,
  eventually,
  launchBrowser,
  randomName,
  repo,
  secret,
  signIn,
  startConsole,
  startEnforcer,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const shots = join(repo, 'web/e2e/screenshots');
const domain = randomName('quotas').replace(/_\d+_/, '_');
const yaml = `domain: ${domain}
descriptors:
  - key: customer
    rate_limit: {unit: month, requests_per_unit: 5, name: monthly}
    algorithm: fixed_window
    calendar: true
`;

let db: TestDatabase;
let nodeToken = '';
let quotaVersion = 0;
let consoleProc: Proc;
let enforcer: (Proc & { cleanup(): void }) | undefined;
let base: string;
let admin: Client;
let browser: Browser;
let page: Page;
const admitted: Record<string, number> = {};
const problems: string[] = [];

// onVersion waits for the enforcer to apply the quota domain's version.
async function onVersion(): Promise<void> {
  await eventually(
    async () => {
      const { nodes } = await admin.call<{ nodes: { status: string; applied_version: number }[] }>('GET', '/api/v1/nodes');
      if (!nodes.some((n) => n.status === 'connected' && n.applied_version >= quotaVersion)) throw new Error(JSON.stringify(nodes));
    },
    20_000,
    'the enforcer on the quota version',
  );
}

async function hits(value: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const r = await check(enforcer!.addr, domain, [{ key: 'customer', value }]);
    if (r.status === 200) admitted[value] = (admitted[value] ?? 0) + 1;
    else if (r.status !== 429) throw new Error(`check answered ${r.status}: ${JSON.stringify(r.body)}`);
  }
}

beforeAll(async () => {
  mkdirSync(shots, { recursive: true });
  db = await createDatabase();
  const password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  admin.useToken((await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'quotas-e2e-admin', role: 'admin' }, 201)).token);
  const node = await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'quotas-e2e-node', role: 'node' }, 201);
  nodeToken = node.token;
  const { version } = await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml, message: 'A monthly quota', base_version: 0 });
  quotaVersion = version;
  enforcer = await startEnforcer(base, node.token, 'quotas-e2e-1');
  await onVersion();
  await hits('alice', 8); // 5 admitted: the month's quota
  await hits('bob', 2);
  await hits('=HYPERLINK("x")', 1);
  await enforcer.stop(); // sends what it has not sent yet
  enforcer.cleanup();
  enforcer = undefined;

  browser = await launchBrowser();
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 }, colorScheme: 'light' });
  page = await context.newPage();
  await watch(page, problems);
  await signIn(page, base + '/', password);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await enforcer?.stop();
  enforcer?.cleanup();
  await consoleProc?.stop();
  await db?.drop();
});

describe('the Quotas page', () => {
  it('lists the top consumers of the month, most used first, as the enforcer admitted them', async () => {
    expect(admitted).toEqual({ alice: 5, bob: 2, '=HYPERLINK("x")': 1 });
    // The enforcer's shutdown sent its usage; nothing waits for an interval.
    const usage = await admin.call<{ usage: { value: string; used: number }[] }>('GET', `/api/v1/quotas?domain=${domain}`);
    expect(usage.usage.map((u) => `${u.value}:${u.used}`)).toEqual(['alice:5', 'bob:2', '=HYPERLINK("x"):1']);

    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Quotas', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Quotas' }).waitFor();
    await page.getByLabel('Domain', { exact: true }).fill(domain);
    await page.getByRole('button', { name: 'Show', exact: true }).click();
    await page.waitForURL(new RegExp(`/quotas\\?domain=${domain}`));
    const rows = page.getByTestId('quotas').locator('tbody tr');
    await expect.poll(() => rows.count()).toBe(3);
    await expect(rows.nth(0).innerText()).resolves.toMatch(/alice\s+\S+\s+monthly\s+month \d{4}-\d{2}-01\s+5\s+5/);
    await expect(rows.nth(1).innerText()).resolves.toMatch(/bob[\s\S]*\b2\s+5/);
    await page.screenshot({ path: join(shots, '40-quotas-top.png'), fullPage: true });
  });

  it('shows one value against its limit', async () => {
    await page.getByRole('button', { name: 'Show alice against its limit' }).click();
    const meter = page.getByTestId('quota-value').getByRole('meter');
    await expect(meter.getAttribute('aria-valuetext')).resolves.toBe('5 of 5 (100 %)');
    await page.getByLabel('Value', { exact: true }).fill('bob');
    await page.getByRole('button', { name: 'Show', exact: true }).click();
    await expect.poll(() => page.getByTestId('quota-value').getByTestId('usage-label').innerText()).toBe('2 of 5 (40 %)');
    await expect(page.getByTestId('quota-value').locator('.bar span').evaluate((el) => (el as HTMLElement).style.width)).resolves.toBe('40%');
    await page.screenshot({ path: join(shots, '41-quotas-value.png'), fullPage: true });
  });

  it('downloads the CSV export, formulas defused', async () => {
    const href = await page.getByTestId('quotas-csv').getAttribute('href');
    expect(href).toContain('format=csv');
    expect(href).not.toContain('value=');
    const csv = await page.evaluate(async (u) => (await fetch(u!, { credentials: 'same-origin' })).text(), href);
    const lines = csv.trim().split('\n');
    expect(lines[0]).toBe('domain,rule,unit,value,period_start,period_end,used,limit');
    expect(lines.slice(1).map((l) => l.split(',')[3])).toEqual(['"\'=HYPERLINK(""x"")"', 'alice', 'bob']);
    expect(csv).toMatch(new RegExp(`${domain},monthly,month,alice,\\d{4}-\\d{2}-01T00:00:00Z,\\d{4}-\\d{2}-01T00:00:00Z,5,5`));
  });

  it('explains a bad period before asking the console', async () => {
    await page.getByLabel('Period', { exact: true }).fill('2026-13');
    await expect(page.locator('#period-help').innerText()).resolves.toContain('The month must be 01 to 12.');
    await expect(page.getByRole('button', { name: 'Show', exact: true }).isDisabled()).resolves.toBe(true);
    await page.getByLabel('Period', { exact: true }).fill('2026-W49');
    await expect(page.getByRole('button', { name: 'Show', exact: true }).isDisabled()).resolves.toBe(false);
    expect(problems).toEqual([]);
  });

  it('loses at most its last report interval when the enforcer binary is SIGKILLed between reports', async () => {
    enforcer = await startEnforcer(base, nodeToken, 'quotas-e2e-1');
    await onVersion();
    const used = async () => {
      const out = await admin.call<{ usage: { used: number }[] }>('GET', `/api/v1/quotas?domain=${domain}&value=dave`);
      return out.usage[0]?.used ?? 0;
    };
    await hits('dave', 3);
    // The node reports every 10 s: wait for the report that holds them.
    await eventually(async () => expect(await used()).toBe(3), 25_000, 'dave\'s first 3 hits in the console');
    await hits('dave', 2); // admitted right after a report: not reported yet
    enforcer.child.kill('SIGKILL');
    await new Promise((r) => enforcer!.child.once('exit', r));
    enforcer.cleanup();
    enforcer = undefined;
    await eventually(
      async () => {
        const { nodes } = await admin.call<{ nodes: { id: string; status: string }[] }>('GET', '/api/v1/nodes');
        expect(nodes.find((n) => n.id === 'quotas-e2e-1')?.status).toBe('disconnected');
      },
      20_000,
      'the console to see the killed node gone',
    );
    const after = await used();
    expect(admitted.dave).toBe(5);
    expect(after).toBeGreaterThanOrEqual(3); // what was reported stays
    expect(after).toBeLessThanOrEqual(5); // never more than admitted
  });
});
