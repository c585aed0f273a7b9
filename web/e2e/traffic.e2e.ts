// The Live traffic page end to end (issue 14): a real console and enforcer,
// checks through the enforcer's /json so that one hot key gets 429s, and
// headless Chromium watching the page: the chart's 429 series goes above
// zero (read from the data given to uPlot and from the text summary, not
// from pixels), a publish made meanwhile shows as a marker with its
// details, the hot key heads the most-limited table, and the switch to
// history draws the per-minute rollups.
import { mkdirSync } from 'node:fs';
import { createServer } from 'node:http';
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
const domain = randomName('traffic').replace(/_\d+_/, '_');
const yaml = (perMinute: number) => `domain: ${domain}
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: ${perMinute}, name: per-key}
  - key: route
    value: /search
    rate_limit: {unit: minute, requests_per_unit: 2, name: search}
    shadow_mode: true
`;

let db: TestDatabase;
let consoleProc: Proc;
let enforcer: Proc & { cleanup(): void };
let base: string;
let admin: Client;
let password: string;
let browser: Browser;
let page: Page;
let version = 0;
let sent = { allowed: 0, limited: 0, route: 0 };
const problems: string[] = [];

interface ChartData {
  ready?: string;
  points?: string;
  limitedSum?: string;
  limitedMax?: string;
  allowedSum?: string;
  shadowSum?: string;
  markers?: string;
}

async function chartData(): Promise<ChartData> {
  return page.getByTestId('traffic-chart').evaluate((el) => ({ ...(el as HTMLElement).dataset }));
}

async function acked(v: number): Promise<void> {
  await eventually(
    async () => {
      const { nodes } = await admin.call<{ nodes: { status: string; applied_version: number }[] }>('GET', '/api/v1/nodes');
      if (!nodes.some((n) => n.status === 'connected' && n.applied_version >= v)) throw new Error(JSON.stringify(nodes));
    },
    20_000,
    `the enforcer on version ${v}`,
  );
}

// traffic sends n checks for one API key (and the shadow-limited route) and counts the answers.
async function traffic(key: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const r = await check(enforcer.addr, domain, [{ key: 'api_key', value: key }]);
    if (r.status === 429) sent.limited++;
    else if (r.status === 200) sent.allowed++;
    else throw new Error(`check answered ${r.status}: ${JSON.stringify(r.body)}`);
    await check(enforcer.addr, domain, [{ key: 'route', value: '/search' }]);
    sent.route++;
  }
}

beforeAll(async () => {
  mkdirSync(shots, { recursive: true });
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  admin.useToken((await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'traffic-e2e-admin', role: 'admin' }, 201)).token);
  const node = await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'traffic-e2e-node', role: 'node' }, 201);
  version = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(5), message: 'Seed the traffic domain', base_version: 0 })).version;
  enforcer = await startEnforcer(base, node.token, 'traffic-e2e-1');
  await acked(version);

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

