// The console UI end to end: a member of staff lowers a limit in the form,
// publishes it, watches every enforcer ack it, sees the enforcers apply it,
// and rolls it back — plus session expiry, a publish conflict, server
// errors inline in the YAML view, XSS and CSRF probes, and a screenshot of
// every page (web/e2e/screenshots, git-ignored; look at them).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, BrowserContext, Locator, Page } from 'playwright-core';
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
  startConsole,
  startEnforcer,
  type Proc,
  type TestDatabase,
} from './harness';

const shots = join(repo, 'web/e2e/screenshots');
const domain = randomName('e2e').replace(/_\d+_/, '_');
const other = `${domain}_checkout`;
const seed = `# Limits for the e2e API.
domain: ${domain}
descriptors:
  - key: user # one counter per user
    rate_limit: {unit: hour, requests_per_unit: 100, name: per-user}
  - key: route
    value: /search
    rate_limit: {unit: minute, requests_per_unit: 50}
    shadow_mode: true
`;

let db: TestDatabase;
let consoleProc: Proc;
let enforcers: (Proc & { cleanup(): void })[] = [];
let base: string;
let admin: Client;
let adminSecret = '';
let password: string;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let seedVersion = 0;
let loweredVersion = 0;
const problems: string[] = [];

interface NodeRow {
  id: string;
  applied_version: number;
  status: string;
}

async function allAcked(version: number): Promise<void> {
  await eventually(
    async () => {
      const { nodes } = await admin.call<{ nodes: NodeRow[] }>('GET', '/api/v1/nodes');
      const ok = nodes.filter((n) => n.status === 'connected' && n.applied_version >= version);
      if (ok.length !== enforcers.length) throw new Error(`${ok.length} of ${enforcers.length} nodes on v${version}: ${JSON.stringify(nodes)}`);
    },
    20_000,
    `every node on version ${version}`,
  );
}

// limitOn asks every enforcer for the user limit until all report want.
async function limitOn(want: number): Promise<void> {
  for (const e of enforcers) {
    await eventually(
      async () => {
        const r = await check(e.addr, domain, [{ key: 'user', value: `u-${secret()}` }]);
        if (r.limit !== want) throw new Error(`enforcer ${e.addr} limit ${String(r.limit)}: ${JSON.stringify(r.body)}`);
      },
      10_000,
      `limit ${want} on ${e.addr}`,
    );
  }
}

