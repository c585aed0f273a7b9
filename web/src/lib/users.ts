// The Users page's rules: what a role change means for the person, when a
// new password is acceptable, and a generated password. The console decides
// in the end (it refuses demoting the last admin); these make the page say
// so before and after.

/** Role is a console user's role, least to most. */
export type Role = 'viewer' | 'support' | 'editor' | 'admin';

/** roles are the roles a user can have, least to most. */
export const roles: readonly Role[] = ['viewer', 'support', 'editor', 'admin'];

/** roleAbilities says in a few words what each role can do. */
export const roleAbilities: Record<Role, string> = {
  viewer: 'reads rules, history, audit, nodes and live traffic',
  support: "also inspects and resets a customer's counters and grants temporary overrides",
  editor: 'also publishes, rolls back and reviews changes',
  admin: 'also manages users, tokens, settings and alerts',
};

/** The console's password bounds, in bytes of UTF-8 (bcrypt hashes at most 72). */
export const minPasswordBytes = 8;
export const maxPasswordBytes = 72;

/** RoleChange is what the page asks before changing a user's role. */
export interface RoleChange {
  title: string;
  /** What changes for the person, said before it happens. */
  message: string;
  /** The change demotes the signed-in admin: they lose this page. */
  demotesSelf: boolean;
}

function rank(r: string): number {
  return roles.indexOf(r as Role);
}

/**
 * roleChange describes changing username's role from one role to another,
 * for the confirmation; null when there is nothing to change or the role is
 * not one a user can have.
 */
export function roleChange(username: string, from: string, to: string, self: boolean): RoleChange | null {
  if (from === to || rank(to) < 0) return null;
  const up = rank(to) > rank(from);
  const who = self ? 'You' : username;
  const lines = [`${who} ${self ? 'become' : 'becomes'} ${article(to)} ${to}: ${roleAbilities[to as Role]}.`];
  if (from === 'admin') lines.push(`${who} can no longer manage users, tokens, settings or alerts.`);
  else if (from === 'editor' && rank(to) < rank('editor')) lines.push(`${who} can no longer publish or review changes.`);
  if (from === 'support' && to === 'viewer') lines.push(`${who} can no longer reset counters or grant overrides.`);
  const demotesSelf = self && from === 'admin';
  if (demotesSelf) lines.push('You lose access to this page as soon as it is done; another admin has to undo it.');
  if (!self) lines.push('It applies to their next request; they stay signed in.');
  return {
    title: self ? `Make yourself ${article(to)} ${to}?` : `${up ? 'Promote' : 'Demote'} ${username} to ${to}?`,
    message: lines.join(' '),
    demotesSelf,
  };
}

function article(role: string): string {
  return role === 'admin' || role === 'editor' ? 'an' : 'a';
}

/** utf8Bytes is the length of s in UTF-8, as the console measures passwords. */
export function utf8Bytes(s: string): number {
  return new TextEncoder().encode(s).length;
}

/**
 * passwordProblem says what is wrong with a new password and its repetition,
 * or returns null when the console will take it.
 */
export function passwordProblem(password: string, repeat: string): string | null {
  const n = utf8Bytes(password);
  if (n < minPasswordBytes) return `A password has at least ${minPasswordBytes} characters.`;
  if (n > maxPasswordBytes) return `A password has at most ${maxPasswordBytes} bytes; this one has ${n}.`;
  if (password !== repeat) return 'The two passwords differ.';
  return null;
}

// No 0/O, 1/l/I: the password is read out or typed by a person.
const alphabet = 'abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789';

/**
 * generatePassword returns a random password of length characters (about
 * 5.8 bits each: 20 make 117 bits) from random, crypto.getRandomValues by
 * default. Bytes that would bias the choice are drawn again.
 */
export function generatePassword(length = 20, random: (b: Uint8Array) => Uint8Array = (b) => crypto.getRandomValues(b)): string {
  const limit = 256 - (256 % alphabet.length); // the largest multiple of the alphabet's size
  let out = '';
  while (out.length < length) {
    for (const b of random(new Uint8Array(length))) {
      if (b < limit && out.length < length) out += alphabet[b % alphabet.length];
    }
  }
  return out;
}
