import { describe, expect, it } from 'vitest';
import { clearDraft, draftKey, listDrafts, loadDraft, saveDraft } from './drafts';

// memoryStorage is a Storage for Node, where sessionStorage does not exist.
function memoryStorage(): Storage {
  const m = new Map<string, string>();
  return {
    get length() {
      return m.size;
    },
    clear: () => m.clear(),
    getItem: (k) => m.get(k) ?? null,
    key: (i) => [...m.keys()][i] ?? null,
    removeItem: (k) => void m.delete(k),
    setItem: (k, v) => void m.set(k, String(v)),
  };
}

describe('drafts', () => {
  it('saves, lists, loads and clears', () => {
    const s = memoryStorage();
    const key = draftKey('api');
    saveDraft(s, key, { yaml: 'domain: api\n# edited', baseYaml: 'domain: api\n', baseVersion: 4, message: 'lower' }, new Date('2026-05-01T10:00:00Z'));
    saveDraft(s, draftKey('web'), { yaml: 'domain: web\n', baseYaml: '', baseVersion: 0 });
    s.setItem('sluice.csrf', 'x');
    expect(listDrafts(s)).toEqual(['api', 'web']);
    expect(loadDraft(s, key)).toEqual({ yaml: 'domain: api\n# edited', baseYaml: 'domain: api\n', baseVersion: 4, message: 'lower', savedAt: '2026-05-01T10:00:00.000Z' });
    clearDraft(s, key);
    expect(loadDraft(s, key)).toBeNull();
  });

  it('ignores unreadable drafts', () => {
    const s = memoryStorage();
    s.setItem(draftKey('api'), '{not json');
    expect(loadDraft(s, draftKey('api'))).toBeNull();
    s.setItem(draftKey('api'), '{"yaml": 1}');
    expect(loadDraft(s, draftKey('api'))).toBeNull();
  });

  it('survives a full storage', () => {
    const s = memoryStorage();
    s.setItem = () => {
      throw new Error('QuotaExceededError');
    };
    expect(() => saveDraft(s, 'k', { yaml: '', baseYaml: '', baseVersion: 0 })).not.toThrow();
  });
});
