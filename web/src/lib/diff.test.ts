import { describe, expect, it } from 'vitest';
import { diffLines, diffStat, parseUnified, sideBySide, splitLines, unifiedHunks, type DiffLine } from './diff';

// lcsLength is the textbook dynamic programme, to check that diffLines
// finds a shortest edit script.
function lcsLength(a: string[], b: string[]): number {
  const dp = Array.from({ length: a.length + 1 }, () => new Array<number>(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      dp[i][j] = a[i] === b[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
    }
  }
  return dp[0][0];
}

function sides(lines: DiffLine[]): { old: string[]; new: string[] } {
  return {
    old: lines.filter((l) => l.type !== 'insert').map((l) => l.text),
    new: lines.filter((l) => l.type !== 'delete').map((l) => l.text),
  };
}

// A small deterministic PRNG, so failures reproduce.
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe('diffLines', () => {
  it('marks kept, removed and added lines with their numbers', () => {
    expect(diffLines('a\nb\nc\n', 'a\nB\nc\nd\n')).toEqual([
      { type: 'equal', text: 'a', oldNo: 1, newNo: 1 },
      { type: 'delete', text: 'b', oldNo: 2 },
      { type: 'insert', text: 'B', newNo: 2 },
      { type: 'equal', text: 'c', oldNo: 3, newNo: 3 },
      { type: 'insert', text: 'd', newNo: 4 },
    ]);
  });

  it.each([
    ['', ''],
    ['', 'a\nb'],
    ['a\nb', ''],
    ['same\n', 'same'],
  ])('handles %j → %j', (a, b) => {
    const lines = diffLines(a, b);
    expect(sides(lines)).toEqual({ old: splitLines(a), new: splitLines(b) });
  });

  it('finds a shortest edit script on random inputs', () => {
    const next = rng(42);
    const alphabet = ['a', 'b', 'c', 'd'];
    for (let round = 0; round < 300; round++) {
      const a = Array.from({ length: Math.floor(next() * 14) }, () => alphabet[Math.floor(next() * 4)]);
      const b = Array.from({ length: Math.floor(next() * 14) }, () => alphabet[Math.floor(next() * 4)]);
      const lines = diffLines(a.join('\n'), b.join('\n'));
      // Every line of both texts, in order.
      expect(sides(lines)).toEqual({ old: a, new: b });
      // Minimal: the kept lines are a longest common subsequence.
      expect(lines.filter((l) => l.type === 'equal').length).toBe(lcsLength(a, b));
      // Line numbers count up on each side.
      const oldNos = lines.filter((l) => l.oldNo !== undefined).map((l) => l.oldNo);
      expect(oldNos).toEqual(a.map((_, i) => i + 1));
    }
  });

  it('puts the deletions of a change before its insertions', () => {
    const types = diffLines('x\n1\n2\ny\n', 'x\n3\n4\ny\n').map((l) => l.type);
    expect(types).toEqual(['equal', 'delete', 'delete', 'insert', 'insert', 'equal']);
  });
});

describe('unified diff', () => {
  const old = Array.from({ length: 20 }, (_, i) => `line ${i + 1}`).join('\n') + '\n';

  // text renders hunks as diff -u prints their bodies.
  const text = (lines: DiffLine[], context = 3): string =>
    unifiedHunks(lines, context)
      .flatMap((h) => [h.header, ...h.lines.map((l) => (l.type === 'equal' ? ' ' : l.type === 'delete' ? '-' : '+') + l.text)])
      .join('\n');

  it('renders hunks like diff -u', () => {
    const changed = old.replace('line 3\n', 'line three\n').replace('line 18\n', '');
    expect(text(diffLines(old, changed))).toBe(
      [
        '@@ -1,6 +1,6 @@',
        ' line 1',
        ' line 2',
        '-line 3',
        '+line three',
        ' line 4',
        ' line 5',
        ' line 6',
        '@@ -15,6 +15,5 @@',
        ' line 15',
        ' line 16',
        ' line 17',
        '-line 18',
        ' line 19',
        ' line 20',
      ].join('\n'),
    );
  });

  it('merges changes closer than twice the context', () => {
    const changed = old.replace('line 5\n', 'five\n').replace('line 10\n', 'ten\n');
    const hunks = unifiedHunks(diffLines(old, changed), 3);
    expect(hunks.map((h) => h.header)).toEqual(['@@ -2,12 +2,12 @@']);
  });

  it('numbers an empty side from the line before it', () => {
    expect(unifiedHunks(diffLines('', 'a\nb\n')).map((h) => h.header)).toEqual(['@@ -0,0 +1,2 @@']);
    expect(unifiedHunks(diffLines('a\nb\nc\n', 'a\nb\nc\nd\n'), 0).map((h) => h.header)).toEqual(['@@ -3,0 +4 @@']);
  });

  it('is empty for equal texts', () => {
    const lines = diffLines(old, old);
    expect(lines.every((l) => l.type === 'equal')).toBe(true);
    expect(text(lines)).toBe('');
    expect(diffStat(lines)).toEqual({ added: 0, removed: 0 });
  });
});

describe('sideBySide', () => {
  it('pairs removed and added lines of one change', () => {
    const rows = sideBySide(diffLines('a\nb\nc\nz\n', 'a\nB\nz\nnew\n'));
    expect(rows).toEqual([
      { left: { no: 1, text: 'a', type: 'equal' }, right: { no: 1, text: 'a', type: 'equal' } },
      { left: { no: 2, text: 'b', type: 'delete' }, right: { no: 2, text: 'B', type: 'insert' } },
      { left: { no: 3, text: 'c', type: 'delete' }, right: undefined },
      { left: { no: 4, text: 'z', type: 'equal' }, right: { no: 3, text: 'z', type: 'equal' } },
      { left: undefined, right: { no: 4, text: 'new', type: 'insert' } },
    ]);
  });

  it('keeps markup as text', () => {
    const rows = sideBySide(diffLines('', '<script>alert(1)</script>\n'));
    expect(rows[0].right?.text).toBe('<script>alert(1)</script>');
  });
});

describe('parseUnified', () => {
  it('reads the console’s unified diff with line numbers', () => {
    const text = [
      '--- a/api.yaml',
      '+++ b/api.yaml',
      '@@ -1,3 +1,3 @@',
      ' domain: api',
      '-a: 1',
      '+a: 2',
      ' b: 3',
      '@@ -9 +9,2 @@',
      ' z: 9',
      '+last',
      '\\ No newline at end of file',
      '',
    ].join('\n');
    const hunks = parseUnified(text);
    expect(hunks.map((h) => h.header)).toEqual(['@@ -1,3 +1,3 @@', '@@ -9 +9,2 @@']);
    expect(hunks[0]!.lines).toEqual([
      { type: 'equal', text: 'domain: api', oldNo: 1, newNo: 1 },
      { type: 'delete', text: 'a: 1', oldNo: 2 },
      { type: 'insert', text: 'a: 2', newNo: 2 },
      { type: 'equal', text: 'b: 3', oldNo: 3, newNo: 3 },
    ]);
    expect(hunks[1]!.lines).toEqual([
      { type: 'equal', text: 'z: 9', oldNo: 9, newNo: 9 },
      { type: 'insert', text: 'last', newNo: 10 },
    ]);
  });

  it('numbers a new file from line 1', () => {
    const hunks = parseUnified('--- /dev/null\n+++ b/x.yaml\n@@ -0,0 +1,2 @@\n+a\n+b\n');
    expect(hunks[0]!.lines).toEqual([
      { type: 'insert', text: 'a', newNo: 1 },
      { type: 'insert', text: 'b', newNo: 2 },
    ]);
  });

  it('matches the browser’s own diff of the same texts', () => {
    const before = 'domain: api\na: 1\nb: 3\n';
    const after = 'domain: api\na: 2\nb: 3\n';
    const server = '--- a/api.yaml\n+++ b/api.yaml\n@@ -1,3 +1,3 @@\n domain: api\n-a: 1\n+a: 2\n b: 3\n';
    expect(parseUnified(server)).toEqual(unifiedHunks(diffLines(before, after)));
  });
});
