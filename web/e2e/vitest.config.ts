// The end-to-end suite: real console and enforcers, headless Chromium.
// Run with `npm run e2e` after `make build` (scripts/ui-test.sh does both).
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  root: fileURLToPath(new URL('../..', import.meta.url)),
  cacheDir: 'node_modules/.vite-e2e',
  test: {
    include: ['web/e2e/**/*.e2e.ts'],
    environment: 'node',
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 90_000,
    // Steps share one browser and one console, in order.
    sequence: { concurrent: false },
  },
});
