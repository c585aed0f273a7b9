import { describe, expect, it } from 'vitest';
import { generatePassword, maxPasswordBytes, passwordProblem, roleChange, roles, utf8Bytes } from './users';

describe('roleChange', () => {
  it('is null when nothing changes or the role is unknown', () => {
    expect(roleChange('alice', 'editor', 'editor', false)).toBeNull();
    expect(roleChange('alice', 'editor', 'node', false)).toBeNull();
    expect(roleChange('alice', 'editor', '', false)).toBeNull();
  });

  it.each([
    ['viewer', 'editor', 'Promote alice to editor?', /alice becomes an editor: also publishes/],
    ['viewer', 'admin', 'Promote alice to admin?', /alice becomes an admin: also manages users/],
    ['admin', 'viewer', 'Demote alice to viewer?', /can no longer manage users, tokens, settings or alerts/],
    ['editor', 'viewer', 'Demote alice to viewer?', /can no longer publish or review changes/],
  ])('%s → %s for someone else', (from, to, title, message) => {
    const c = roleChange('alice', from, to, false);
    expect(c?.title).toBe(title);
    expect(c?.message).toMatch(message);
    expect(c?.message).toMatch(/they stay signed in/);
    expect(c?.demotesSelf).toBe(false);
  });

  it('warns an admin who demotes themself', () => {
    const c = roleChange('root', 'admin', 'editor', true);
    expect(c).toEqual({
      title: 'Make yourself an editor?',
      message: expect.stringMatching(/^You become an editor: .*You can no longer manage .*You lose access to this page/),
      demotesSelf: true,
    });
  });

  it('has every role ordered least to most', () => {
    expect(roles).toEqual(['viewer', 'support', 'editor', 'admin']);
  });
});

describe('passwordProblem', () => {
  it.each([
    ['', '', /at least 8/],
    ['1234567', '1234567', /at least 8/],
    ['12345678', '12345679', /differ/],
    ['x'.repeat(73), 'x'.repeat(73), /at most 72 bytes; this one has 73/],
    // 24 × "é" is 24 characters but 48 bytes; 37 × "é" is 74 bytes.
    ['é'.repeat(37), 'é'.repeat(37), /this one has 74/],
  ])('%j / %j is refused', (pw, again, want) => {
    expect(passwordProblem(pw, again)).toMatch(want);
  });

  it.each([['12345678'], ['x'.repeat(maxPasswordBytes)], ['é'.repeat(36)], ['ünïcödé-pässwörd']])('%j is accepted', (pw) => {
    expect(passwordProblem(pw, pw)).toBeNull();
  });

  it('counts bytes of UTF-8, as the console does', () => {
    expect(utf8Bytes('abc')).toBe(3);
    expect(utf8Bytes('é')).toBe(2);
    expect(utf8Bytes('🔑')).toBe(4);
  });
});

describe('generatePassword', () => {
  it('makes passwords the console accepts, from the unambiguous alphabet', () => {
    const pw = generatePassword();
    expect(pw).toHaveLength(20);
    expect(pw).toMatch(/^[a-km-zA-HJ-NP-Z2-9]+$/);
    expect(passwordProblem(pw, pw)).toBeNull();
    expect(generatePassword()).not.toBe(pw);
  });

  it('draws again rather than bias: bytes past the last whole alphabet are skipped', () => {
    // 57 letters: 256 - 256 % 57 = 228; bytes 228..255 must not be used.
    let call = 0;
    const random = (b: Uint8Array) => {
      b.fill(call++ === 0 ? 250 : 1);
      return b;
    };
    expect(generatePassword(4, random)).toBe('bbbb');
    expect(call).toBe(2);
  });
});
