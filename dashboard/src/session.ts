// Who is logged in: the token (sessionStorage, so it ends with the tab), its claims decoded for
// display only (the server verifies every call), what its roles may do, and the namespace an
// admin chose to look at.

const TOKEN_KEY = "composer.token";
const NAMESPACE_KEY = "composer.namespace";

export type Role = "admin" | "operator" | "client" | "reader" | "worker";

export interface Claims {
  subject: string;
  namespace: string;
  roles: Role[];
  /** Expiry, or null when the token has no `exp`. */
  expires: Date | null;
}

/** What the roles allow, mirroring RPC_ROLES in server/grpc/src/auth.rs. */
export interface Permissions {
  startRun: boolean;
  sendEvent: boolean;
  cancelRun: boolean;
  retryRun: boolean;
  /** SetSecret, ListSecrets, DeleteSecret. */
  manageSecrets: boolean;
  switchNamespace: boolean;
}

export interface Session {
  token: string;
  claims: Claims;
  /** The namespace the dashboard shows: the token's own, or the one an admin switched to. */
  namespace: string;
  can: Permissions;
}

const KNOWN_ROLES: readonly Role[] = ["admin", "operator", "client", "reader", "worker"];

function base64UrlDecode(text: string): string {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(text.length / 4) * 4, "=");
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** The claims of a JWT, unverified; throws when the text is not a JWT. */
export function decodeClaims(token: string): Claims {
  const parts = token.split(".");
  if (parts.length !== 3 || !parts[1]) throw new Error("this is not a token (a JWT has three parts separated by dots)");
  let payload: Record<string, unknown>;
  try {
    payload = JSON.parse(base64UrlDecode(parts[1])) as Record<string, unknown>;
  } catch {
    throw new Error("this token's payload is not readable JSON");
  }
  const rawRoles = payload["roles"] ?? payload["role"];
  const roleList = Array.isArray(rawRoles) ? rawRoles : typeof rawRoles === "string" ? rawRoles.split(",") : [];
  const roles = roleList.filter((r): r is Role => KNOWN_ROLES.includes(r as Role));
  const exp = typeof payload["exp"] === "number" ? new Date(payload["exp"] * 1000) : null;
  return {
    subject: typeof payload["sub"] === "string" ? payload["sub"] : "",
    namespace: typeof payload["ns"] === "string" ? payload["ns"] : "default",
    roles,
    expires: exp,
  };
}

export function permissionsOf(roles: readonly Role[]): Permissions {
  const any = (...allowed: Role[]): boolean => roles.some((r) => allowed.includes(r));
  return {
    startRun: any("admin", "operator", "client"),
    sendEvent: any("admin", "operator", "client"),
    cancelRun: any("admin", "operator"),
    retryRun: any("admin", "operator"),
    manageSecrets: any("admin", "operator"),
    switchNamespace: any("admin"),
  };
}

export function sessionFor(token: string, namespace?: string): Session {
  const claims = decodeClaims(token);
  const can = permissionsOf(claims.roles);
  return { token, claims, can, namespace: can.switchNamespace && namespace ? namespace : claims.namespace };
}

/**
 * A token handed over in the URL fragment (`#token=...`, as `make dev` prints it) is taken into
 * sessionStorage and removed from the address bar, so it is neither bookmarked nor shared.
 */
export function adoptTokenFromFragment(): void {
  const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ""));
  const token = fragment.get("token");
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  sessionStorage.removeItem(NAMESPACE_KEY);
  window.history.replaceState(window.history.state, "", window.location.pathname + window.location.search);
}

/** The stored session, or null when there is none or its token is unreadable. */
export function loadSession(): Session | null {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) return null;
  try {
    return sessionFor(token, sessionStorage.getItem(NAMESPACE_KEY) ?? undefined);
  } catch {
    return null;
  }
}

export function saveSession(session: Session): void {
  sessionStorage.setItem(TOKEN_KEY, session.token);
  if (session.namespace !== session.claims.namespace) sessionStorage.setItem(NAMESPACE_KEY, session.namespace);
  else sessionStorage.removeItem(NAMESPACE_KEY);
}

export function clearSession(): void {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(NAMESPACE_KEY);
}

export function isExpired(claims: Claims, now = new Date()): boolean {
  return claims.expires !== null && claims.expires.getTime() <= now.getTime();
}
