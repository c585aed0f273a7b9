import { describe, expect, it } from 'vitest';
import { APIError } from './api';
import { messageOf } from './errors';

describe('messageOf', () => {
  const cases: { name: string; err: unknown; want: string }[] = [
    { name: 'an Error', err: new Error('network down'), want: 'network down' },
    { name: 'a TypeError', err: new TypeError('Failed to fetch'), want: 'Failed to fetch' },
    {
      name: 'an APIError carries the console message',
      err: new APIError(409, { error: { code: 'conflict', message: 'domain changed since version 3' } }),
      want: 'domain changed since version 3',
    },
    { name: 'an APIError without a body', err: new APIError(503, null), want: 'The console failed (HTTP 503).' },
    { name: 'a thrown string', err: 'boom', want: 'boom' },
    { name: 'a thrown number', err: 42, want: '42' },
    { name: 'undefined', err: undefined, want: 'undefined' },
  ];
  for (const c of cases) {
    it(c.name, () => {
      expect(messageOf(c.err)).toBe(c.want);
    });
  }
});
