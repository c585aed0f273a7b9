import { describe, expect, it } from 'vitest';
import { canEditDomain, parseDomains } from './api';

describe('canEditDomain', () => {
  it('follows the role and the domain grants', () => {
    expect(canEditDomain({ role: 'editor', all_domains: true }, 'api')).toBe(true);
    expect(canEditDomain({ role: 'editor', all_domains: false, domains: ['api'] }, 'api')).toBe(true);
    expect(canEditDomain({ role: 'editor', all_domains: false, domains: ['api'] }, 'search')).toBe(false);
    expect(canEditDomain({ role: 'admin', all_domains: false, domains: [] }, 'api')).toBe(false);
    expect(canEditDomain({ role: 'viewer', all_domains: true }, 'api')).toBe(false);
    expect(canEditDomain({ role: 'admin', all_domains: true, read_only: true }, 'api')).toBe(false);
    expect(canEditDomain(null, 'api')).toBe(false);
    // A console that does not say (all_domains absent) holds every domain.
    expect(canEditDomain({ role: 'editor' }, 'api')).toBe(true);
  });
});

describe('parseDomains', () => {
  it('splits on commas and spaces, drops blanks and repeats', () => {
    expect(parseDomains(' api, search  api\nbilling,')).toEqual(['api', 'search', 'billing']);
    expect(parseDomains('')).toEqual([]);
  });
});