describe('the Live traffic page', () => {
  it('draws a non-zero 429 series within seconds of traffic, and lists the hot key', async () => {
    await page.goto(`${base}/traffic?domain=${domain}`);
    await page.getByRole('heading', { level: 1, name: 'Live traffic' }).waitFor();
    await page.getByTestId('connection').filter({ hasText: 'live' }).waitFor({ timeout: 10_000 });
    await expect(page.getByLabel('Domain', { exact: true }).inputValue()).resolves.toBe(domain);

    await traffic('hot-key', 25); // 5 a minute: 5 allowed, 20 limited
    await traffic('calm-key', 3);
    expect(sent.limited).toBeGreaterThanOrEqual(20);

    await eventually(
      async () => {
        const d = await chartData();
        // Every answer sent, in whatever second's tick it arrives: the last
        // checks' allowed counts may come a tick after the 429s.
        const answered = Number(d.limitedSum) + Number(d.allowedSum) + Number(d.shadowSum);
        if (d.ready !== 'true' || Number(d.limitedSum) < sent.limited || answered < sent.limited + sent.allowed + sent.route)
          throw new Error(`chart data ${JSON.stringify(d)}, sent ${JSON.stringify(sent)}`);
      },
      10_000,
      'the series to reach every check sent',
    );
    const d = await chartData();
    expect(Number(d.points)).toBe(900); // 15 minutes at 1 s, zeros filled in
    expect(Number(d.limitedSum)).toBe(sent.limited);
    // The domain's view sums its rules: the shadow-mode route allows 2 a minute and would have limited the rest.
    expect(Number(d.shadowSum)).toBeGreaterThan(0);
    expect(Number(d.allowedSum)).toBe(sent.allowed + sent.route - Number(d.shadowSum));
    expect(Number(d.limitedMax)).toBeGreaterThan(0);
    expect(await page.locator('[data-testid=traffic-chart] canvas').count()).toBeGreaterThan(0);

    const summary = page.getByTestId('traffic-summary');
    await expect(summary.getByTestId('limited-total').innerText()).resolves.toContain(`${sent.limited} limited of ${sent.limited + Number(d.allowedSum)}`);
    expect(Number((await summary.getByTestId('limited-peak').innerText()).split(' ')[0])).toBeGreaterThan(0);

    const top = page.getByTestId('top-limited');
    await top.waitFor();
    const first = top.locator('tbody tr').first();
    await expect(first.innerText()).resolves.toMatch(/hot-key\s+per-key\s+20\b/);
    await expect(page.getByTestId('per-rule').innerText()).resolves.toMatch(/per-key/);
    await page.screenshot({ path: join(shots, '30-traffic-live.png'), fullPage: true });
  });

  it('shows a publish made meanwhile as a marker with its version, author, message and diff link', async () => {
    const message = 'Raise the per-key limit to 50 a minute';
    version = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(50), message, base_version: version })).version;
    const marker = page.locator(`[data-testid=marker][data-version="${version}"]`);
    await marker.waitFor({ timeout: 10_000 });
    await expect(marker.getAttribute('aria-label')).resolves.toContain(`version ${version}`);
    await marker.focus();
    const pop = page.locator(`#${await marker.getAttribute('aria-controls')}`);
    await pop.waitFor({ state: 'visible' });
    const text = await pop.innerText();
    expect(text).toContain(`version ${version}`);
    expect(text).toContain('admin');
    expect(text).toContain(message);
    await expect(pop.getByRole('link').getAttribute('href')).resolves.toBe(`/history/diff/${version - 1}/${version}`);
    await expect(page.getByTestId('markers').innerText()).resolves.toContain(message);
    await page.screenshot({ path: join(shots, '31-traffic-marker.png'), fullPage: true });
    await page.keyboard.press('Escape');
    await pop.waitFor({ state: 'hidden' });
  });

  it('picks a rule, and keeps the choice in the URL', async () => {
    await page.getByLabel('Rule', { exact: true }).selectOption('search');
    await page.waitForURL(/rule=search/);
    await eventually(async () => {
      const d = await chartData();
      if (Number(d.limitedSum) !== 0 || Number(d.shadowSum) === 0) throw new Error(JSON.stringify(d));
    }, 5_000, 'the shadow rule alone: would-limit, no 429');
    await page.getByLabel('Rule', { exact: true }).selectOption('');
    await page.waitForURL((u) => !u.searchParams.has('rule'));
  });

  it('switches to history and draws the per-minute rollups', async () => {
    // The current minute is rolled up once it is over: wait for the rollup.
    await eventually(
      async () => {
        const to = new Date().toISOString();
        const from = new Date(Date.now() - 3600_000).toISOString();
        const h = await admin.call<{ rules: { rule: string; points: { limited: number }[] }[] }>(
          'GET',
          `/api/v1/stats/history?domain=${domain}&from=${from}&to=${to}&step=60`,
        );
        const limited = h.rules.flatMap((r) => r.points).reduce((a, p) => a + p.limited, 0);
        if (limited < sent.limited) throw new Error(`history has ${limited} limited of ${sent.limited}`);
      },
      100_000,
      'the rollup of the traffic',
    );
    await page.getByRole('radio', { name: '1 h' }).check();
    await page.waitForURL(/range=1h/);
    await page.getByRole('heading', { name: /^Decisions per second of .*, the last 1 h$/ }).waitFor();
    await eventually(
      async () => {
        const d = await chartData();
        if (d.ready !== 'true' || Number(d.points) !== 60 && Number(d.points) !== 61) throw new Error(JSON.stringify(d));
        // Rates per second in buckets of 60 s: the sum of the 429/s columns times 60 is the count.
        if (Math.round(Number(d.limitedSum) * 60) !== sent.limited) throw new Error(`${JSON.stringify(d)} of ${sent.limited}`);
      },
      10_000,
      'the history chart',
    );
    await expect(page.getByTestId('limited-total').innerText()).resolves.toContain(`${sent.limited} limited`);
    await page.screenshot({ path: join(shots, '32-traffic-history.png'), fullPage: true });

    // The longer ranges ask for steps that keep the points few.
    for (const [label, points] of [
      ['7 d', 7 * 24 * 6],
      ['30 d', 30 * 24],
    ] as const) {
      await page.getByRole('radio', { name: label }).check();
      await eventually(
        async () => {
          const d = await chartData();
          if (Math.abs(Number(d.points) - points) > 1) throw new Error(`${label}: ${JSON.stringify(d)}`);
        },
        10_000,
        `the ${label} chart`,
      );
    }
    await page.getByRole('radio', { name: 'Live (15 min)' }).check();
    await page.waitForURL((u) => !u.searchParams.has('range'));
    await page.getByTestId('connection').filter({ hasText: 'live' }).waitFor({ timeout: 10_000 });
  }, 150_000);

  it('links the Domains page sparkline to the traffic of its domain', async () => {
    await page.goto(`${base}/domains`);
    const row = page.locator('tr', { has: page.getByRole('link', { name: domain, exact: true }) });
    const spark = row.getByTestId('sparkline');
    await spark.waitFor();
    await expect(spark.getAttribute('href')).resolves.toBe(`/traffic?domain=${domain}`);
    await expect(spark.getAttribute('aria-label')).resolves.toMatch(/429s at [\d.,]+\/s now, peak [1-9]/);
    await spark.click();
    await page.getByRole('heading', { level: 1, name: 'Live traffic' }).waitFor();
    expect(new URL(page.url()).searchParams.get('domain')).toBe(domain);
  });

  it('lets an admin add a webhook, send it a test alert and see it delivered, and confirms removing it', async () => {
    const received: { event?: string; text?: string }[] = [];
    const hook = createServer((req, res) => {
      let body = '';
      req.on('data', (b: Buffer) => (body += b.toString()));
      req.on('end', () => {
        received.push(JSON.parse(body) as { event?: string; text?: string });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((r) => hook.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(hook.address() as { port: number }).port}/hook`;
    try {
      await page.getByRole('link', { name: 'Alerts' }).click();
      await page.getByRole('heading', { level: 1, name: 'Alerts' }).waitFor();
      await page.getByRole('button', { name: 'Add a webhook' }).click();
      await page.getByLabel('Webhook URL 1').fill(url);
      await page.getByRole('button', { name: 'Add a domain override' }).click();
      await page.getByLabel('Factor of').fill('4');
      await page.getByRole('button', { name: 'Save', exact: true }).click();
      await page.getByText('Saved the alert settings.').waitFor();
      const saved = await admin.call<{ webhooks: { url: string; events: string[] }[]; domains: Record<string, { factor?: number }> }>('GET', '/api/v1/alerts');
      expect(saved.webhooks).toEqual([{ url, events: ['spike.start', 'spike.end'] }]);
      expect(Object.values(saved.domains)[0]?.factor).toBe(4);

      await page.getByRole('button', { name: 'Send a test alert' }).click();
      await page.getByText(/Queued a test alert to 1 webhook/).waitFor();
      await eventually(async () => expect(received.length).toBeGreaterThan(0), 15_000, 'the test alert at the webhook');
      expect(typeof received[0].text).toBe('string');
      await eventually(
        async () => {
          await page.getByRole('button', { name: 'Refresh' }).click();
          await page.getByTestId('deliveries').locator('tr', { hasText: 'delivered' }).first().waitFor({ timeout: 1000 });
        },
        15_000,
        'the delivery shown as delivered',
      );
      await page.screenshot({ path: join(shots, '33-alerts.png'), fullPage: true });

      await page.getByRole('button', { name: 'Remove webhook 1' }).click();
      await page.getByRole('button', { name: 'Save', exact: true }).click();
      const dialog = page.getByRole('dialog', { name: 'Stop alerting these webhooks?' });
      await dialog.getByText(url).waitFor();
      await dialog.getByRole('button', { name: 'Save and remove' }).click();
      await page.getByTestId('unsaved').waitFor({ state: 'detached' });
      expect((await admin.call<{ webhooks: unknown[] }>('GET', '/api/v1/alerts')).webhooks).toEqual([]);
    } finally {
      hook.close();
    }
  });

  it('logged no CSP violation and no uncaught error', () => {
    expect(problems).toEqual([]);
  });
});
