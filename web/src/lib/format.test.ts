import { describe, expect, it } from 'vitest';
import { errorMessage, lineCount, sortDomains } from './format';

describe('errorMessage', () => {
  const cases: { name: string; status: number; body: unknown; want: string }[] = [
    {
      name: 'console error body',
      status: 409,
      body: { error: { code: 'conflict', message: 'domain changed since version 3' } },
      want: 'domain changed since version 3',
    },
    {
      name: 'validation details are counted',
      status: 422,
      body: { error: { code: 'invalid', message: 'invalid rules', details: [{}, {}] } },
      want: 'invalid rules (2 problems)',
    },
    { name: 'unauthenticated without body', status: 401, body: null, want: 'Not signed in.' },
    { name: 'html from a proxy', status: 502, body: '<html>', want: 'The console failed (HTTP 502).' },
    { name: 'empty message falls back', status: 400, body: { error: { message: '' } }, want: 'Request failed (HTTP 400).' },
  ];
  for (const c of cases) {
    it(c.name, () => {
      expect(errorMessage(c.status, c.body)).toBe(c.want);
    });
  }
});

describe('sortDomains', () => {
  it('orders by name without mutating the input', () => {
    const input = [
      { name: 'web', yaml: '', version: 2 },
      { name: 'api', yaml: '', version: 1 },
    ];
    expect(sortDomains(input).map((d) => d.name)).toEqual(['api', 'web']);
    expect(input[0].name).toBe('web');
  });
});

describe('lineCount', () => {
  it.each([
    ['', 0],
    ['domain: api', 1],
    ['domain: api\n', 1],
    ['domain: api\ndescriptors: []\n', 2],
  ])('%j has %i lines', (text, want) => {
    expect(lineCount(text)).toBe(want);
  });
});
