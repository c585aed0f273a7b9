// JSON Schema support for the YAML editor's autocompletion: where in the
// document the cursor is (found from indentation, so it works on the
// half-typed, invalid YAML people have while typing) and what the schema
// allows there. Pure functions, no CodeMirror.
import { algorithms, consistencies, failureModes, units } from './ruleform';

/** JSONSchema is the subset of JSON Schema that completion reads. */
export interface JSONSchema {
  $ref?: string;
  $defs?: Record<string, JSONSchema>;
  definitions?: Record<string, JSONSchema>;
  type?: string | string[];
  description?: string;
  properties?: Record<string, JSONSchema>;
  items?: JSONSchema;
  enum?: unknown[];
  const?: unknown;
  default?: unknown;
  oneOf?: JSONSchema[];
  anyOf?: JSONSchema[];
  allOf?: JSONSchema[];
}

/**
 * fallbackSchema describes a domain file as DESIGN.md fixes it. The editor
 * uses it when the console does not serve GET /api/v1/schema; the
 * server's own schema wins when it is there.
 */
export const fallbackSchema: JSONSchema = {
  type: 'object',
  properties: {
    domain: { type: 'string', description: 'the domain name requests carry' },
    default_algorithm: { enum: [...algorithms], default: 'token_bucket', description: 'algorithm of every limit that names none' },
    descriptors: { type: 'array', items: { $ref: '#/$defs/descriptor' }, description: 'the descriptor tree' },
  },
  $defs: {
    descriptor: {
      type: 'object',
      properties: {
        key: { type: 'string', description: 'descriptor entry key' },
        value: { type: 'string', description: 'exact value, or a wildcard (each * is any run: "files/*", "/api*v1"); omit for one counter per value' },
        rate_limit: { $ref: '#/$defs/rate_limit' },
        algorithm: { enum: [...algorithms], default: 'token_bucket', description: 'counting algorithm' },
        burst: { type: 'integer', description: 'bucket capacity; default requests_per_unit' },
        shadow_mode: { type: 'boolean', description: 'count and report, never reject' },
        detailed_metric: { type: 'boolean', description: 'per-value metrics' },
        failure_mode: { enum: [...failureModes], default: 'open', description: 'answer when Redis is unreachable' },
        consistency: { enum: [...consistencies], default: 'exact', description: 'async: count on the node, flush in batches, exact near the limit' },
        descriptors: { type: 'array', items: { $ref: '#/$defs/descriptor' }, description: 'nested descriptors' },
      },
    },
    rate_limit: {
      type: 'object',
      description: 'the limit at this descriptor',
      properties: {
        unit: { enum: [...units], description: 'period requests_per_unit is counted over' },
        requests_per_unit: { type: 'integer', description: 'requests allowed per unit' },
        unlimited: { type: 'boolean', description: 'no limit (overrides a parent)' },
        name: { type: 'string', description: 'name shown in metrics and headers' },
        replaces: { type: 'array', items: { type: 'object', properties: { name: { type: 'string' } } } },
      },
    },
  },
};

/** Where the cursor is: the key path of the enclosing mapping, and what is typed. */
export interface CursorContext {
  /** Keys from the root to the mapping the cursor is in; '[]' stands for a list item. */
  path: string[];
  /** 'key': typing a key; 'value': typing the value of `key`. */
  kind: 'key' | 'value';
  key?: string;
  /** Keys already present in the same mapping, above the cursor. */
  siblings: string[];
  /** Document offset where the typed word starts (what completion replaces). */
  from: number;
  prefix: string;
}

interface LineInfo {
  indent: number; // column of the first non-space character
  dash: boolean; // starts with "- "
  keyCol: number; // column of the key (after "- " for list items)
  key?: string; // the key, when the line is "key:" or "key: value"
  opens: boolean; // "key:" with nothing (or only a comment) after it
}

const keyRe = /^([A-Za-z_][\w.-]*|"[^"]*"|'[^']*')\s*:(?:\s|$)/;

