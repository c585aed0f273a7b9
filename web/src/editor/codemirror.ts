// The YAML view's editor: CodeMirror 6 with YAML highlighting, completion
// from the domain JSON Schema, and the server's line:column errors as lint
// diagnostics. Loaded with a dynamic import, so it is not part of the
// initial JavaScript.
//
// CSP: CodeMirror injects its styles through style-mod, which writes a
// <style> element into a document (blocked by the console's
// style-src 'self') but uses a constructed stylesheet inside a shadow root
// (CSSOM, which CSP allows). So the editor always lives in a shadow root.
import { autocompletion, closeBrackets, completionKeymap, type CompletionContext, type CompletionResult } from '@codemirror/autocomplete';
import { defaultKeymap, history, historyKeymap, indentWithTab } from '@codemirror/commands';
import { yaml } from '@codemirror/lang-yaml';
import { bracketMatching, HighlightStyle, indentOnInput, indentUnit, syntaxHighlighting } from '@codemirror/language';
import { forceLinting, lintGutter, linter, type Diagnostic } from '@codemirror/lint';
import { Compartment, EditorState, StateEffect, StateField, type Text } from '@codemirror/state';
import {
  drawSelection,
  EditorView,
  highlightActiveLine,
  highlightActiveLineGutter,
  keymap,
  lineNumbers,
  placeholder,
} from '@codemirror/view';
import { tags as t } from '@lezer/highlight';
import { parseDomain } from '../lib/ruleform';
import { cursorContext, fallbackSchema, suggestions, type JSONSchema } from '../lib/schema';

/** Problem is a server validation problem: 1-based line and column. */
export interface Problem {
  line?: number;
  column?: number;
  path?: string;
  message: string;
}

/** EditorOptions configures a new editor. */
export interface EditorOptions {
  text: string;
  readOnly: boolean;
  label: string;
  onChange: (text: string) => void;
  /** The schema for completion; read on every completion, so it can arrive late. */
  schema: () => JSONSchema;
}

/** YamlEditor controls a mounted editor. */
export interface YamlEditor {
  setText(text: string): void;
  setReadOnly(readOnly: boolean): void;
  setProblems(problems: readonly Problem[]): void;
  goTo(line: number, column: number): void;
  destroy(): void;
}

// Server problems, kept as document ranges that move with edits until the
// next publish attempt replaces them.
const setServerProblems = StateEffect.define<Diagnostic[]>();
const serverProblems = StateField.define<Diagnostic[]>({
  create: () => [],
  update(value, tr) {
    for (const e of tr.effects) if (e.is(setServerProblems)) return e.value;
    if (!tr.docChanged || value.length === 0) return value;
    return value.map((d) => ({ ...d, from: tr.changes.mapPos(d.from), to: tr.changes.mapPos(d.to, 1) }));
  },
});

/** positionOf turns a 1-based line and column into a document offset, clamped. */
export function positionOf(doc: Text, line: number, column: number): number {
  const l = doc.line(Math.min(Math.max(1, line), doc.lines));
  return Math.min(l.from + Math.max(0, column - 1), l.to);
}

function diagnosticAt(doc: Text, line: number, column: number, message: string, source: string): Diagnostic {
  const from = positionOf(doc, line, column);
  const l = doc.lineAt(from);
  // Underline the word at the position, or the rest of the line.
  const rest = doc.sliceString(from, l.to);
  const word = /^[^\s:,{}[\]]+/.exec(rest);
  const to = word ? from + word[0].length : l.to;
  return { from, to: Math.max(to, from), severity: 'error', message, source };
}

// syntaxLinter reports YAML syntax errors as the user types, plus the
// server's problems from the last publish attempt.
const syntaxLinter = linter(
  (view) => {
    const doc = view.state.doc;
    const out: Diagnostic[] = [...view.state.field(serverProblems)];
    const r = parseDomain(doc.toString());
    if (!r.ok) {
      for (const p of r.problems) out.push(diagnosticAt(doc, p.line, p.column, p.message, 'YAML'));
    }
    return out;
  },
  {
    delay: 300,
    // New server problems must show without waiting for an edit
    // (forceLinting alone does nothing when no lint run is pending).
    needsRefresh: (u) => u.transactions.some((tr) => tr.effects.some((e) => e.is(setServerProblems))),
  },
);

// The highlight colours are CSS variables from app.css, so the light and
// dark themes both apply without rebuilding the editor.
const highlight = HighlightStyle.define([
  { tag: t.propertyName, color: 'var(--hl-key)' },
  { tag: [t.string, t.special(t.string)], color: 'var(--hl-string)' },
  { tag: [t.number, t.bool, t.null], color: 'var(--hl-number)' },
  { tag: [t.keyword, t.definitionKeyword], color: 'var(--hl-keyword)' },
  { tag: t.comment, color: 'var(--hl-comment)', fontStyle: 'italic' },
  { tag: [t.meta, t.punctuation, t.separator, t.squareBracket, t.brace], color: 'var(--hl-punct)' },
  { tag: t.invalid, color: 'var(--danger)' },
]);

