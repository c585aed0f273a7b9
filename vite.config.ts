/// <reference types="vitest/config" />
import { defineConfig, type Plugin } from 'vite';
import { svelte } from '@sveltejs/vite-plugin-svelte';

// keepGitkeep re-creates web/dist/.gitkeep after emptyOutDir wiped it, so a
// build leaves `git status` clean and `//go:embed all:dist` always has a file.
function keepGitkeep(): Plugin {
  return {
    name: 'sluice-keep-gitkeep',
    apply: 'build',
    generateBundle() {
      this.emitFile({ type: 'asset', fileName: '.gitkeep', source: '' });
    },
  };
}

// The console serves web/dist (embedded into the Go binary by web/embed.go):
// index.html with Cache-Control no-cache, everything under /assets/ hashed and
// cached as immutable. No inline scripts, so a strict CSP holds.
export default defineConfig({
  root: 'web',
  base: '/',
  // Keep Vite's and Vitest's caches in the repo-root node_modules, not web/node_modules.
  cacheDir: '../node_modules/.vite',
  // configFile: false — there is no svelte.config.js; Svelte 5 strips TypeScript itself.
  plugins: [svelte({ configFile: false }), keepGitkeep()],
  build: {
    outDir: 'dist', // relative to root: web/dist
    emptyOutDir: true,
    assetsDir: 'assets',
    // Never inline assets as data: URLs, so the CSP needs no data: sources.
    assetsInlineLimit: 0,
    sourcemap: false,
  },
  server: {
    // `npm run dev` against a console started by `make run` on :8080.
    proxy: {
      '/api': { target: 'http://127.0.0.1:8080', ws: true },
      '/healthz': 'http://127.0.0.1:8080',
    },
  },
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
  },
});
