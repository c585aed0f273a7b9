// The form view's model of a domain and its round trip with YAML.
//
// The form edits a plain object (what the YAML parses to). Going back to
// YAML does not re-render the whole file: applyModel patches the original
// document in place, value by value, so untouched parts keep their layout,
// quoting, flow style and most comments. Comments attached to a removed item
// go with it, and new items get the library's standard block layout.
import { Document, isMap, isScalar, isSeq, parseDocument, type Node } from 'yaml';
import { messageOf } from './errors';

/** The units a rate limit can be counted over (rules.Unit). */
export const units = ['second', 'minute', 'hour', 'day', 'week', 'month', 'year'] as const;

/** The counting algorithms (rules.Algorithm); token_bucket is the default. */
export const algorithms = [
  'token_bucket',
  'leaky_bucket',
  'fixed_window',
  'sliding_window_log',
  'sliding_window_counter',
] as const;

/** The failure modes (rules.FailureMode); open is the default. */
export const failureModes = ['open', 'closed', 'local'] as const;
/** consistencies: exact asks the store on every check, async counts on the node and flushes. */
export const consistencies = ['exact', 'async'] as const;

/** RateLimitModel is a descriptor's rate_limit; unknown fields are kept as they are. */
export interface RateLimitModel {
  unit?: string;
  requests_per_unit?: number;
  unlimited?: boolean;
  name?: string;
  [field: string]: unknown;
}

/** DescriptorModel is one node of the descriptor tree; unknown fields are kept. */
export interface DescriptorModel {
  key: string;
  value?: string;
  rate_limit?: RateLimitModel;
  algorithm?: string;
  burst?: number;
  shadow_mode?: boolean;
  descriptors?: DescriptorModel[];
  [field: string]: unknown;
}

/** DomainModel is a whole domain file. */
export interface DomainModel {
  domain: string;
  descriptors?: DescriptorModel[];
  [field: string]: unknown;
}

/** YamlProblem is a syntax problem found while parsing, with a 1-based position. */
export interface YamlProblem {
  line: number;
  column: number;
  message: string;
}

/** ParseResult is either a model or the reasons there is none. */
export type ParseResult = { ok: true; model: DomainModel } | { ok: false; problems: YamlProblem[] };

function parse(text: string): Document.Parsed {
  return parseDocument(text, { prettyErrors: true, keepSourceTokens: false });
}

function problemsOf(doc: Document.Parsed): YamlProblem[] {
  return doc.errors.map((e) => ({
    line: e.linePos?.[0]?.line ?? 1,
    column: e.linePos?.[0]?.col ?? 1,
    // prettyErrors appends " at line L, column C:" and an excerpt; the
    // position is shown separately.
    message: e.message.split(/ at line \d+, column \d+/)[0],
  }));
}

/**
 * parseDomain parses a domain's YAML for the form. It fails on syntax
 * errors and when the file is not a mapping; the server validates the rest.
 */
export function parseDomain(text: string): ParseResult {
  const doc = parse(text);
  if (doc.errors.length > 0) return { ok: false, problems: problemsOf(doc) };
  if (doc.contents === null) {
    return { ok: true, model: { domain: '' } };
  }
  if (!isMap(doc.contents)) {
    const line = lineOf(text, doc.contents.range?.[0] ?? 0);
    return { ok: false, problems: [{ line, column: 1, message: 'the file must be a mapping with "domain" and "descriptors"' }] };
  }
  const js = doc.toJS({ maxAliasCount: 100 }) as Record<string, unknown>;
  if (typeof js.domain !== 'string') js.domain = js.domain == null ? '' : String(js.domain);
  if (js.descriptors != null && !Array.isArray(js.descriptors)) {
    return { ok: false, problems: [{ line: 1, column: 1, message: '"descriptors" must be a list for the form view' }] };
  }
  return { ok: true, model: js as DomainModel };
}

function lineOf(text: string, offset: number): number {
  let line = 1;
  for (let i = 0; i < offset && i < text.length; i++) if (text[i] === '\n') line++;
  return line;
}

/** modelToYaml renders a model as fresh YAML (used when there is no original text). */
export function modelToYaml(model: DomainModel): string {
  return new Document(model).toString({ lineWidth: 0 });
}

/**
 * applyModel returns baseText changed so that it parses to `after`, given
 * that it parses to `before`. Only the values that differ are touched. When
 * baseText is not a mapping (or empty), the model is rendered fresh.
 */
