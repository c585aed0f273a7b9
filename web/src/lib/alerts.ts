// The alerts settings form (admin): the console's settings as editable rows
// and back, and the checks made before saving. Pure, so vitest runs it.
import type { AlertSettings, Alerts, SpikeEvent } from './api';

/** spikeEvents are the events a webhook can subscribe to, in display order. */
export const spikeEvents: readonly SpikeEvent[] = ['spike.start', 'spike.end'];

/** WebhookRow is one webhook in the form. */
export interface WebhookRow {
  id: number;
  url: string;
  events: Record<SpikeEvent, boolean>;
}

/** DomainRow is one domain's override; null numbers use the defaults. */
export interface DomainRow {
  id: number;
  domain: string;
  floor_per_s: number | null;
  factor: number | null;
  for_s: number | null;
  mask_values: boolean;
}

/** AlertsForm is the page's editable state. */
export interface AlertsForm {
  webhooks: WebhookRow[];
  floor_per_s: number | null;
  factor: number | null;
  for_s: number | null;
  domains: DomainRow[];
}

let nextID = 1;

/** rowID is a key for a new row. */
export function rowID(): number {
  return nextID++;
}

/** formFrom turns the console's settings into form rows (domains by name). */
export function formFrom(a: AlertSettings): AlertsForm {
  return {
    webhooks: a.webhooks.map((w) => ({
      id: rowID(),
      url: w.url,
      events: { 'spike.start': (w.events ?? []).includes('spike.start'), 'spike.end': (w.events ?? []).includes('spike.end') },
    })),
    floor_per_s: a.spike_defaults.floor_per_s,
    factor: a.spike_defaults.factor,
    for_s: a.spike_defaults.for_s,
    domains: Object.keys(a.domains)
      .sort()
      .map((d) => {
        const o = a.domains[d];
        return { id: rowID(), domain: d, floor_per_s: o.floor_per_s ?? null, factor: o.factor ?? null, for_s: o.for_s ?? null, mask_values: o.mask_values === true };
      }),
  };
}

const num = (v: number | null | undefined): v is number => typeof v === 'number' && Number.isFinite(v);

/** settingsFrom is what PUT /alerts gets: an override only carries the fields that are set. */
export function settingsFrom(f: AlertsForm): AlertSettings {
  const domains: AlertSettings['domains'] = {};
  for (const d of f.domains) {
    const name = d.domain.trim();
    if (name === '') continue;
    const o: AlertSettings['domains'][string] = { mask_values: d.mask_values };
    if (num(d.floor_per_s)) o.floor_per_s = d.floor_per_s;
    if (num(d.factor)) o.factor = d.factor;
    if (num(d.for_s)) o.for_s = d.for_s;
    domains[name] = o;
  }
  return {
    webhooks: f.webhooks.map((w) => ({ url: w.url.trim(), events: spikeEvents.filter((e) => w.events[e]) })),
    spike_defaults: { floor_per_s: f.floor_per_s ?? 0, factor: f.factor ?? 0, for_s: f.for_s ?? 0 },
    domains,
  };
}

/** Problem is a form field that cannot be saved, and why. */
export interface Problem {
  field: string;
  message: string;
}

function checkSpike(prefix: string, floor: number | null, factor: number | null, forS: number | null, required: boolean, out: Problem[]): void {
  const need = (v: number | null, field: string, what: string, ok: (n: number) => boolean, rule: string) => {
    if (!num(v)) {
      if (required) out.push({ field: `${prefix}${field}`, message: `${what} is required.` });
      return;
    }
    if (!ok(v)) out.push({ field: `${prefix}${field}`, message: `${what} ${rule}.` });
  };
  // The console's bounds (backend/api/stats.go); 0 there means "the default".
  need(floor, 'floor_per_s', 'The floor', (n) => n >= 0 && n <= 1e9, 'must be within 0 to 1,000,000,000 429/s');
  need(factor, 'factor', 'The factor', (n) => n >= 1 && n <= 1000, 'must be within 1 to 1,000 (× the baseline)');
  need(forS, 'for_s', 'The duration', (n) => n >= 1 && n <= 3600 && Number.isInteger(n), 'must be a whole number of seconds from 1 to 3,600');
}

/** validate lists what stops the form from being saved; field names are ids of the form's inputs. */
export function validate(f: AlertsForm): Problem[] {
  const out: Problem[] = [];
  const seen = new Set<string>();
  for (const w of f.webhooks) {
    const url = w.url.trim();
    let ok = false;
    try {
      const u = new URL(url);
      ok = u.protocol === 'https:' || u.protocol === 'http:';
    } catch {
      ok = false;
    }
    if (!ok) out.push({ field: `webhook-${w.id}`, message: 'A webhook needs an http:// or https:// URL.' });
    else if (seen.has(url)) out.push({ field: `webhook-${w.id}`, message: 'This URL is listed twice.' });
    seen.add(url);
    if (!spikeEvents.some((e) => w.events[e])) out.push({ field: `webhook-${w.id}-events`, message: 'Pick at least one event for this webhook.' });
  }
  checkSpike('default-', f.floor_per_s, f.factor, f.for_s, true, out);
  const names = new Set<string>();
  for (const d of f.domains) {
    const name = d.domain.trim();
    if (name === '') out.push({ field: `domain-${d.id}`, message: 'Pick the domain this override is for.' });
    else if (names.has(name)) out.push({ field: `domain-${d.id}`, message: `${name} has two overrides.` });
    names.add(name);
    checkSpike(`domain-${d.id}-`, d.floor_per_s, d.factor, d.for_s, false, out);
  }
  return out;
}

/** removedWebhooks are the saved webhook URLs the form no longer has. */
export function removedWebhooks(saved: Alerts | AlertSettings, f: AlertsForm): string[] {
  const now = new Set(f.webhooks.map((w) => w.url.trim()));
  return saved.webhooks.map((w) => w.url).filter((u) => !now.has(u));
}
