// Line diffs in the browser, for what the console cannot diff for us: the
// editor's unsaved text against the published one (publish and delete
// previews), and the line-by-line pairing of the side-by-side view. Which
// domains two versions (or a pending change) differ in, how, and by how
// many lines is the console's answer (GET /versions/{a}/diff/{b}, GET
// /changes/{id}, from rules.DiffRulesets); parseUnified reads its unified
// text for the same rendering. Myers' O(ND) algorithm over lines, then
// unified hunks or side-by-side rows. Pure functions, no DOM.

/** One line of a diff: kept, removed from the old text, or added in the new. */
export interface DiffLine {
  type: 'equal' | 'delete' | 'insert';
  text: string;
  /** 1-based line number in the old text (equal and delete lines). */
  oldNo?: number;
  /** 1-based line number in the new text (equal and insert lines). */
  newNo?: number;
}

/** A hunk of a unified diff: a header like "@@ -3,7 +3,6 @@" and its lines. */
export interface Hunk {
  header: string;
  lines: DiffLine[];
}

/** One cell of a side-by-side row; absent on the side that has no line. */
export interface Cell {
  no: number;
  text: string;
  type: 'equal' | 'delete' | 'insert';
}

/** A row of a side-by-side diff: old line on the left, new on the right. */
export interface Row {
  left?: Cell;
  right?: Cell;
}

/** splitLines splits text into lines; a final newline does not add an empty line. */
export function splitLines(text: string): string[] {
  if (text === '') return [];
  const lines = text.replace(/\r\n/g, '\n').split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

/**
 * diffLines returns the line diff of a → b, every line of both texts in
 * order, deletions before insertions within a change.
 */
export function diffLines(a: string, b: string): DiffLine[] {
  const x = splitLines(a);
  const y = splitLines(b);
  // Trim the common prefix and suffix first: edits are usually small, and
  // this keeps Myers' search to the changed middle.
  let start = 0;
  while (start < x.length && start < y.length && x[start] === y[start]) start++;
  let endX = x.length;
  let endY = y.length;
  while (endX > start && endY > start && x[endX - 1] === y[endY - 1]) {
    endX--;
    endY--;
  }
  const out: DiffLine[] = [];
  for (let i = 0; i < start; i++) out.push({ type: 'equal', text: x[i], oldNo: i + 1, newNo: i + 1 });
  for (const op of myers(x.slice(start, endX), y.slice(start, endY))) {
    if (op.type === 'equal') {
      out.push({ type: 'equal', text: op.text, oldNo: op.i + start + 1, newNo: op.j + start + 1 });
    } else if (op.type === 'delete') {
      out.push({ type: 'delete', text: op.text, oldNo: op.i + start + 1 });
    } else {
      out.push({ type: 'insert', text: op.text, newNo: op.j + start + 1 });
    }
  }
  for (let i = endX, j = endY; i < x.length; i++, j++) {
    out.push({ type: 'equal', text: x[i], oldNo: i + 1, newNo: j + 1 });
  }
  return out;
}

interface Op {
  type: 'equal' | 'delete' | 'insert';
  text: string;
  i: number; // index in x (equal, delete)
  j: number; // index in y (equal, insert)
}

// myers computes a shortest edit script with the greedy O((N+M)·D)
// algorithm, saving each round's frontier to walk the path back.
function myers(x: string[], y: string[]): Op[] {
  const n = x.length;
  const m = y.length;
  const max = n + m;
  if (max === 0) return [];
  const offset = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace: Int32Array[] = [];
  search: for (let d = 0; d <= max; d++) {
    trace.push(v.slice()); // the frontier before round d
    for (let k = -d; k <= d; k += 2) {
      // k±1 have the other parity, so they still hold round d-1's values.
      let i =
        k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1])
          ? v[offset + k + 1] // down: an insertion
          : v[offset + k - 1] + 1; // right: a deletion
      let j = i - k;
      while (i < n && j < m && x[i] === y[j]) {
        i++;
        j++;
      }
      v[offset + k] = i;
      if (i >= n && j >= m) break search;
    }
  }

  const ops: Op[] = [];
  let i = n;
  let j = m;
  for (let d = trace.length - 1; d >= 0; d--) {
    const prev = trace[d];
    const k = i - j;
    const prevK = k === -d || (k !== d && prev[offset + k - 1] < prev[offset + k + 1]) ? k + 1 : k - 1;
    const prevI = prev[offset + prevK];
    const prevJ = prevI - prevK;
    while (i > prevI && j > prevJ) {
      i--;
      j--;
      ops.push({ type: 'equal', text: x[i], i, j });
    }
    if (d > 0) {
      if (i === prevI) ops.push({ type: 'insert', text: y[prevJ], i: prevI, j: prevJ });
      else ops.push({ type: 'delete', text: x[prevI], i: prevI, j: prevJ });
    }
    i = prevI;
    j = prevJ;
  }
  ops.reverse();
  return groupChanges(ops);
}