export function applyModel(baseText: string, before: unknown, after: DomainModel): string {
  if (deepEqual(before, after)) return baseText;
  const doc = parse(baseText);
  if (doc.errors.length > 0 || !isMap(doc.contents)) return modelToYaml(after);
  patch(doc, [], doc.contents, before, after, []);
  return doc.toString(layoutOf(baseText));
}

/** Reapplied is the result of reapply: the merged YAML and the fields both sides changed. */
export type Reapplied = { ok: true; yaml: string; conflicts: string[] } | { ok: false; reason: string };

/**
 * reapply replays the edit baseYaml → editedYaml on top of latestYaml (a
 * newer version of the same domain, published by someone else meanwhile).
 * Fields that the other change also modified take the edit's value and are
 * listed in conflicts, for the user to review before publishing again.
 */
export function reapply(baseYaml: string, editedYaml: string, latestYaml: string): Reapplied {
  const b = parseDomain(baseYaml);
  const e = parseDomain(editedYaml);
  if (!b.ok) return { ok: false, reason: 'the version you started from does not parse' };
  if (!e.ok) return { ok: false, reason: 'your edit has YAML syntax errors' };
  const doc = parse(latestYaml);
  if (doc.errors.length > 0 || !isMap(doc.contents)) return { ok: false, reason: 'the latest version is not a YAML mapping' };
  const conflicts: string[] = [];
  try {
    patch(doc, [], doc.contents, b.model, e.model, conflicts);
  } catch (err) {
    return { ok: false, reason: messageOf(err) };
  }
  return { ok: true, yaml: doc.toString(layoutOf(latestYaml)), conflicts: [...new Set(conflicts)] };
}

type Path = (string | number)[];

/**
 * layoutOf guesses how a file is laid out (indent width, whether list items
 * are indented under their key, spaces inside flow braces), so that the
 * re-rendered document only differs where the model changed.
 */
