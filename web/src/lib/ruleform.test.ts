import { describe, expect, it } from 'vitest';
import { diffLines, diffStat } from './diff';
import {
  applyModel,
  layoutOf,
  deepEqual,
  describeLimit,
  modelToYaml,
  newDescriptor,
  parseDomain,
  pathToString,
  reapply,
  summarize,
  type DescriptorModel,
  type DomainModel,
} from './ruleform';

const api = `# Limits for the public API.
domain: api
descriptors:
  - key: api_key # one counter per key
    rate_limit: {unit: minute, requests_per_unit: 1000, name: per-key}
    algorithm: token_bucket
    burst: 200
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 100}
  # Free plan quota.
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 10000}
    shadow_mode: true
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
    failure_mode: local
`;

function model(text: string): DomainModel {
  const r = parseDomain(text);
  if (!r.ok) throw new Error(`parse: ${JSON.stringify(r.problems)}`);
  return r.model;
}

function clone<T>(v: T): T {
  return structuredClone(v);
}

function descriptors(m: DomainModel): DescriptorModel[] {
  if (!m.descriptors) throw new Error('no descriptors');
  return m.descriptors;
}

describe('parseDomain', () => {
  it('reads the descriptor tree', () => {
    const m = model(api);
    expect(m.domain).toBe('api');
    expect(descriptors(m).map((d) => d.key)).toEqual(['api_key', 'plan', 'remote_address']);
    expect(descriptors(m)[0].descriptors?.[0].value).toBe('/search');
  });

  const bad: { name: string; text: string; line: number }[] = [
    { name: 'bad indentation', text: 'domain: api\ndescriptors:\n  - key: a\n   rate_limit: x\n', line: 4 },
    { name: 'unclosed flow map', text: 'domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute\n', line: 5 },
    { name: 'a list at the top', text: '- a\n- b\n', line: 1 },
    { name: 'duplicate key', text: 'domain: a\ndomain: b\n', line: 2 },
  ];
  for (const c of bad) {
    it(`reports ${c.name} with its line`, () => {
      const r = parseDomain(c.text);
      expect(r.ok).toBe(false);
      if (r.ok) return;
      expect(r.problems[0].line).toBe(c.line);
      expect(r.problems[0].message).not.toMatch(/at line/);
    });
  }

  it('treats an empty file as an empty domain', () => {
    expect(parseDomain('')).toEqual({ ok: true, model: { domain: '' } });
  });
});

