// The impact preview in the publish dialog end to end: a real
// console and Postgres, headless Chromium. The last hour of per-value
// traffic is seeded as the rows nodes' reports become (preview_spans: the
// Go tests run real enforcers through them); the editor lowers two limits
// and adds one, and the publish dialog shows, per limit, what it would have
// limited beside what was, the distinct values, the "estimate" badge of the
// token bucket, a chart, and that the new limit cannot be previewed.
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  createDatabase,
  launchBrowser,
  randomName,
  secret,
  signIn,
  startConsole,
  watch,
  type Proc,
  type TestDatabase,
} from './harness';

const domain = randomName('preview').replace(/_\d+_/, '_');
const yaml = (limit: number, extra = '') => `domain: ${domain}
descriptors:
  - key: api_key
    algorithm: fixed_window
    rate_limit: {unit: minute, requests_per_unit: ${limit}, name: per-key}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: ${limit}, name: per-tenant}
${extra}`;

let db: TestDatabase;
let consoleProc: Proc;
let base: string;
let page: Page;
let browser: Browser;
const problems: string[] = [];

beforeAll(async () => {
  db = await createDatabase();
  const password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  const admin = new Client(base);
  await admin.login('admin', password);
  await admin.call('PUT', `/api/v1/domains/${domain}`, { yaml: yaml(100), message: 'Seed the preview domain', base_version: 0 });
  // Three minutes of traffic per rule: values with 30, 20 and 5 hits a
  // minute (counts below 32 sit in exact buckets), none limited at 100.
  const now = Math.floor(Date.now() / 1000);
  const payload = JSON.stringify({ requests: 55, limited: 0, span: [[5, 1, 5], [20, 1, 20], [30, 1, 30]] });
  for (const rule of ['per-key', 'per-tenant']) {
    for (let m = 1; m <= 3; m++) {
      const t = now - (now % 60) - 60 * m;
      await db.sql(`INSERT INTO preview_spans (domain, rule, t, span_s, payload) VALUES ('${domain}', '${rule}', ${t}, 60, '${payload}')`);
    }
  }

  browser = await launchBrowser();
  page = await (await browser.newContext({ viewport: { width: 1366, height: 900 } })).newPage();
  await watch(page, problems);
  await signIn(page, base + '/', password);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await consoleProc?.stop();
  await db?.drop();
});

describe('the publish dialog', () => {
  it('previews each changed limit against the last hour', async () => {
    await page.goto(`${base}/domains/${domain}`);
    await page.getByRole('tab', { name: 'YAML' }).click();
    await page.locator('.cm-content').click();
    await page.keyboard.press('Control+a');
    await page.keyboard.insertText(yaml(10, '  - key: fresh\n    rate_limit: {unit: second, requests_per_unit: 1}\n'));
    await page.getByRole('button', { name: 'Review and publish…' }).click();
    const dialog = page.getByRole('dialog', { name: `Publish ${domain}` });
    await dialog.waitFor();
    const preview = dialog.getByTestId('impact-preview');

    // A limit of 10 a minute would have limited 20 + 10 a minute of 55,
    // from two values; nothing was limited at 100.
    const perKey = preview.locator('[data-limit="per-key"]');
    await perKey.getByTestId('impact-summary').waitFor();
    await expect(perKey.getByTestId('impact-summary').innerText()).resolves.toBe(
      'Over the last 3 minutes with traffic, 90 of 165 requests would have been limited (0 actually were); at most 2 distinct values would have hit it in one minute.',
    );
    await expect(perKey.getByTestId('impact-values').innerText()).resolves.toBe('2');
    await expect(perKey.getByTestId('estimate').count()).resolves.toBe(0);
    // The chart: uPlot's canvas, drawn beside the per-minute table.
    await perKey.locator('.impact-chart canvas').first().waitFor();
    await expect(perKey.locator('.impact-chart').evaluate((el) => ({ ...(el as HTMLElement).dataset }))).resolves.toEqual({
      limitedSum: '0',
      wouldSum: '90',
    });
    await perKey.locator('summary').click();
    await expect(perKey.locator('tbody tr').count()).resolves.toBe(3);

    // A token bucket is replayed as an estimate, and says so.
    const perTenant = preview.locator('[data-limit="per-tenant"]');
    await perTenant.getByTestId('estimate').waitFor();
    await expect(perTenant.getByTestId('impact-summary').innerText()).resolves.toContain('90 of 165 requests');

    // A new limit has no traffic to replay: no invented numbers.
    const fresh = preview.locator('[data-limit="fresh"]');
    await fresh.getByTestId('not-previewable').waitFor();
    await expect(fresh.getByTestId('impact-summary').innerText()).resolves.toMatch(/no rule counts this descriptor/);
    await expect(fresh.locator('canvas').count()).resolves.toBe(0);
    expect(problems).toEqual([]);
  });
});
