// One way to turn whatever a failed call threw into a line for people.

/**
 * messageOf is the message of an Error (an APIError carries the console's own
 * message), or the thrown value as text when something threw a non-Error.
 */
export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