export function layoutOf(text: string): { lineWidth: number; indent: number; indentSeq: boolean; flowCollectionPadding: boolean } {
  return { lineWidth: 0, indent: mapIndent(text), indentSeq: !/^( *)[^\s#-][^\n]*:[ \t]*\n\1- /m.test(text), flowCollectionPadding: /\{ \S/.test(text) && !/\{[^\s}]/.test(text) };
}

// mapIndent finds how far a nested mapping is indented under its key: the
// first "key:" line that opens a block, compared with the line after it.
function mapIndent(text: string): number {
  const lines = text.split('\n').filter((l) => l.trim() !== '' && !l.trimStart().startsWith('#'));
  for (let i = 0; i + 1 < lines.length; i++) {
    const open = /^( *)(- +)?[^\s#-][^:#]*:[ \t]*(#.*)?$/.exec(lines[i]);
    if (!open) continue;
    const next = /^( *)(\S)/.exec(lines[i + 1]);
    if (!next) continue;
    const d = next[1].length - open[1].length - (open[2]?.length ?? 0);
    if (d > 0) return Math.min(d, 8);
  }
  return 2;
}

function isPlain(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function nodeValue(doc: Document, value: unknown): unknown {
  // Scalars go in raw, so YAMLMap.set keeps the existing node (and its
  // comments and quoting); collections become nodes.
  return value === null || typeof value !== 'object' ? value : doc.createNode(value);
}

function jsOf(node: unknown): unknown {
  if (isScalar(node)) return node.value;
  if (isMap(node) || isSeq(node)) return node.toJSON();
  return node;
}

// patch edits doc at path from `before` to `after`. node is the document's
// node at path. Where that node does not hold `before` (reapplying onto a
// newer version), the path is recorded in conflicts.
function patch(doc: Document, path: Path, node: unknown, before: unknown, after: unknown, conflicts: string[]): void {
  if (deepEqual(before, after)) return;
  if (isPlain(before) && isPlain(after) && isMap(node)) {
    for (const k of Object.keys(before)) {
      if (!(k in after) || after[k] === undefined) {
        if (!deepEqual(jsOf(node.get(k, true)), before[k])) conflicts.push(pathToString([...path, k]));
        node.delete(k);
      }
    }
    for (const [k, v] of Object.entries(after)) {
      if (v === undefined) continue;
      if (k in before && before[k] !== undefined) {
        patch(doc, [...path, k], node.get(k, true), before[k], v, conflicts);
      } else {
        if (node.has(k) && !deepEqual(jsOf(node.get(k, true)), v)) conflicts.push(pathToString([...path, k]));
        node.set(k, nodeValue(doc, v));
      }
    }
    return;
  }
  if (Array.isArray(before) && Array.isArray(after) && isSeq(node)) {
    // One item removed (the form's "Remove"): delete that node so its
    // neighbours keep their own comments.
    if (after.length === before.length - 1) {
      let i = 0;
      while (i < after.length && deepEqual(before[i], after[i])) i++;
      if (before.slice(i + 1).every((b, j) => deepEqual(b, after[i + j]))) {
        if (!deepEqual(jsOf(node.get(i, true)), before[i])) conflicts.push(pathToString([...path, i]));
        node.delete(i);
        return;
      }
    }
    const common = Math.min(before.length, after.length);
    for (let i = 0; i < common; i++) patch(doc, [...path, i], node.get(i, true), before[i], after[i], conflicts);
    for (let i = before.length - 1; i >= after.length; i--) node.delete(i);
    for (let i = before.length; i < after.length; i++) node.add(nodeValue(doc, after[i]));
    return;
  }
  if (!deepEqual(jsOf(node), before)) conflicts.push(pathToString(path));
  if (isScalar(node) && (after === null || typeof after !== 'object')) {
    node.value = after;
    return;
  }
  if (path.length === 0) {
    doc.contents = doc.createNode(after) as Document['contents'];
    return;
  }
  doc.setIn(path, nodeValue(doc, after) as Node);
}

/** deepEqual compares JSON-like values. */
export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((v, i) => deepEqual(v, bb[i]));
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  const ak = Object.keys(ao).filter((k) => ao[k] !== undefined);
  const bk = Object.keys(bo).filter((k) => bo[k] !== undefined);
  return ak.length === bk.length && ak.every((k) => deepEqual(ao[k], bo[k]));
}

/** newDescriptor is what "Add descriptor" inserts: a key and a modest limit to edit. */
export function newDescriptor(key = ''): DescriptorModel {
  return { key, rate_limit: { unit: 'minute', requests_per_unit: 100 } };
}

/** newDomainYaml is the starting text for a new domain. */
export function newDomainYaml(name: string): string {
  return modelToYaml({ domain: name, descriptors: [newDescriptor('remote_address')] });
}

/** LimitSummary is one limit of a domain, flattened from the descriptor tree. */
export interface LimitSummary {
  /** The descriptor path, like "api_key › route=/search". */
  match: string;
  /** The limit, like "100 / minute", "unlimited" or "no limit". */
  limit: string;
  algorithm: string;
  shadow: boolean;
  name?: string;
}

function entry(d: DescriptorModel): string {
  const key = String(d.key ?? '?');
  return d.value === undefined || d.value === null || d.value === '' ? key : `${key}=${String(d.value)}`;
}

/** describeLimit renders a rate_limit for people: "100 / minute", "unlimited". */
export function describeLimit(rl: RateLimitModel | undefined): string {
  if (!rl) return 'no limit';
  if (rl.unlimited === true) return 'unlimited';
  const n = typeof rl.requests_per_unit === 'number' ? rl.requests_per_unit.toLocaleString('en-US') : String(rl.requests_per_unit ?? '?');
  return `${n} / ${String(rl.unit ?? '?')}`;
}

/** summarize lists every limit of a domain, depth first, in file order. */
export function summarize(model: DomainModel): LimitSummary[] {
  const out: LimitSummary[] = [];
  const walk = (ds: DescriptorModel[] | undefined, prefix: string[]) => {
    if (!Array.isArray(ds)) return;
    for (const d of ds) {
      if (!isPlain(d)) continue;
      const path = [...prefix, entry(d)];
      if (d.rate_limit) {
        out.push({
          match: path.join(' › '),
          limit: describeLimit(d.rate_limit),
          algorithm: typeof d.algorithm === 'string' && d.algorithm !== '' ? d.algorithm : 'token_bucket',
          shadow: d.shadow_mode === true,
          name: typeof d.rate_limit.name === 'string' ? d.rate_limit.name : undefined,
        });
      }
      walk(d.descriptors, path);
    }
  };
  walk(model.descriptors, []);
  return out;
}

/** summarizeYaml is summarize for YAML text; unparsable text has no summary. */
export function summarizeYaml(text: string): LimitSummary[] | null {
  const r = parseDomain(text);
  return r.ok ? summarize(r.model) : null;
}

/**
 * pathToString renders a form path as the server names fields in its
 * validation errors: descriptors[0].descriptors[1].rate_limit.unit.
 */
export function pathToString(path: readonly (string | number)[]): string {
  let s = '';
  for (const p of path) {
    if (typeof p === 'number') s += `[${p}]`;
    else s += s === '' ? p : `.${p}`;
  }
  return s;
}