async function shot(name: string): Promise<void> {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

// labelled checks that every visible form control has an accessible name.
async function labelled(where: string): Promise<void> {
  const unnamed = await page.evaluate(() => {
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
  expect(unnamed, `unlabelled controls on ${where}`).toEqual([]);
}

// readable checks WCAG AA contrast of every visible text against the
// background it is drawn on: 4.5:1, or 3:1 for large text (24px, or 18.66px
// bold). Disabled controls are exempt, as WCAG allows.
async function readable(where: string): Promise<void> {
  const low = await page.evaluate(() => {
    type RGBA = [number, number, number, number];
    const parse = (c: string): RGBA => {
      const m = c.match(/rgba?\(([^)]+)\)/);
      if (!m) return [0, 0, 0, 0];
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const over = (top: RGBA, bottom: RGBA): RGBA => {
      const a = top[3] + bottom[3] * (1 - top[3]);
      if (a === 0) return [0, 0, 0, 0];
      const mix = (i: number) => (top[i] * top[3] + bottom[i] * bottom[3] * (1 - top[3])) / a;
      return [mix(0), mix(1), mix(2), a];
    };
    const background = (el: Element | null): RGBA => {
      const layers: RGBA[] = [];
      for (let e = el; e; e = e.parentElement ?? ((e.getRootNode() as ShadowRoot).host ?? null)) {
        const c = parse(getComputedStyle(e).backgroundColor);
        if (c[3] > 0) layers.push(c);
        if (c[3] >= 1) break;
      }
      let out: RGBA = [255, 255, 255, 1];
      for (const l of layers.reverse()) out = over(l, out);
      return out;
    };
    const lum = (c: RGBA) => {
      const ch = (v: number) => {
        const s = v / 255;
        return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * ch(c[0]) + 0.7152 * ch(c[1]) + 0.0722 * ch(c[2]);
    };
    const out: string[] = [];
    const visit = (root: Document | ShadowRoot) => {
      for (const el of root.querySelectorAll<HTMLElement>('*')) {
        if (el.shadowRoot) visit(el.shadowRoot);
        const text = [...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent?.trim());
        if (!text || el.closest('[disabled], [aria-hidden="true"], .visually-hidden')) continue;
        const st = getComputedStyle(el);
        const r = el.getBoundingClientRect();
        if (st.visibility === 'hidden' || r.width === 0 || r.height === 0) continue;
        const bg = background(el);
        const fg = over(parse(st.color), bg);
        const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
        const ratio = (hi + 0.05) / (lo + 0.05);
        const size = parseFloat(st.fontSize);
        const large = size >= 24 || (size >= 18.66 && Number(st.fontWeight) >= 700);
        if (ratio < (large ? 3 : 4.5)) out.push(`${ratio.toFixed(2)} ${el.tagName}.${el.className} "${el.textContent?.trim().slice(0, 30)}"`);
      }
    };
    visit(document);
    return out;
  });
  expect(low, `low-contrast text on ${where}`).toEqual([]);
}

async function go(path: string, heading: string | RegExp): Promise<void> {
  await page.goto(base + path);
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

function descriptor(key: string): Locator {
  return page.locator('fieldset[data-testid=descriptor]').filter({ has: page.locator(`legend:text-matches("^${key}")`) }).first();
}

async function openPublish(): Promise<Locator> {
  await page.getByRole('button', { name: 'Review and publish…' }).click();
  const dialog = page.getByRole('dialog', { name: `Publish ${domain}` });
  await dialog.waitFor();
  return dialog;
}

async function publishWith(message: string): Promise<number> {
  const dialog = await openPublish();
  await dialog.getByLabel(/Change message/).fill(message);
  await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
  await page.waitForURL(/\/history\?highlight=\d+/);
  return Number(new URL(page.url()).searchParams.get('highlight'));
}

/** confirm answers the console's confirmation dialog (it never uses window.confirm). */
async function confirm(title: string, action: string): Promise<void> {
  const dialog = page.getByRole('dialog', { name: title });
  await dialog.getByRole('button', { name: action, exact: true }).click();
  await dialog.waitFor({ state: 'hidden' });
}

async function editorText(): Promise<string> {
  return page.locator('.cm-content').innerText();
}

async function replaceEditorText(text: string): Promise<void> {
  await page.locator('.cm-content').click();
  await page.keyboard.press('Control+a');
  await page.keyboard.insertText(text);
}

beforeAll(async () => {
  mkdirSync(shots, { recursive: true });
  db = await createDatabase();
  password = secret();
  consoleProc = await startConsole(db.url, password);
  base = `http://${consoleProc.addr}`;
  admin = new Client(base);
  await admin.login('admin', password);
  // Setup and probes use a token, so that ending the browser's session
  // (the expiry test) leaves them working.
  adminSecret = (await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: 'ui-e2e-admin', role: 'admin' }, 201)).token;
  admin.useToken(adminSecret);
  // One node token per node: a token is bound to the node id it first connects with.
  const nodeToken = async (id: string) => (await admin.call<{ token: string }>('POST', '/api/v1/tokens', { name: id, role: 'node' }, 201)).token;
  const tokens = [await nodeToken('ui-e2e-1'), await nodeToken('ui-e2e-2')];
  seedVersion = (await admin.call<{ version: number }>('PUT', `/api/v1/domains/${domain}`, { yaml: seed, message: 'Seed the e2e domain', base_version: 0 }))
    .version;
  await admin.call('PUT', `/api/v1/domains/${other}`, {
    yaml: `domain: ${other}\ndescriptors:\n  - key: plan\n    value: free\n    rate_limit: {unit: day, requests_per_unit: 10000}\n`,
    message: 'Checkout quotas',
    base_version: 0,
  });
  seedVersion += 1;
  // The domain under test was seeded first; the checkout publish came after.
  enforcers = await Promise.all([startEnforcer(base, tokens[0], 'ui-e2e-1', ['--region', 'eu-west']), startEnforcer(base, tokens[1], 'ui-e2e-2')]);
  await allAcked(seedVersion);

  browser = await launchBrowser();
  context = await browser.newContext({ viewport: { width: 1366, height: 800 }, colorScheme: 'light' });
  page = await context.newPage();
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    const text = msg.text();
    // Chrome logs each violation twice: its own message, and ours below.
    if (/securitypolicyviolation/.test(text) && !/editor-native/.test(text)) problems.push(`CSP: ${text}`);
  });
  // Confirmations are the console's own dialog; a native one is a regression.
  page.on('dialog', (d) => {
    problems.push(`native ${d.type()} dialog: ${d.message()}`);
    void d.dismiss();
  });
  // Report every CSP violation with where it happened (Playwright's init
  // scripts are not subject to the page's CSP). One kind is the browser's,
  // not ours: typing over selected text in a contenteditable makes Chrome's
  // editing engine wrap the new text in <span style="color: ..."> to keep
  // the old text's colour. CSP blocks that attribute (so it is harmless) and
  // CodeMirror redraws the line; that is reported with "editor-native".
  // (Checked: the blocked attribute's hash is that of the comment style,
  // "color: rgb(95, 107, 120); font-style: italic;".)
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      const host = e.target instanceof Element ? e.target.getAttribute('data-testid') : null;
      const native = e.violatedDirective === 'style-src-attr' && e.sourceFile === '' && host === 'yaml-editor';
      console.error(
        `securitypolicyviolation${native ? ' editor-native' : ''}: ${e.violatedDirective} at ${e.sourceFile}:${e.lineNumber} sample=${e.sample} page=${location.pathname} target=${host ?? String(e.target)}`,
      );
    });
  });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await Promise.all(enforcers.map((e) => e.stop()));
  enforcers.forEach((e) => e.cleanup());
  await consoleProc?.stop();
  await db?.drop();
});

