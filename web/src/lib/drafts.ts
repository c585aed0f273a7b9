// Unpublished edits, kept in sessionStorage so that a session that expires
// (or a reload) loses no work: the editor saves on every change and restores
// on open. Per browser tab, cleared on publish or discard.

/** Draft is an edit in progress of one domain. */
export interface Draft {
  /** The edited YAML. */
  yaml: string;
  /** The YAML the edit started from (for "reload and reapply"). */
  baseYaml: string;
  /** The version the edit is based on (the publish's base_version). */
  baseVersion: number;
  /** The change message typed so far, if any. */
  message?: string;
  /** When it was saved, RFC 3339. */
  savedAt: string;
}

const prefix = 'sluice.draft.';

/** draftKey is where a domain's draft lives. */
export function draftKey(domain: string): string {
  return prefix + domain;
}

/** loadDraft returns a saved draft, or null when there is none or it is unreadable. */
export function loadDraft(store: Storage, key: string): Draft | null {
  const raw = store.getItem(key);
  if (!raw) return null;
  try {
    const d = JSON.parse(raw) as Partial<Draft>;
    if (typeof d.yaml !== 'string' || typeof d.baseYaml !== 'string' || typeof d.baseVersion !== 'number') return null;
    const message = typeof d.message === 'string' ? d.message : undefined;
    return { yaml: d.yaml, baseYaml: d.baseYaml, baseVersion: d.baseVersion, message, savedAt: String(d.savedAt ?? '') };
  } catch {
    return null;
  }
}

/** saveDraft stores a draft; a full storage only loses the draft, never the edit on screen. */
export function saveDraft(store: Storage, key: string, d: Omit<Draft, 'savedAt'>, now = new Date()): void {
  try {
    store.setItem(key, JSON.stringify({ ...d, savedAt: now.toISOString() }));
  } catch {
    // Quota exceeded or storage disabled: nothing better to do.
  }
}

/** clearDraft forgets a draft. */
export function clearDraft(store: Storage, key: string): void {
  store.removeItem(key);
}

/** listDrafts names the domains with a saved draft, for the domains list. */
export function listDrafts(store: Storage): string[] {
  const out: string[] = [];
  for (let i = 0; i < store.length; i++) {
    const k = store.key(i);
    if (k?.startsWith(prefix)) out.push(k.slice(prefix.length));
  }
  return out.sort();
}
