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
    // Each file starts its own console, enforcers and database on free
    // ports, so two run side by side: much of a file's time is waiting
    // (for a minute's rollup, a report interval), which the other fills.
    fileParallelism: true,
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 90_000,
    // Steps share one browser and one console, in order.
    sequence: { concurrent: false },
  },
});
