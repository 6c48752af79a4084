// The name rule of docs/names.md, checked in the page as a hint while a name is typed. The server
// checks again (composer_engine::names) and its answer is the one that counts: these messages
// follow its wording so the two read alike.

/** The longest name, in bytes (every allowed character is one byte). */
export const MAX_NAME_LEN = 64;

/** The rule, in the server's words. */
export const NAME_RULE = "1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit";

const ALPHANUMERIC = /^[A-Za-z0-9]$/;
const ALLOWED = /^[A-Za-z0-9_.-]$/;

/** A character as the server quotes it: control characters escaped. */
function quoted(c: string): string {
  const code = c.codePointAt(0) ?? 0;
  return code < 0x20 || code === 0x7f ? `'\\u{${code.toString(16)}}'` : `'${c}'`;
}

/** What is wrong with `name` under the rule, or null when it follows it. */
export function nameProblem(name: string): string | null {
  if (name.length === 0) return "must not be empty";
  const bytes = new TextEncoder().encode(name).length;
  if (bytes > MAX_NAME_LEN) return `is ${bytes} bytes long; at most ${MAX_NAME_LEN} are allowed`;
  if (name.startsWith("_")) return "names starting with '_' are reserved for the server";
  for (const [at, found] of [...name].entries()) {
    const allowed = at === 0 ? ALPHANUMERIC.test(found) : ALLOWED.test(found);
    if (!allowed) return `character ${quoted(found)} at position ${at} is not allowed`;
  }
  return null;
}