describe('the console UI', () => {
  it('signs in and lists the domains with their limits and last change', async () => {
    await page.goto(base + '/');
    await page.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
    await labelled('login');
    await shot('01-login');
    // Keyboard: the first Tab reaches the skip link or the first field.
    await page.getByLabel('Username').fill('admin');
    await page.getByLabel('Password').fill('wrong-password');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').filter({ hasText: /invalid/i }).waitFor();
    await page.getByLabel('Password').fill(password);
    await page.getByLabel('Password').press('Enter');
    await page.getByRole('heading', { level: 1, name: 'Domains' }).waitFor();
    const row = page.locator('tr', { has: page.getByRole('link', { name: domain, exact: true }) });
    await expect(row.innerText()).resolves.toMatch(/user\s+100 \/ hour/);
    await expect(row.innerText()).resolves.toContain('Seed the e2e domain');
    await expect(row.innerText()).resolves.toContain('admin');
    await labelled('domains');
    await readable('domains');
    await shot('02-domains');
  });

  it('lowers a limit in the form, and the YAML view shows the same edit', async () => {
    await page.getByRole('link', { name: domain, exact: true }).click();
    await page.getByRole('tab', { name: 'Form' }).waitFor();
    const user = descriptor('user');
    await expect(user.getByLabel('Requests per unit').inputValue()).resolves.toBe('100');
    await user.getByLabel('Requests per unit').fill('7');
    await page.getByTestId('unsaved').waitFor();
    await labelled('editor (form)');
    await readable('editor (form)');
    await shot('03-editor-form');

    await page.getByRole('tab', { name: 'YAML' }).click();
    await page.locator('.cm-content').waitFor();
    const text = await editorText();
    expect(text).toContain('requests_per_unit: 7');
    expect(text).toContain('# one counter per user'); // comments survive the form
    expect(text).toContain('# Limits for the e2e API.');
    await readable('editor (YAML)');
    await shot('04-editor-yaml');

    await page.getByRole('tab', { name: 'Form' }).click();
    await expect(descriptor('user').getByLabel('Requests per unit').inputValue()).resolves.toBe('7');
  });

  it('keeps the edit when the session ends, and comes back to it after signing in', async () => {
    const dialog = await openPublish();
    await dialog.getByLabel(/Change message/).fill('Lower the per-user limit');
    // The session ends on the server (idle expiry, or an admin revoking it).
    await db.sql('DELETE FROM sessions');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await page.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
    await page.getByText('Your session has ended').waitFor();
    await shot('05-session-expired');
    await page.getByLabel('Username').fill('admin');
    await page.getByLabel('Password').fill(password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText(/Restored your unpublished edit/).waitFor();
    expect(new URL(page.url()).pathname).toBe(`/domains/${domain}`);
    await expect(descriptor('user').getByLabel('Requests per unit').inputValue()).resolves.toBe('7');
  });

  it('publishes with a required message and a diff preview; history shows every node acked', async () => {
    const dialog = await openPublish();
    const diff = await dialog.locator('figure.diff').innerText();
    expect(diff).toMatch(/requests_per_unit: 100/);
    expect(diff).toMatch(/requests_per_unit: 7/);
    expect(diff).toContain('+1 −1');
    await dialog.getByLabel(/Change message/).fill('');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await dialog.getByText('A change message is required.').waitFor();
    await dialog.getByLabel(/Change message/).fill('Lower the per-user limit to 7/hour');
    await labelled('publish dialog');
    await readable('publish dialog');
    await shot('06-publish-dialog');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await page.waitForURL(/\/history\?highlight=\d+/);
    loweredVersion = Number(new URL(page.url()).searchParams.get('highlight'));
    expect(loweredVersion).toBe(seedVersion + 1);

    const row = page.locator(`tr[data-version="${loweredVersion}"]`);
    await expect(row.innerText()).resolves.toContain('Lower the per-user limit to 7/hour');
    await expect(row.innerText()).resolves.toContain('admin');
    await row.getByTestId('rollout').filter({ hasText: `${enforcers.length} of ${enforcers.length}` }).waitFor({ timeout: 15_000 });
    await labelled('history');
    await readable('history');
    await shot('07-history');
  });

  it('the enforcers apply the new limit', async () => {
    await limitOn(7);
  });

  it('compares two versions side by side', async () => {
    await page.locator(`tr[data-version="${loweredVersion}"]`).getByRole('link', { name: 'Diff' }).click();
    await page.getByRole('heading', { level: 1, name: `Version ${loweredVersion - 1} compared with version ${loweredVersion}` }).waitFor();
    const sbs = page.locator('.sbs');
    await expect(sbs.locator('td.delete').first().innerText()).resolves.toContain('requests_per_unit: 100');
    await expect(sbs.locator('td.insert').first().innerText()).resolves.toContain('requests_per_unit: 7');
    await labelled('diff');
    await readable('diff');
    await shot('08-diff');
  });

  it('rolls back with one click after a diff preview, and the enforcers return to the old limit', async () => {
    await go('/history', 'History');
    await page.getByRole('button', { name: `Roll back to v${seedVersion}…` }).click();
    const dialog = page.getByRole('dialog', { name: `Roll back to version ${seedVersion}` });
    await dialog.locator('figure.diff').first().waitFor();
    const diff = await dialog.locator('figure.diff').innerText();
    expect(diff).toContain('requests_per_unit: 7');
    expect(diff).toContain('requests_per_unit: 100');
    // The console's diff, with its structured changes: the browser computes neither.
    expect(diff).toContain('rate_limit.requests_per_unit 7 → 100');
    await expect(dialog.getByLabel(/Change message/).inputValue()).resolves.toBe(`Roll back to version ${seedVersion}`);
    await shot('09-rollback-dialog');
    await dialog.getByRole('button', { name: `Roll back to version ${seedVersion}` }).click();
    await page.waitForURL(/\/history\?highlight=\d+/);
    const v = Number(new URL(page.url()).searchParams.get('highlight'));
    expect(v).toBe(loweredVersion + 1);
    const row = page.locator(`tr[data-version="${v}"]`);
    await expect(row.innerText()).resolves.toContain(`rollback of v${seedVersion}`);
    await row.getByTestId('rollout').filter({ hasText: `${enforcers.length} of ${enforcers.length}` }).waitFor({ timeout: 15_000 });
    await limitOn(100);
  });

  it('shows a 409 conflict and reapplies the edit on the newer version', async () => {
    await go(`/domains/${domain}`, /Domain/);
    await descriptor('user').getByLabel(/Burst/).fill('20');
    // Someone else changes another descriptor of the same domain meanwhile.
    const current = await admin.call<{ yaml: string; version: number; current_version?: number }>('GET', `/api/v1/domains/${domain}`);
    const theirs = current.yaml.replace('requests_per_unit: 50', 'requests_per_unit: 60');
    expect(theirs).not.toBe(current.yaml);
    await admin.call('PUT', `/api/v1/domains/${domain}`, {
      yaml: theirs,
      message: 'Raise the search limit',
      base_version: current.current_version ?? current.version,
    });

    const dialog = await openPublish();
    await dialog.getByLabel(/Change message/).fill('Add a burst to the per-user limit');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    const conflict = dialog.getByTestId('conflict');
    await conflict.waitFor();
    await expect(conflict.innerText()).resolves.toContain('Raise the search limit');
    await shot('10-conflict');
    await conflict.getByRole('button', { name: 'Reload and reapply my changes' }).click();
    await dialog.getByText(/Your changes were reapplied/).waitFor();
    const diff = await dialog.locator('figure.diff').innerText();
    expect(diff).toContain('burst: 20');
    expect(diff).not.toMatch(/^[-+].*requests_per_unit: 60/m); // theirs is kept, not undone
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    await page.waitForURL(/\/history\?highlight=\d+/);
    const latest = await admin.call<{ yaml: string }>('GET', `/api/v1/domains/${domain}`);
    expect(latest.yaml).toContain('burst: 20');
    expect(latest.yaml).toContain('requests_per_unit: 60');
  });

  it('shows the server’s line:column errors inline in the YAML view, and completes from the schema', async () => {
    await go(`/domains/${domain}`, /Domain/);
    await page.getByRole('tab', { name: 'YAML' }).click();
    await page.locator('.cm-content').waitFor();
    const text = await editorText();
    await replaceEditorText(text.replace('unit: hour', 'unit: fortnight'));
    const dialog = await openPublish();
    await dialog.getByLabel(/Change message/).fill('An invalid unit');
    await dialog.getByRole('button', { name: 'Publish', exact: true }).click();
    const list = page.getByTestId('problems');
    await list.waitFor();
    await expect(list.innerText()).resolves.toMatch(/line \d+, column \d+/);
    await expect(list.innerText()).resolves.toContain('fortnight');
    await page.locator('.cm-lintRange-error').first().waitFor();
    await list.getByRole('button', { name: /line \d+, column \d+/ }).first().click();

    // Completion: a new key in a descriptor offers the schema's fields.
    await page.locator('.cm-content').click();
    await page.keyboard.press('Control+End');
    await page.keyboard.insertText('\n  - key: tenant\n    algo');
    await page.keyboard.press('Control+Space');
    const completion = page.locator('.cm-tooltip-autocomplete');
    await completion.waitFor();
    await expect(completion.innerText()).resolves.toContain('algorithm');
    // The console's own JSON Schema drives completion where it serves one.
    const schema = await fetch(`${base}/api/v1/schema`, { headers: { Authorization: `Bearer ${adminSecret}` } });
    if (schema.status === 200) await page.getByText('schema from the console').waitFor();
    await shot('11-editor-errors');
    await page.keyboard.press('Escape');
    await page.getByRole('button', { name: 'Discard changes' }).click();
    await labelled('discard dialog');
    await readable('discard dialog');
    await confirm(`Discard your changes to ${domain}?`, 'Discard');
    await page.getByTestId('unsaved').waitFor({ state: 'detached' });
  });

  it('renders names and messages containing markup as text (XSS probe)', async () => {
    const name = '<img src=x onerror="window.__xss=1">';
    const msg = '<script>window.__xss=2</script><b>bold</b> <img src=x onerror="window.__xss=3">';
    await go(`/domains/${domain}`, /Domain/);
    await descriptor('user').getByLabel(/^Name/).fill(name);
    await publishWith(msg);
    const pages: [string, string | RegExp][] = [
      ['/history', 'History'],
      ['/domains', 'Domains'],
      [`/domains/${domain}`, /Domain/],
      ['/audit', 'Audit log'],
    ];
    for (const [path, heading] of pages) {
      await go(path, heading);
      if (path === '/history' || path === '/audit') await page.getByText(msg).first().waitFor();
      if (path === '/domains') await page.getByText(`“${name}”`).waitFor();
      if (path.startsWith('/domains/')) await expect(descriptor('user').getByLabel(/^Name/).inputValue()).resolves.toBe(name);
      expect(await page.evaluate(() => (window as unknown as { __xss?: number }).__xss)).toBeUndefined();
      expect(await page.locator('img[src="x"], b:text("bold")').count()).toBe(0);
    }
  });

  it('refuses a cross-site-style write without the CSRF header (CSRF probe)', async () => {
    const statuses = await page.evaluate(async (d) => {
      const body = JSON.stringify({ yaml: `domain: ${d}\n`, message: 'csrf', base_version: 999999 });
      const none = await fetch(`/api/v1/domains/${d}`, { method: 'PUT', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body });
      const wrong = await fetch(`/api/v1/domains/${d}`, {
        method: 'PUT',
        credentials: 'include',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': 'forged' },
        body,
      });
      // What a hostile page's auto-submitted <form> would send.
      const form = await fetch('/api/v1/versions/1/rollback', {
        method: 'POST',
        credentials: 'include',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
        body: 'message=pwned',
      });
      return [none.status, wrong.status, form.status];
    }, domain);
    // The form's body is not JSON: refused (415) before its credentials are looked at.
    expect(statuses).toEqual([403, 403, 415]);
    const { versions } = await admin.call<{ versions: { message: string }[] }>('GET', '/api/v1/versions?limit=5');
    expect(versions.map((v) => v.message)).not.toContain('csrf');
    expect(versions.map((v) => v.message)).not.toContain('pwned');
  });

  it('shows the nodes with their version, ack state and last contact', async () => {
    await go('/nodes', 'Nodes');
    const table = page.getByTestId('nodes');
    for (const id of ['ui-e2e-1', 'ui-e2e-2']) {
      const row = table.locator('tr', { hasText: id });
      await row.getByText('ACK', { exact: true }).waitFor({ timeout: 15_000 });
      // The token the node connected with: each has its own, named like the node.
      expect(await row.locator('td', { hasText: /#\d+/ }).innerText()).toMatch(new RegExp(`^${id} #\\d+$`));
    }
    await page.getByText(/All 2 connected nodes run version \d+/).waitFor();
    // The region column and the per-region summary.
    await table.locator('tr', { hasText: 'ui-e2e-1' }).getByRole('cell', { name: 'eu-west', exact: true }).waitFor();
    const regions = page.getByTestId('regions');
    await regions.getByText('eu-west').waitFor();
    await regions.getByText('no region').waitFor();
    // Live decisions/s: send checks until the page shows a rate above zero.
    await eventually(
      async () => {
        await Promise.all(enforcers.flatMap((e) => Array.from({ length: 20 }, () => check(e.addr, domain, [{ key: 'user', value: 'rate-probe' }]))));
        const cells = await table.locator('td.num').allInnerTexts();
        if (!cells.some((c) => Number(c.replace(/,/g, '')) > 0)) throw new Error(`decisions/s cells: ${cells.join(', ')}`);
      },
      10_000,
      'a live decision rate on the nodes page',
    );
    await labelled('nodes');
    await readable('nodes');
    await shot('12-nodes');
  });

  it('filters the audit log, links the CSV export, and verifies the chain', async () => {
    await go('/audit', 'Audit log');
    await page.getByTestId('audit').waitFor();
    await page.getByLabel('Action').fill('version.rollback');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.waitForURL(/action=version.rollback/);
    const rows = page.getByTestId('audit').locator('tbody tr');
    // The table reloads after the URL changes.
    await eventually(async () => expect(await rows.count()).toBe(1), 10_000, 'one rollback event');
    await expect(rows.first().innerText()).resolves.toContain('version.rollback');
    const href = await page.getByRole('link', { name: 'Export CSV' }).getAttribute('href');
    expect(href).toContain('format=csv');
    expect(href).toContain('action=version.rollback');
    const csv = await page.evaluate(async (u) => {
      const r = await fetch(u!);
      return { type: r.headers.get('Content-Type') ?? '', body: await r.text() };
    }, href);
    // A header and the one filtered event.
    expect(csv.type).toMatch(/^text\/csv/);
    const lines = csv.body.trim().split('\n');
    expect(lines[0]).toMatch(/^id,at,actor,action/);
    expect(lines.slice(1).every((l) => l.includes('version.rollback'))).toBe(true);
    expect(lines.length).toBe(2);
    await page.getByRole('button', { name: 'Verify the chain' }).click();
    await expect(page.getByTestId('verify').innerText()).resolves.toMatch(/intact: \d+ events/);
    await rows.first().getByRole('button', { name: 'Details' }).click();
    await labelled('audit');
    await readable('audit');
    await shot('13-audit');
  });

  it('creates an API token and shows it once with a copy button', async () => {
    await go('/tokens', 'API tokens');
    await page.getByLabel('Name').fill('ci-deploy');
    await page.getByLabel('Role').selectOption('editor');
    await page.getByRole('button', { name: 'Create token' }).click();
    const fresh = page.getByTestId('new-token');
    await fresh.waitFor();
    const token = await fresh.getByLabel('Token').inputValue();
    expect(token.length).toBeGreaterThan(20);
    await fresh.getByRole('button', { name: 'Copy' }).click();
    await fresh.getByRole('status').filter({ hasText: /Copied|Selected/ }).waitFor();
    // The token works against the API.
    const res = await fetch(`${base}/api/v1/me`, { headers: { Authorization: `Bearer ${token}` } });
    expect(res.status).toBe(200);
    await labelled('tokens');
    await shot('14-tokens');
    await fresh.getByRole('button', { name: 'I have stored it' }).click();
    await fresh.waitFor({ state: 'detached' });

    // Rotate: the old secret stops working at once.
    const list = page.getByTestId('tokens');
    await list.locator('tr', { hasText: 'ci-deploy' }).getByRole('button', { name: 'Rotate' }).click();
    await confirm('Rotate token ci-deploy?', 'Rotate');
    await fresh.waitFor();
    const rotated = await fresh.getByLabel('Token').inputValue();
    expect(rotated).not.toBe(token);
    const me = (t: string) => fetch(`${base}/api/v1/me`, { headers: { Authorization: `Bearer ${t}` } }).then((r) => r.status);
    expect([await me(token), await me(rotated)]).toEqual([401, 200]);
    await shot('24-token-rotated');
  });

  it('with four-eyes on, a publish waits for another editor, who approves it (users page too)', async () => {
    // An admin creates the reviewer on the users page.
    const reviewerPassword = secret();
    await go('/users', 'Users');
    await page.getByLabel('Username').fill('reviewer');
    await page.getByLabel('Password').fill(reviewerPassword);
    await page.getByLabel('Role').selectOption('editor');
    await page.getByRole('button', { name: 'Create user' }).click();
    await page.getByTestId('users').locator('tr', { hasText: 'reviewer' }).waitFor();

    await admin.call('PUT', '/api/v1/settings', { require_approval: true });
    try {
      await go(`/domains/${domain}`, /Domain/); // a fresh load reads the setting
      await descriptor('user').getByLabel('Requests per unit').fill('5');
      const dialog = await openPublish();
      await dialog.getByText(/Four-eyes approval is on/).waitFor();
      await dialog.getByLabel(/Change message/).fill('Lower the per-user limit to 5/hour (needs review)');
      await dialog.getByRole('button', { name: 'Request approval' }).click();
      await page.waitForURL(/\/approvals$/);
      const card = page.locator('section.card', { hasText: 'Lower the per-user limit to 5/hour' });
      await card.waitFor();
      expect(await card.getByRole('button', { name: 'Approve and publish' }).isDisabled()).toBe(true); // not one's own
      const pendingDiff = await card.locator('figure.diff').innerText();
      expect(pendingDiff).toContain('requests_per_unit: 5');
      expect(pendingDiff).toMatch(/rate_limit\.requests_per_unit \d+ → 5/); // the console's structured diff
      await shot('22-approvals-pending');

      const other = await browser.newContext({ viewport: { width: 1366, height: 800 } });
      try {
        const p2 = await other.newPage();
        await p2.goto(base + '/approvals');
        await p2.getByLabel('Username').fill('reviewer');
        await p2.getByLabel('Password').fill(reviewerPassword);
        await p2.getByRole('button', { name: 'Sign in' }).click();
        await p2.getByRole('heading', { level: 1, name: 'Approvals' }).waitFor();
        const theirs = p2.locator('section.card', { hasText: 'Lower the per-user limit to 5/hour' });
        await theirs.getByRole('button', { name: 'Approve and publish' }).click();
        await p2.waitForURL(/\/history\?highlight=\d+/);
        const v = Number(new URL(p2.url()).searchParams.get('highlight'));
        await expect(p2.locator(`tr[data-version="${v}"]`).innerText()).resolves.toContain('approved by reviewer');
      } finally {
        await other.close();
      }
      await limitOn(5);

      // A multi-domain apply (sluice ctl rules apply) waits as one change request with a diff per domain.
      const rs = await admin.call<{ version: number }>('GET', '/api/v1/ruleset');
      const cr = await admin.call<{ change: { id: number } }>(
        'PUT',
        '/api/v1/ruleset',
        {
          domains: {
            'ctl-a': 'domain: ctl-a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n',
            'ctl-b': 'domain: ctl-b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n',
          },
          message: 'Two domains from git in one version',
          base_version: rs.version,
        },
        202,
      );
      await go('/approvals', 'Approvals');
      const both = page.locator('section.card', { hasText: 'Two domains from git in one version' });
      await both.getByRole('heading', { name: /change 2 domains in one version/ }).waitFor();
      const diffs = await both.locator('figure.diff').allInnerTexts();
      expect(diffs.length).toBe(2);
      expect(diffs.join('\n')).toContain('requests_per_unit: 7');
      await admin.call('POST', `/api/v1/changes/${cr.change.id}/reject`, { message: 'e2e: withdrawn' });
    } finally {
      await admin.call('PUT', '/api/v1/settings', { require_approval: false });
    }

    await go('/users', 'Users');
    const row = page.getByTestId('users').locator('tr', { hasText: 'reviewer' });
    await row.getByRole('button', { name: 'Disable' }).click();
    await confirm('Disable reviewer?', 'Disable');
    await row.getByText('disabled').waitFor();
    await labelled('users');
    await shot('23-users-reviewer-disabled');
  });

  it('shows the remaining pages without errors', async () => {
    const pages: [string, string, string][] = [
      ['/users', 'Users', '15-users'],
      ['/approvals', 'Approvals', '16-approvals'],
      ['/traffic', 'Live traffic', '17-traffic'],
      ['/quotas', 'Quotas', '17-quotas'],
      ['/domains/~new', 'New domain', '18-new-domain'],
    ];
    for (const [path, heading, name] of pages) {
      await go(path, heading);
      await page.waitForLoadState('networkidle');
      await labelled(heading);
      await readable(heading);
      await shot(name);
    }
  });

  it('has a dark theme and a keyboard path', async () => {
    await go('/domains', 'Domains');
    await page.getByRole('button', { name: /Change theme/ }).click(); // system → light
    await page.getByRole('button', { name: /Change theme/ }).click(); // light → dark
    await expect(page.evaluate(() => document.documentElement.dataset.theme)).resolves.toBe('dark');
    const bg = await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
    expect(bg).toBe('rgb(14, 17, 21)');
    await readable('domains (dark)');
    await shot('19-domains-dark');
    await go(`/domains/${domain}`, /Domain/);
    await readable('editor (dark)');
    await shot('20-editor-dark');
    await page.getByRole('tab', { name: 'YAML' }).click();
    await page.locator('.cm-content').waitFor();
    await readable('editor YAML (dark)');
    await shot('21-editor-yaml-dark');

    await page.goto(base + '/domains');
    await page.getByRole('heading', { level: 1, name: 'Domains' }).waitFor();
    await page.keyboard.press('Tab');
    await expect(page.evaluate(() => document.activeElement?.textContent)).resolves.toBe('Skip to content');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Tab');
    await expect(page.evaluate(() => document.activeElement?.closest('main') !== null)).resolves.toBe(true);
  });

  it('signs out, and the old session no longer works', async () => {
    await go('/domains', 'Domains');
    await page.getByRole('button', { name: 'Sign out', exact: true }).click();
    await page.getByRole('heading', { name: 'Sign in to Sluice' }).waitFor();
    expect(await page.evaluate(() => fetch('/api/v1/me').then((r) => r.status))).toBe(401);
  });

  it('logged no CSP violation and no uncaught error', () => {
    expect(problems).toEqual([]);
  });
});
