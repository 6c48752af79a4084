// The Node transport: HTTP/2 gRPC over @connectrpc/connect-node.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { createLeanGrpcTransport } from "./grpc-unary-node.js";

/** Where `composer serve` and `composer dev` listen by default. */
export const DEFAULT_ADDRESS = "127.0.0.1:7070";

/** The server address: the option, else `COMPOSER_ADDRESS`, else 127.0.0.1:7070. */
export function resolveAddress(address?: string): string {
  return address || process.env["COMPOSER_ADDRESS"] || DEFAULT_ADDRESS;
}

/** The bearer token: the option (an empty string means none), else `COMPOSER_TOKEN`. */
export function resolveToken(token?: string): string | undefined {
  const chosen = token !== undefined ? token : process.env["COMPOSER_TOKEN"];
  return chosen ? chosen : undefined;
}

/** `host:port` (or a full URL) as a base URL. */
export function baseUrlOf(address: string, tls = false): string {
  if (/^https?:\/\//.test(address)) return address.replace(/\/+$/, "");
  return `${tls ? "https" : "http"}://${address}`;
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
