import { describe, expect, it } from 'vitest';
import type { AlertSettings } from './api';
import { formFrom, removedWebhooks, settingsFrom, validate } from './alerts';

const saved: AlertSettings = {
  webhooks: [{ url: 'https://hooks.example/a', events: ['spike.start', 'spike.end'] }, { url: 'https://hooks.example/b', events: ['spike.end'] }],
  spike_defaults: { floor_per_s: 5, factor: 5, for_s: 3 },
  domains: { web: { mask_values: false, factor: 3 }, api: { floor_per_s: 10, factor: 4, for_s: 3, mask_values: true } },
};

describe('the alerts form', () => {
  it('round-trips the console settings', () => {
    const f = formFrom(saved);
    expect(f.domains.map((d) => d.domain)).toEqual(['api', 'web']);
    expect(f.webhooks[1].events).toEqual({ 'spike.start': false, 'spike.end': true });
    expect(settingsFrom(f)).toEqual(saved);
    expect(validate(f)).toEqual([]);
  });

  it('sends only the override fields that are set', () => {
    const f = formFrom(saved);
    f.domains[0].factor = null;
    expect(settingsFrom(f).domains.api).toEqual({ floor_per_s: 10, for_s: 3, mask_values: true });
  });

  it('names each field that cannot be saved', () => {
    const f = formFrom(saved);
    f.webhooks[0].url = 'ftp://x';
    f.webhooks[1].events = { 'spike.start': false, 'spike.end': false };
    f.factor = 0.5;
    f.for_s = null;
    f.domains[1].domain = 'api';
    f.domains[0].for_s = 0.5;
    expect(validate(f).map((p) => p.field)).toEqual([
      `webhook-${f.webhooks[0].id}`,
      `webhook-${f.webhooks[1].id}-events`,
      'default-factor',
      'default-for_s',
      `domain-${f.domains[0].id}-for_s`,
      `domain-${f.domains[1].id}`,
    ]);
  });

  it('lists the saved webhooks the form removed', () => {
    const f = formFrom(saved);
    f.webhooks.splice(0, 1);
    expect(removedWebhooks(saved, f)).toEqual(['https://hooks.example/a']);
  });
});