// groupChanges orders each run of changes as all deletions, then all
// insertions, which reads best in unified and side-by-side views.
function groupChanges(ops: Op[]): Op[] {
  const out: Op[] = [];
  let dels: Op[] = [];
  let ins: Op[] = [];
  const flush = () => {
    out.push(...dels, ...ins);
    dels = [];
    ins = [];
  };
  for (const op of ops) {
    if (op.type === 'equal') {
      flush();
      out.push(op);
    } else if (op.type === 'delete') {
      dels.push(op);
    } else {
      ins.push(op);
    }
  }
  flush();
  return out;
}

/** unifiedHunks groups a diff into hunks with `context` unchanged lines around each change. */
export function unifiedHunks(lines: readonly DiffLine[], context = 3): Hunk[] {
  const hunks: Hunk[] = [];
  const changed = lines.map((l) => l.type !== 'equal');
  let i = 0;
  while (i < lines.length) {
    if (!changed[i]) {
      i++;
      continue;
    }
    // Hunks never overlap: the loop below swallows any change that is
    // within 2·context lines of the previous one.
    const start = Math.max(0, i - context);
    let end = i;
    // Extend while the next change is within 2·context lines.
    for (;;) {
      while (end < lines.length && changed[end]) end++;
      let next = end;
      while (next < lines.length && !changed[next]) next++;
      if (next < lines.length && next - end <= 2 * context) {
        end = next;
        continue;
      }
      end = Math.min(lines.length, end + context);
      break;
    }
    const body = lines.slice(start, end);
    hunks.push({ header: hunkHeader(lines.slice(0, start), body), lines: body });
    i = end;
  }
  return hunks;
}

function hunkHeader(before: readonly DiffLine[], body: readonly DiffLine[]): string {
  const oldBefore = before.filter((l) => l.oldNo !== undefined).length;
  const newBefore = before.filter((l) => l.newNo !== undefined).length;
  const oldCount = body.filter((l) => l.oldNo !== undefined).length;
  const newCount = body.filter((l) => l.newNo !== undefined).length;
  // GNU diff's convention: an empty side names the line before it.
  const oldStart = oldCount === 0 ? oldBefore : oldBefore + 1;
  const newStart = newCount === 0 ? newBefore : newBefore + 1;
  return `@@ -${range(oldStart, oldCount)} +${range(newStart, newCount)} @@`;
}

function range(start: number, count: number): string {
  return count === 1 ? `${start}` : `${start},${count}`;
}

/**
 * sideBySide pairs a diff's lines into rows: unchanged lines on both sides,
 * and within each change the i-th deleted line beside the i-th inserted one.
 */
export function sideBySide(lines: readonly DiffLine[]): Row[] {
  const rows: Row[] = [];
  let i = 0;
  while (i < lines.length) {
    const l = lines[i];
    if (l.type === 'equal') {
      rows.push({ left: { no: l.oldNo!, text: l.text, type: 'equal' }, right: { no: l.newNo!, text: l.text, type: 'equal' } });
      i++;
      continue;
    }
    const dels: DiffLine[] = [];
    const ins: DiffLine[] = [];
    while (i < lines.length && lines[i].type === 'delete') dels.push(lines[i++]);
    while (i < lines.length && lines[i].type === 'insert') ins.push(lines[i++]);
    for (let k = 0; k < Math.max(dels.length, ins.length); k++) {
      const d = dels[k];
      const n = ins[k];
      rows.push({
        left: d ? { no: d.oldNo!, text: d.text, type: 'delete' } : undefined,
        right: n ? { no: n.newNo!, text: n.text, type: 'insert' } : undefined,
      });
    }
  }
  return rows;
}

/** diffStat counts added and removed lines. */
export function diffStat(lines: readonly DiffLine[]): { added: number; removed: number } {
  let added = 0;
  let removed = 0;
  for (const l of lines) {
    if (l.type === 'insert') added++;
    else if (l.type === 'delete') removed++;
  }
  return { added, removed };
}

/**
 * parseUnified reads a unified diff as the console sends it (DomainDiff's
 * `unified`, "diff -u" with "--- a/NAME" / "+++ b/NAME" headers) into
 * hunks with line numbers, for the same rendering as unifiedHunks.
 */
export function parseUnified(text: string): Hunk[] {
  const hunks: Hunk[] = [];
  let hunk: Hunk | null = null;
  let oldNo = 0;
  let newNo = 0;
  for (const line of text.split('\n')) {
    const m = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/.exec(line);
    if (m) {
      hunk = { header: line, lines: [] };
      hunks.push(hunk);
      // An empty side is "-0,0": its first line would be line 1.
      oldNo = Math.max(Number(m[1]), 1);
      newNo = Math.max(Number(m[2]), 1);
      continue;
    }
    if (!hunk) continue; // the "---" and "+++" lines before the first hunk
    if (line.startsWith('+')) hunk.lines.push({ type: 'insert', text: line.slice(1), newNo: newNo++ });
    else if (line.startsWith('-')) hunk.lines.push({ type: 'delete', text: line.slice(1), oldNo: oldNo++ });
    else if (line.startsWith(' ')) hunk.lines.push({ type: 'equal', text: line.slice(1), oldNo: oldNo++, newNo: newNo++ });
  }
  return hunks;
}
