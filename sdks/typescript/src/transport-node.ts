// The Node transport: HTTP/2 gRPC over @connectrpc/connect-node.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { createLeanGrpcTransport } from "./grpc-unary-node.js";

/** Where `composer serve` and `composer dev` listen by default. */
export const DEFAULT_ADDRESS = "127.0.0.1:7070";

/**
 * The server address: the option, else `COMPOSER_ADDRESS`, else 127.0.0.1:7070. With `check`, a
 * malformed one throws at once (see {@link baseUrlOf}), naming COMPOSER_ADDRESS when it came from
 * there.
 */
export function resolveAddress(address?: string, check?: { tls?: boolean }): string {
  const fromEnv = !address && !!process.env["COMPOSER_ADDRESS"];
  const chosen = address || process.env["COMPOSER_ADDRESS"] || DEFAULT_ADDRESS;
  if (check) baseUrlOf(chosen, check.tls ?? false, fromEnv ? "COMPOSER_ADDRESS" : "");
  return chosen;
}

/** The bearer token: the option (an empty string means none), else `COMPOSER_TOKEN`. */
export function resolveToken(token?: string): string | undefined {
  const chosen = token !== undefined ? token : process.env["COMPOSER_TOKEN"];
  return chosen ? chosen : undefined;
}

/** The forms a server address may take, for error messages. */
const ADDRESS_FORMS = "host:port, http://host:port or https://host:port";

/**
 * Checks a server address and returns its base URL: `host:port` (http, or https with `tls`),
 * `http://host:port` or `https://host:port` (the scheme decides TLS; a URL may leave the port out
 * for 80 / 443). A host may be a name, an IPv4 address or a bracketed IPv6 address. Anything else
 * (a missing or bad port, another scheme, a path, a query, credentials) throws a TypeError at once
 * naming the address and where it came from, rather than a connection error on the first call.
 */
export function baseUrlOf(address: string, tls = false, source = ""): string {
  const where = source ? `${source}=` : "";
  const bad = (why: string): TypeError =>
    new TypeError(`invalid Composer server address ${where}${JSON.stringify(address)}: ${why}; expected ${ADDRESS_FORMS}`);
  const text = address.trim();
  if (text === "") throw bad("it is empty");
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(text)?.[1]?.toLowerCase();
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") throw bad(`the scheme ${scheme}:// is not http:// or https://`);
  if (scheme === "http" && tls) throw bad("http:// with tls: use https:// (or host:port with tls)");
  // `new URL` drops a default port (http://h:80 -> http://h) and accepts none; host:port needs one.
  const port = /:([^:\]/]*)\/?$/.exec(text.replace(/^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//, ""))?.[1];
  if (scheme === undefined && (port === undefined || port === "")) throw bad("it has no port");
  if (port !== undefined && !(/^\d+$/.test(port) && Number(port) >= 1 && Number(port) <= 65_535)) {
    throw bad(`the port ${JSON.stringify(port)} is not a number from 1 to 65535`);
  }
  const withScheme = scheme === undefined ? `${tls ? "https" : "http"}://${text}` : text;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw bad("it is not host:port");
  }
  if (url.hostname === "") throw bad("it names no host");
  if (url.username !== "" || url.password !== "") throw bad("it carries credentials (pass the token as token or COMPOSER_TOKEN)");
  if (url.search !== "" || url.hash !== "" || (url.pathname !== "/" && url.pathname !== "")) throw bad("it has a path, query or fragment");
  return `${url.protocol}//${url.host}`;
}

/** A gRPC (HTTP/2) transport to `address` and the session manager that closes it. */
export function createNodeTransport(
  address: string,
  options: { tls?: boolean; interceptors?: Interceptor[] } = {},
): { transport: Transport; close: () => void } {
  const baseUrl = baseUrlOf(address, options.tls);
  const sessionManager = new Http2SessionManager(baseUrl, { pingIntervalMs: 30_000, pingTimeoutMs: 10_000, idleConnectionTimeoutMs: 60_000 });
  const interceptors = options.interceptors ?? [];
  const grpc = createGrpcTransport({ baseUrl, sessionManager, interceptors });
  // Unary calls straight on the HTTP/2 stream (grpc-unary-node.ts); with interceptors, connect's
  // transport runs them all, as the interceptors expect.
  const transport = interceptors.length === 0 ? createLeanGrpcTransport(baseUrl, sessionManager, grpc) : grpc;
  return { transport, close: () => sessionManager.abort() };
}