function lineInfo(line: string): LineInfo | null {
  const trimmed = line.trimStart();
  if (trimmed === '' || trimmed.startsWith('#')) return null;
  const indent = line.length - trimmed.length;
  let rest = trimmed;
  let keyCol = indent;
  let dash = false;
  // "- - x" nests lists; only the first dash matters for descriptors.
  if (rest === '-' || rest.startsWith('- ')) {
    dash = true;
    const after = rest.slice(1);
    const more = after.length - after.trimStart().length;
    keyCol = indent + 1 + more;
    rest = after.trimStart();
  }
  const m = keyRe.exec(rest);
  if (!m) return { indent, dash, keyCol, opens: false };
  const key = m[1].replace(/^["']|["']$/g, '');
  const after = rest.slice(m[0].length).trim();
  return { indent, dash, keyCol, key, opens: after === '' || after.startsWith('#') };
}

/**
 * cursorContext finds what the cursor at `pos` in `text` is completing.
 * It returns null inside comments, multi-line scalars it cannot place, and
 * after a value is complete.
 */
export function cursorContext(text: string, pos: number): CursorContext | null {
  const lineStart = text.lastIndexOf('\n', pos - 1) + 1;
  const before = text.slice(lineStart, pos);
  if (before.includes('#')) return null;

  // Inside a flow mapping on this line, like "rate_limit: {unit: mi".
  const brace = before.lastIndexOf('{');
  if (brace >= 0 && before.indexOf('}', brace) < 0) {
    const owner = lineInfo(before.slice(0, brace));
    const segStart = Math.max(before.lastIndexOf(',') + 1, brace + 1);
    const seg = before.slice(segStart);
    const parentPath = owner?.key ? [...enclosingPath(text, lineStart, owner), owner.key] : null;
    if (!parentPath) return null;
    const siblings = [...before.slice(brace + 1, segStart).matchAll(/([\w.-]+)\s*:/g)].map((m) => m[1]);
    const kv = /^\s*([\w.-]+)\s*:\s*([^\s,]*)$/.exec(seg);
    if (kv) {
      return { path: parentPath, kind: 'value', key: kv[1], siblings, from: pos - kv[2].length, prefix: kv[2] };
    }
    const k = /^\s*([\w.-]*)$/.exec(seg);
    if (!k) return null;
    return { path: parentPath, kind: 'key', siblings, from: pos - k[1].length, prefix: k[1] };
  }

  const valueMatch = /^(\s*)(-\s+)?([A-Za-z_][\w.-]*)\s*:\s+([^\s]*)$/.exec(before);
  if (valueMatch) {
    const info = lineInfo(before)!;
    return {
      path: enclosingPath(text, lineStart, info),
      kind: 'value',
      key: valueMatch[3],
      siblings: [],
      from: pos - valueMatch[4].length,
      prefix: valueMatch[4],
    };
  }
  const keyMatch = /^(\s*)(-\s+)?([A-Za-z_][\w.-]*)?$/.exec(before);
  if (!keyMatch) return null;
  const prefix = keyMatch[3] ?? '';
  const indent = keyMatch[1].length;
  const dash = keyMatch[2] !== undefined;
  const info: LineInfo = { indent, dash, keyCol: indent + (keyMatch[2]?.length ?? 0), opens: false };
  const path = enclosingPath(text, lineStart, info);
  return { path, kind: 'key', siblings: siblingKeys(text, lineStart, info), from: pos - prefix.length, prefix };
}

// previousLines yields the parsed lines above offset lineStart, nearest first.
function* previousLines(text: string, lineStart: number): Generator<LineInfo> {
  let end = lineStart - 1;
  while (end >= 0) {
    const start = text.lastIndexOf('\n', end - 1) + 1;
    const info = lineInfo(text.slice(start, end));
    if (info) yield info;
    end = start - 1;
  }
}

// enclosingPath walks up from a line whose key sits at cur.keyCol and
// returns the keys of the mappings that contain it.
function enclosingPath(text: string, lineStart: number, cur: LineInfo): string[] {
  const path: string[] = [];
  let col = cur.keyCol;
  // A list item's mapping belongs to the sequence under the nearest key
  // at or left of the dash.
  let seekSeq = cur.dash ? cur.indent : -1;
  for (const l of previousLines(text, lineStart)) {
    if (seekSeq >= 0) {
      if (l.dash && l.indent === seekSeq) continue; // an earlier item of the same list
      if (l.keyCol > seekSeq) continue; // inside an earlier item
      if (l.key && l.opens) {
        path.push('[]', l.key);
        col = l.keyCol;
        seekSeq = l.dash ? l.indent : -1;
        continue;
      }
      return [];
    }
    if (l.keyCol >= col && !(l.dash && l.keyCol === col)) continue; // a sibling or deeper
    if (l.dash && l.keyCol === col) {
      // The first key of our own list item: find that list's owner.
      seekSeq = l.indent;
      continue;
    }
    if (l.key && l.opens) {
      path.push(l.key);
      col = l.keyCol;
      if (l.dash) seekSeq = l.indent;
      continue;
    }
    return [];
  }
  if (seekSeq >= 0) return []; // a top-level list: not a domain file
  return path.reverse();
}

// siblingKeys lists keys above the cursor in the same mapping.
function siblingKeys(text: string, lineStart: number, cur: LineInfo): string[] {
  if (cur.dash) return [];
  const out: string[] = [];
  for (const l of previousLines(text, lineStart)) {
    if (l.keyCol > cur.keyCol) continue;
    if (l.keyCol < cur.keyCol) break;
    if (l.key) out.push(l.key);
    if (l.dash) break; // the first key of our list item
  }
  return out;
}

function resolve(root: JSONSchema, s: JSONSchema | undefined, depth = 0): JSONSchema | undefined {
  if (!s || depth > 32) return s;
  if (s.$ref?.startsWith('#/')) {
    let target: unknown = root;
    for (const part of s.$ref.slice(2).split('/')) {
      target = (target as Record<string, unknown> | undefined)?.[part.replace(/~1/g, '/').replace(/~0/g, '~')];
    }
    return resolve(root, target as JSONSchema | undefined, depth + 1);
  }
  return s;
}

// variants flattens allOf/anyOf/oneOf so their properties all count.
function variants(root: JSONSchema, s: JSONSchema | undefined): JSONSchema[] {
  const r = resolve(root, s);
  if (!r) return [];
  const out = [r];
  for (const sub of [...(r.allOf ?? []), ...(r.anyOf ?? []), ...(r.oneOf ?? [])]) out.push(...variants(root, sub));
  return out;
}

/** schemaAt returns the schemas that apply at a path from cursorContext. */
export function schemaAt(root: JSONSchema, path: readonly string[]): JSONSchema[] {
  let current = variants(root, root);
  for (const p of path) {
    const next: JSONSchema[] = [];
    for (const s of current) {
      if (p === '[]') {
        if (s.items) next.push(...variants(root, s.items));
      } else if (s.properties?.[p]) {
        next.push(...variants(root, s.properties[p]));
      }
    }
    current = next;
  }
  return current;
}

/** Suggestion is one completion: a key (with ": " after it) or a value. */
export interface Suggestion {
  label: string;
  insert: string;
  type: 'property' | 'enum' | 'keyword';
  detail?: string;
}

/** suggestions returns what may be typed at the cursor, filtered by the typed prefix. */
export function suggestions(root: JSONSchema, ctx: CursorContext): Suggestion[] {
  const here = schemaAt(root, ctx.path);
  const out: Suggestion[] = [];
  const seen = new Set<string>();
  const add = (s: Suggestion) => {
    if (seen.has(s.label) || !s.label.startsWith(ctx.prefix)) return;
    seen.add(s.label);
    out.push(s);
  };
  if (ctx.kind === 'key') {
    for (const s of here) {
      for (const [name, prop] of Object.entries(s.properties ?? {})) {
        if (ctx.siblings.includes(name)) continue;
        const r = resolve(root, prop);
        add({ label: name, insert: `${name}: `, type: 'property', detail: r?.description ?? prop.description });
      }
    }
    return out;
  }
  for (const s of here) {
    const prop = variants(root, s.properties?.[ctx.key ?? '']);
    for (const p of prop) {
      for (const v of p.enum ?? []) {
        if (typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean') {
          add({ label: String(v), insert: String(v), type: 'enum', detail: p.default === v ? 'default' : undefined });
        }
      }
      if (p.const !== undefined) add({ label: String(p.const), insert: String(p.const), type: 'enum' });
      const types = Array.isArray(p.type) ? p.type : [p.type];
      if (types.includes('boolean')) {
        add({ label: 'true', insert: 'true', type: 'keyword' });
        add({ label: 'false', insert: 'false', type: 'keyword' });
      }
    }
  }
  return out;
}
