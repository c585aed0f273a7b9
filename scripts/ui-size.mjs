#!/usr/bin/env node
// ui-size.mjs — the initial JavaScript of the built UI, gzipped, against the
// 150 KB budget. "Initial" is what index.html loads before the
// app runs: its module script and the chunks it preloads. Lazy chunks (the
// CodeMirror editor) are listed but not counted. Exit 1 over budget.
//
//   node scripts/ui-size.mjs            after `npm run build`
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

const budget = 150 * 1024;
const dist = join(dirname(fileURLToPath(import.meta.url)), '..', 'web', 'dist');

let html;
try {
  html = readFileSync(join(dist, 'index.html'), 'utf8');
} catch {
  console.error('ui-size: web/dist/index.html is missing: run `npm run build` first');
  process.exit(1);
}

const initial = new Set();
for (const m of html.matchAll(/<script[^>]*\ssrc="\/([^"]+)"/g)) initial.add(m[1]);
for (const m of html.matchAll(/<link[^>]*rel="modulepreload"[^>]*href="\/([^"]+)"/g)) initial.add(m[1]);
const css = [...html.matchAll(/<link[^>]*rel="stylesheet"[^>]*href="\/([^"]+)"/g)].map((m) => m[1]);

const gz = (file) => gzipSync(readFileSync(join(dist, file)), { level: 9 }).length;
const kb = (n) => `${(n / 1024).toFixed(1)} KB`;

let total = 0;
console.log('initial JavaScript (gzip -9):');
for (const f of initial) {
  const n = gz(f);
  total += n;
  console.log(`  ${f.padEnd(40)} ${kb(n)}`);
}
for (const f of css) console.log(`  ${f.padEnd(40)} ${kb(gz(f))} (CSS, not counted)`);
const lazy = readdirSync(join(dist, 'assets')).filter((f) => f.endsWith('.js') && !initial.has(`assets/${f}`));
for (const f of lazy) console.log(`  assets/${f.padEnd(33)} ${kb(gz(`assets/${f}`))} (lazy, not counted)`);
console.log(`initial JavaScript total: ${kb(total)} of ${kb(budget)} budget`);
if (total > budget) {
  console.error('ui-size: initial JavaScript is over budget');
  process.exit(1);
}
