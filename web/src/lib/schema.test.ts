import { describe, expect, it } from 'vitest';
import { cursorContext, fallbackSchema, schemaAt, suggestions, type JSONSchema } from './schema';

// at splits a document at "|", the cursor.
function at(doc: string): { text: string; pos: number } {
  const pos = doc.indexOf('|');
  return { text: doc.slice(0, pos) + doc.slice(pos + 1), pos };
}

function labels(doc: string, schema: JSONSchema = fallbackSchema): string[] {
  const { text, pos } = at(doc);
  const ctx = cursorContext(text, pos);
  return ctx ? suggestions(schema, ctx).map((s) => s.label) : [];
}

describe('cursorContext', () => {
  const cases: { name: string; doc: string; path: string[]; kind: 'key' | 'value'; key?: string; prefix: string }[] = [
    { name: 'top-level key', doc: 'dom|', path: [], kind: 'key', prefix: 'dom' },
    { name: 'new list item', doc: 'domain: a\ndescriptors:\n  - |', path: ['descriptors', '[]'], kind: 'key', prefix: '' },
    {
      name: 'second key of an item',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    ra|',
      path: ['descriptors', '[]'],
      kind: 'key',
      prefix: 'ra',
    },
    {
      name: 'inside rate_limit',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    rate_limit:\n      un|',
      path: ['descriptors', '[]', 'rate_limit'],
      kind: 'key',
      prefix: 'un',
    },
    {
      name: 'a value',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    rate_limit:\n      unit: mi|',
      path: ['descriptors', '[]', 'rate_limit'],
      kind: 'value',
      key: 'unit',
      prefix: 'mi',
    },
    {
      name: 'nested descriptors, after a finished sibling item',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    descriptors:\n      - key: y\n        rate_limit: {unit: day, requests_per_unit: 1}\n      - key: z\n        alg|',
      path: ['descriptors', '[]', 'descriptors', '[]'],
      kind: 'key',
      prefix: 'alg',
    },
    {
      name: 'lists under their key',
      doc: 'domain: a\ndescriptors:\n- key: x\n  rate_limit:\n    requests|',
      path: ['descriptors', '[]', 'rate_limit'],
      kind: 'key',
      prefix: 'requests',
    },
    {
      name: 'a flow mapping key',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: day, req|',
      path: ['descriptors', '[]', 'rate_limit'],
      kind: 'key',
      prefix: 'req',
    },
    {
      name: 'a flow mapping value',
      doc: 'domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: h|',
      path: ['descriptors', '[]', 'rate_limit'],
      kind: 'value',
      key: 'unit',
      prefix: 'h',
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const { text, pos } = at(c.doc);
      const got = cursorContext(text, pos);
      expect(got).toMatchObject({ path: c.path, kind: c.kind, prefix: c.prefix, from: pos - c.prefix.length });
      expect(got?.key).toBe(c.key);
    });
  }

  it('offers nothing inside a comment', () => {
    const { text, pos } = at('domain: a # dom|');
    expect(cursorContext(text, pos)).toBeNull();
  });
});

describe('suggestions from the schema', () => {
  it('completes top-level keys', () => {
    expect(labels('d|')).toEqual(['domain', 'default_algorithm', 'descriptors']);
  });

  it('completes descriptor fields, skipping those already there', () => {
    const got = labels('domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: day, requests_per_unit: 1}\n    |');
    expect(got).toContain('algorithm');
    expect(got).toContain('shadow_mode');
    expect(got).not.toContain('key');
    expect(got).not.toContain('rate_limit');
  });

  it('completes enum values', () => {
    expect(labels('domain: a\ndescriptors:\n  - key: x\n    algorithm: s|')).toEqual(['sliding_window_log', 'sliding_window_counter']);
    expect(labels('domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: |')).toEqual([
      'second',
      'minute',
      'hour',
      'day',
      'week',
      'month',
      'year',
    ]);
  });

  it('completes booleans', () => {
    expect(labels('domain: a\ndescriptors:\n  - key: x\n    shadow_mode: |')).toEqual(['true', 'false']);
  });

  it('follows $ref, allOf and definitions in a server schema', () => {
    const server: JSONSchema = {
      $ref: '#/definitions/domain',
      definitions: {
        domain: { type: 'object', properties: { domain: { type: 'string' }, descriptors: { type: 'array', items: { $ref: '#/definitions/d' } } } },
        d: { allOf: [{ properties: { key: { type: 'string' } } }, { properties: { on_limit: { type: 'object' } } }] },
      },
    };
    expect(schemaAt(server, ['descriptors', '[]']).flatMap((s) => Object.keys(s.properties ?? {}))).toEqual(['key', 'on_limit']);
    expect(labels('domain: a\ndescriptors:\n  - key: x\n    o|', server)).toEqual(['on_limit']);
  });
});