describe('applyModel (form → YAML)', () => {
  it('returns the text unchanged when nothing changed, comments and all', () => {
    expect(applyModel(api, model(api), model(api))).toBe(api);
  });

  const edits: { name: string; edit: (m: DomainModel) => void; keeps: string[]; has: string[]; lacks?: string[] }[] = [
    {
      name: 'lower a limit inside a flow mapping',
      edit: (m) => (descriptors(m)[0].rate_limit!.requests_per_unit = 500),
      keeps: ['# Limits for the public API.', '# one counter per key', '# Free plan quota.'],
      has: ['rate_limit: {unit: minute, requests_per_unit: 500, name: per-key}'],
    },
    {
      name: 'change a block-style unit',
      edit: (m) => (descriptors(m)[2].rate_limit!.unit = 'minute'),
      keeps: ['# one counter per key'],
      has: ['      unit: minute\n      requests_per_unit: 10'],
    },
    {
      name: 'turn shadow mode off (the key goes)',
      edit: (m) => delete descriptors(m)[1].shadow_mode,
      keeps: ['# Free plan quota.'],
      has: [],
      lacks: ['shadow_mode'],
    },
    {
      name: 'set an algorithm and burst where there were none',
      edit: (m) => {
        descriptors(m)[2].algorithm = 'sliding_window_counter';
        descriptors(m)[2].burst = 20;
      },
      keeps: ['# Free plan quota.'],
      has: ['algorithm: sliding_window_counter', 'burst: 20'],
    },
    {
      name: 'add a descriptor at the end',
      edit: (m) => descriptors(m).push({ key: 'user', rate_limit: { unit: 'hour', requests_per_unit: 50 } }),
      keeps: ['# Limits for the public API.', '# Free plan quota.'],
      has: ['  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 50\n'],
    },
    {
      name: 'remove the first descriptor, keeping the next one’s comment',
      edit: (m) => descriptors(m).splice(0, 1),
      keeps: ['# Free plan quota.'],
      has: [],
      lacks: ['api_key', '/search'],
    },
    {
      name: 'add a nested descriptor',
      edit: (m) => (descriptors(m)[1].descriptors = [newDescriptor('user')]),
      keeps: ['# one counter per key'],
      has: ['descriptors:\n      - key: user'],
    },
    {
      name: 'remove the last nested descriptor',
      edit: (m) => delete descriptors(m)[0].descriptors,
      keeps: ['# one counter per key'],
      has: [],
      lacks: ['/search'],
    },
    {
      name: 'names with markup stay plain strings',
      edit: (m) => (descriptors(m)[0].rate_limit!.name = '<img src=x onerror=alert(1)>'),
      keeps: [],
      has: ['name: <img src=x onerror=alert(1)>'],
    },
  ];
  for (const c of edits) {
    it(c.name, () => {
      const before = model(api);
      const after = clone(before);
      c.edit(after);
      const out = applyModel(api, before, after);
      // The round trip: what the form produced parses back to the form's model.
      expect(model(out)).toEqual(after);
      for (const s of c.keeps) expect(out).toContain(s);
      for (const s of c.has) expect(out).toContain(s);
      for (const s of c.lacks ?? []) expect(out).not.toContain(s);
    });
  }

  const layouts: { name: string; text: string }[] = [
    { name: 'indented lists, flow maps without padding', text: api },
    {
      name: 'lists under their key, padded flow maps',
      text: 'domain: web\ndescriptors:\n- key: ip\n  rate_limit:\n    unit: second\n    requests_per_unit: 5\n- key: user\n  rate_limit: { unit: hour, requests_per_unit: 50 }\n',
    },
    {
      name: 'four-space indent',
      text: 'domain: web\ndescriptors:\n    - key: ip\n      rate_limit:\n          unit: second\n          requests_per_unit: 5\n    - key: user\n      rate_limit: {unit: hour, requests_per_unit: 50}\n',
    },
  ];
  for (const c of layouts) {
    it(`changes only the edited line (${c.name})`, () => {
      const before = model(c.text);
      const after = clone(before);
      const rl = descriptors(after)[descriptors(after).length - 1].rate_limit!;
      rl.requests_per_unit = 7;
      const out = applyModel(c.text, before, after);
      expect(diffStat(diffLines(c.text, out))).toEqual({ added: 1, removed: 1 });
      expect(model(out)).toEqual(after);
    });
  }

  it.each([
    ['domain: a\ndescriptors:\n  - key: x\n', { indent: 2, indentSeq: true, flowCollectionPadding: false }],
    ['domain: a\ndescriptors:\n- key: x\n  rate_limit: { unit: day }\n', { indent: 2, indentSeq: false, flowCollectionPadding: true }],
    ['domain: a\ndescriptors:\n    - key: x\n', { indent: 4, indentSeq: true, flowCollectionPadding: false }],
  ])('layoutOf(%j)', (text, want) => {
    expect(layoutOf(text)).toMatchObject(want);
  });

  it('renders fresh YAML when the base text is not a mapping', () => {
    const m: DomainModel = { domain: 'web', descriptors: [newDescriptor('ip')] };
    const out = applyModel('', { domain: '' }, m);
    expect(model(out)).toEqual(m);
  });

  it('survives a round trip through YAML for every model it renders', () => {
    const m: DomainModel = {
      domain: 'edge',
      descriptors: [
        { key: 'a', value: 'x*', rate_limit: { unlimited: true } },
        { key: 'b', rate_limit: { unit: 'second', requests_per_unit: 0 }, shadow_mode: true, descriptors: [{ key: 'c' }] },
        { key: 'yes', value: 'true', rate_limit: { unit: 'month', requests_per_unit: 1, name: '#not a comment' } },
      ],
    };
    expect(model(modelToYaml(m))).toEqual(m);
  });
});