const theme = EditorView.theme({
  '&': {
    color: 'var(--text)',
    backgroundColor: 'var(--surface)',
    border: '1px solid var(--border)',
    borderRadius: '6px',
    fontSize: '0.9rem',
    minHeight: '24rem',
  },
  '&.cm-focused': { outline: '2px solid var(--focus)', outlineOffset: '1px' },
  '.cm-scroller': { fontFamily: 'var(--mono)', lineHeight: '1.5', minHeight: '24rem' },
  '.cm-content': { caretColor: 'var(--text)' },
  '.cm-cursor, .cm-dropCursor': { borderLeftColor: 'var(--text)' },
  '.cm-gutters': { backgroundColor: 'var(--surface-2)', color: 'var(--muted)', border: 'none', borderRight: '1px solid var(--border)' },
  '.cm-activeLine': { backgroundColor: 'var(--active-line)' },
  '.cm-activeLineGutter': { backgroundColor: 'var(--active-line)' },
  '&.cm-focused .cm-selectionBackground, .cm-selectionBackground, ::selection': { backgroundColor: 'var(--selection)' },
  '.cm-tooltip': { backgroundColor: 'var(--surface)', color: 'var(--text)', border: '1px solid var(--border)' },
  '.cm-tooltip-autocomplete > ul > li[aria-selected]': { backgroundColor: 'var(--accent)', color: 'var(--on-accent)' },
  '.cm-completionDetail': { color: 'inherit', opacity: '0.75', marginLeft: '1em', fontStyle: 'normal' },
  '.cm-diagnostic-error': { borderLeftColor: 'var(--danger)' },
  '.cm-lintRange-error': { textDecoration: 'underline wavy var(--danger)', backgroundImage: 'none' },
  '.cm-placeholder': { color: 'var(--muted)' },
});

function schemaCompletion(schema: () => JSONSchema) {
  return (ctx: CompletionContext): CompletionResult | null => {
    const text = ctx.state.doc.toString();
    const where = cursorContext(text, ctx.pos);
    if (!where) return null;
    if (where.prefix === '' && !ctx.explicit && where.kind === 'key') return null;
    const options = suggestions(schema(), where);
    if (options.length === 0) return null;
    // A console schema may lack descriptions: borrow the built-in ones.
    const described = new Map(suggestions(fallbackSchema, where).map((s) => [s.label, s.detail]));
    for (const o of options) o.detail ??= described.get(o.label);
    return {
      from: where.from,
      options: options.map((s) => ({ label: s.label, apply: s.insert, type: s.type, detail: s.detail })),
      validFor: /^[\w.-]*$/,
    };
  };
}

/** createEditor mounts an editor in a shadow root under host. */
export function createEditor(host: HTMLElement, opts: EditorOptions): YamlEditor {
  const shadow = host.shadowRoot ?? host.attachShadow({ mode: 'open' });
  const mount = document.createElement('div');
  shadow.replaceChildren(mount);
  const readOnly = new Compartment();
  let applying = false;

  const view = new EditorView({
    parent: mount,
    root: shadow,
    state: EditorState.create({
      doc: opts.text,
      extensions: [
        lineNumbers(),
        highlightActiveLineGutter(),
        history(),
        drawSelection(),
        indentOnInput(),
        bracketMatching(),
        closeBrackets(),
        highlightActiveLine(),
        indentUnit.of('  '),
        EditorState.tabSize.of(2),
        yaml(),
        syntaxHighlighting(highlight),
        autocompletion({ override: [schemaCompletion(opts.schema)], activateOnTyping: true }),
        serverProblems,
        syntaxLinter,
        lintGutter(),
        placeholder('domain: my-domain'),
        keymap.of([...completionKeymap, ...defaultKeymap, ...historyKeymap, indentWithTab]),
        theme,
        readOnly.of([EditorState.readOnly.of(opts.readOnly), EditorView.editable.of(!opts.readOnly)]),
        EditorView.contentAttributes.of({ 'aria-label': opts.label }),
        EditorView.updateListener.of((u) => {
          if (u.docChanged && !applying) opts.onChange(u.state.doc.toString());
        }),
      ],
    }),
  });

  return {
    setText(text) {
      if (text === view.state.doc.toString()) return;
      applying = true;
      try {
        view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
      } finally {
        applying = false;
      }
    },
    setReadOnly(ro) {
      view.dispatch({ effects: readOnly.reconfigure([EditorState.readOnly.of(ro), EditorView.editable.of(!ro)]) });
    },
    setProblems(problems) {
      const doc = view.state.doc;
      const ds = problems.map((p) =>
        diagnosticAt(doc, p.line ?? 1, p.column ?? 1, p.path ? `${p.path}: ${p.message}` : p.message, 'console'),
      );
      view.dispatch({ effects: setServerProblems.of(ds) });
      forceLinting(view);
    },
    goTo(line, column) {
      const pos = positionOf(view.state.doc, line, column);
      view.dispatch({ selection: { anchor: pos }, scrollIntoView: true });
      view.focus();
    },
    destroy() {
      view.destroy();
    },
  };
}
