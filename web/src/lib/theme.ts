// Light and dark themes: the system's preference unless the user picks one
// with the header's toggle (kept in localStorage).

/** Theme is the user's choice; 'system' follows prefers-color-scheme. */
export type Theme = 'system' | 'light' | 'dark';

const key = 'sluice.theme';

/** savedTheme reads the user's choice. */
export function savedTheme(): Theme {
  try {
    const t = localStorage.getItem(key);
    return t === 'light' || t === 'dark' ? t : 'system';
  } catch {
    return 'system';
  }
}

/** applyTheme sets <html data-theme> (or removes it for 'system') and remembers the choice. */
export function applyTheme(t: Theme): void {
  if (t === 'system') document.documentElement.removeAttribute('data-theme');
  else document.documentElement.setAttribute('data-theme', t);
  try {
    if (t === 'system') localStorage.removeItem(key);
    else localStorage.setItem(key, t);
  } catch {
    // Storage disabled: the choice lasts for this page only.
  }
}

/** nextTheme is the toggle's order: system → light → dark → system. */
export function nextTheme(t: Theme): Theme {
  return t === 'system' ? 'light' : t === 'light' ? 'dark' : 'system';
}