describe('reapply (409: reload and reapply)', () => {
  const base = 'domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 10}\n';

  it('replays an edit on top of a newer version', () => {
    const edited = base.replace('requests_per_unit: 100', 'requests_per_unit: 50');
    const latest = base + '  - key: c # added by someone else\n    rate_limit: {unit: day, requests_per_unit: 5}\n';
    const r = reapply(base, edited, latest);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.conflicts).toEqual([]);
    const m = model(r.yaml);
    expect(descriptors(m).map((d) => [d.key, d.rate_limit?.requests_per_unit])).toEqual([
      ['a', 50],
      ['b', 10],
      ['c', 5],
    ]);
    expect(r.yaml).toContain('# added by someone else');
  });

  it('names the fields both changed, keeping the edit', () => {
    const edited = base.replace('requests_per_unit: 100', 'requests_per_unit: 50');
    const latest = base.replace('requests_per_unit: 100', 'requests_per_unit: 80');
    const r = reapply(base, edited, latest);
    expect(r).toMatchObject({ ok: true, conflicts: ['descriptors[0].rate_limit.requests_per_unit'] });
    if (r.ok) expect(descriptors(model(r.yaml))[0].rate_limit?.requests_per_unit).toBe(50);
  });

  it('refuses an edit that does not parse', () => {
    expect(reapply(base, 'domain: [', base)).toMatchObject({ ok: false });
  });
});

describe('summarize', () => {
  it('flattens the tree in file order', () => {
    expect(summarize(model(api))).toEqual([
      { match: 'api_key', limit: '1,000 / minute', algorithm: 'token_bucket', shadow: false, name: 'per-key' },
      { match: 'api_key › route=/search', limit: '100 / minute', algorithm: 'token_bucket', shadow: false, name: undefined },
      { match: 'plan=free', limit: '10,000 / day', algorithm: 'token_bucket', shadow: true, name: undefined },
      { match: 'remote_address', limit: '10 / second', algorithm: 'token_bucket', shadow: false, name: undefined },
    ]);
  });

  it.each([
    [undefined, 'no limit'],
    [{ unlimited: true }, 'unlimited'],
    [{ unit: 'hour', requests_per_unit: 5 }, '5 / hour'],
  ])('describeLimit(%j) = %s', (rl, want) => {
    expect(describeLimit(rl)).toBe(want);
  });
});

describe('helpers', () => {
  it('pathToString matches the server’s field paths', () => {
    expect(pathToString(['descriptors', 0, 'descriptors', 2, 'rate_limit', 'unit'])).toBe('descriptors[0].descriptors[2].rate_limit.unit');
  });

  it.each([
    [{ a: 1, b: [1, { c: 2 }] }, { b: [1, { c: 2 }], a: 1 }, true],
    [{ a: 1 }, { a: 1, b: undefined }, true],
    [{ a: 1 }, { a: '1' }, false],
    [[1, 2], [2, 1], false],
    [null, {}, false],
  ])('deepEqual(%j, %j) = %s', (a, b, want) => {
    expect(deepEqual(a, b)).toBe(want);
  });
});

describe('default_algorithm', () => {
  it('is kept when the form edits a descriptor', () => {
    const text = `domain: lyft\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n`;
    const before = model(text);
    const after = clone(before);
    descriptors(after)[0].rate_limit = { unit: 'second', requests_per_unit: 6 };
    const out = applyModel(text, before, after);
    expect(out).toContain('default_algorithm: fixed_window');
    expect(model(out).default_algorithm).toBe('fixed_window');
    expect(out).toContain('requests_per_unit: 6');
  });
});
