import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../../', import.meta.url));

// api.gen.ts is what `npm run generate` makes of backend/api/openapi.yaml;
// this fails while the committed file is stale.
describe('api.gen.ts', () => {
  it('is what the OpenAPI document generates', () => {
    const pkg = JSON.parse(readFileSync(`${root}package.json`, 'utf8')) as { scripts: Record<string, string> };
    const [bin, ...args] = pkg.scripts.generate.split(' ');
    expect(bin).toBe('openapi-typescript');
    let out = '';
    try {
      execFileSync(process.execPath, [`${root}node_modules/openapi-typescript/bin/cli.js`, ...args, '--check'], { cwd: root, stdio: 'pipe' });
    } catch (err) {
      out = String((err as { stderr?: Buffer }).stderr ?? err);
    }
    expect(out, 'web/src/lib/api.gen.ts is stale: run `make generate`').toBe('');
  }, 30_000);
});
