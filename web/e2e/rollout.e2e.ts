// Staged rollout end to end: a real console and two enforcers,
// one started with --labels canary=true. In headless Chromium an editor
// lowers a limit in the form and publishes it staged to canary=true from
// the publish dialog; only the canary enforces it (checks through /json);
// the version's page shows the canary's 429 rate against the other node's,
// and its Promote button sends the version to both.
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  check,
  Client,
  createDatabase,
  eventually,
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

const domain = randomName('rollout').replace(/_\d+_/, '_');
const yaml = (n: number) => `domain: ${domain}
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: ${n}, name: per-user}
`;

let db: TestDatabase;
let consoleProc: Proc;
let canary: Proc & { cleanup(): void };
let plain: Proc & { cleanup(): void };
let base: string;
let admin: Client;
let password: string;
let browser: Browser;
let page: Page;
let v1 = 0;
let v2 = 0;
const problems: string[] = [];

const status = async (node: Proc, user: string) => (await check(node.addr, domain, [{ key: 'user', value: user }])).status;

async function enforces(node: Proc, want: number): Promise<void> {
  await eventually(
    async () => {
      const got = await status(node, 'probe');
      if (got !== want) throw new Error(`answered ${got}`);
    },
    20_000,
    `${want} from an enforcer`,
  );
}

beforeAll(async () => {
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  admin.useToken((await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'rollout-admin', role: 'admin' }, 201)).token);
  const nodeToken = async (id: string) => (await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: id, role: 'node' }, 201)).token;
  // Two probes' worth of requests per user: "probe" stays allowed on v1 and is limited at 0.
  v1 = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(1000000), message: 'open', base_version: 0 })).version;
  [canary, plain] = await Promise.all([
    startEnforcer(base, await nodeToken('canary-node'), 'canary-node', ['--labels', 'canary=true,zone=a']),
    startEnforcer(base, await nodeToken('plain-node'), 'plain-node', ['--labels', 'zone=a']),
  ]);
  await enforces(canary, 200);
  await enforces(plain, 200);

  browser = await launchBrowser();
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  page = await context.newPage();
  await watch(page, problems);
  await signIn(page, base + '/', password);
});

afterAll(async () => {
  await browser?.close();
  await Promise.all([canary?.stop(), plain?.stop()]);
  canary?.cleanup();
  plain?.cleanup();
  await consoleProc?.stop();
  await db?.drop();
});

describe('staged rollout', () => {
  it('publishes a lower limit staged to canary=true from the publish dialog', async () => {
    await page.goto(`${base}/domains/${domain}`);
    await page.getByRole('tab', { name: 'Form' }).waitFor();
    await page.getByLabel('Requests per unit').first().fill('0');
    await page.getByTestId('unsaved').waitFor();
    await page.getByRole('button', { name: 'Review and publish…' }).click();
    const dialog = page.getByRole('dialog', { name: `Publish ${domain}` });
    await dialog.getByLabel(/Change message/).fill('Close the door, canary first');
    // A bad selector is refused in the dialog, with the reason.
    await dialog.getByLabel(/Stage to nodes labelled/).fill('canary');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await dialog.getByRole('alert').filter({ hasText: 'not key=value' }).waitFor();
    await dialog.getByLabel(/Stage to nodes labelled/).fill('canary=true');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await page.waitForURL(/\/history\/diff\/\d+\/\d+$/);
    v2 = Number(page.url().split('/').pop());
    expect(v2).toBe(v1 + 1);
    await expect(page.getByTestId('rollout-state').innerText()).resolves.toBe('staged to canary=true');

    await enforces(canary, 429);
    // The other node was sent nothing: it still enforces v1.
    expect(await status(plain, 'probe')).toBe(200);
    const { nodes } = await admin.call<{ nodes: { id: string; applied_version: number; labels: Record<string, string> }[] }>('GET', '/api/v1/nodes');
    const byID = new Map(nodes.map((n) => [n.id, n]));
    expect(byID.get('canary-node')?.applied_version).toBe(v2);
    expect(byID.get('plain-node')?.applied_version).toBe(v1);
    expect(byID.get('canary-node')?.labels).toEqual({ canary: 'true', zone: 'a' });
  });

  it('shows the canary’s 429 rate against the other node’s', async () => {
    // Traffic on both nodes until the page has counted some of each.
    await eventually(
      async () => {
        for (let i = 0; i < 20; i++) await Promise.all([status(canary, `u${i}`), status(plain, `u${i}`)]);
        const canaryRate = await page.getByTestId('canary-rate').innerText();
        const restRate = await page.getByTestId('rest-rate').innerText();
        if (canaryRate !== '100%' || restRate !== '0%') throw new Error(`canary ${canaryRate}, rest ${restRate}`);
        // The chart draws both lines once each has two seconds (a flat line
        // at 100% has no height, so it is checked as drawn, not as visible).
        const canaryPath = (await page.locator('[data-testid=rollout-panel] svg path.canary').getAttribute('d')) ?? '';
        const restPath = (await page.locator('[data-testid=rollout-panel] svg path.rest').getAttribute('d')) ?? '';
        if (!/^M[\d.]+,0\.0L/.test(canaryPath) || !/^M[\d.]+,140\.0L/.test(restPath)) throw new Error(`paths ${canaryPath} / ${restPath}`);
      },
      30_000,
      'the cohort rates and both lines on the version page',
    );
  });

  it('promotes from the history: the Promote button sends the version to every node', async () => {
    await page.goto(`${base}/history`);
    const row = page.locator(`tr[data-version="${v2}"]`);
    await expect(row.getByTestId('staged').innerText()).resolves.toBe('staged to canary=true');
    await row.getByRole('link', { name: 'Canary and promote' }).click();
    await page.getByTestId('rollout-panel').waitFor();
    await page.getByRole('button', { name: 'Promote to every node…' }).click();
    const dialog = page.getByRole('dialog', { name: `Promote version ${v2}` });
    await dialog.getByLabel(/Message/).fill('The canary looks right');
    await dialog.getByRole('button', { name: 'Promote', exact: true }).click();
    await dialog.waitFor({ state: 'hidden' });
    await page.getByTestId('rollout-state').filter({ hasText: 'promoted to every node' }).waitFor();
    await expect(page.getByRole('button', { name: 'Promote to every node…' }).count()).resolves.toBe(0);

    await enforces(plain, 429);
    expect(await status(canary, 'probe')).toBe(429);
    const audit = await admin.call<{ events: { action: string; message: string }[] }>('GET', '/api/v1/audit?action=version.promote');
    expect(audit.events.map((e) => e.message)).toContain('The canary looks right');
    const { version } = await admin.call<{ version: { rollout: { state: string } } }>('GET', `/api/v1/versions/${v2}`);
    expect(version.rollout.state).toBe('promoted');
    expect(problems).toEqual([]);
  });
});
