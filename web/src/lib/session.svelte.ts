// The signed-in user and console-wide facts the pages share.
import * as api from './api';

class Session {
  /** loading until GET /me answers. */
  state = $state<'loading' | 'signed-out' | 'signed-in'>('loading');
  me = $state<api.Me | null>(null);
  /** The session ended under the user (a 401); the login page says so. */
  expired = $state(false);
  /** Where to go back to after signing in again. */
  returnTo = $state('');
  /** Four-eyes: null while unknown or when the console has no settings route. */
  requireApproval = $state<boolean | null>(null);

  role = $derived(this.me?.role ?? '');
  canEdit = $derived(api.canEdit(this.me?.role));
  /** Resets and overrides: support staff, editors and admins. */
  canSupport = $derived(api.canSupport(this.me?.role));
  isAdmin = $derived(this.me?.role === 'admin' && this.me?.all_domains !== false);
  /** mayMintTokens: admins, of every domain or some (their tokens are no wider than they are). */
  mayMintTokens = $derived(this.me?.role === 'admin' && !this.me?.read_only);
  /** scoped: the role holds for some domains only (me.domains). */
  scoped = $derived(this.me?.all_domains === false);

  /** canEditDomain reports whether the user may publish to domain. */
  canEditDomain(domain: string): boolean {
    return api.canEditDomain(this.me, domain);
  }
  who = $derived(this.me?.username ?? this.me?.name ?? '');
}

/** session is the one shared session state. */
export const session = new Session();

/** Notice is a short message shown at the top of the page until dismissed. */
export interface Notice {
  id: number;
  tone: 'ok' | 'error' | 'warn';
  text: string;
  /** A follow-up page ("Watch its effect on live traffic"). */
  link?: { href: string; text: string };
}

class Notices {
  list = $state<Notice[]>([]);
  private next = 1;

  push(tone: Notice['tone'], text: string, link?: Notice['link']): void {
    this.list = [...this.list.slice(-3), { id: this.next++, tone, text, link }];
  }
  dismiss(id: number): void {
    this.list = this.list.filter((n) => n.id !== id);
  }
  clear(): void {
    this.list = [];
  }
}

/** notices are app-wide messages ("Published version 7"). */
export const notices = new Notices();
