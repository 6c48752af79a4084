// The Node Client: the shared ComposerClient over HTTP/2 gRPC, token and address from the environment.
import type { Interceptor, Transport } from "@connectrpc/connect";

import { ComposerClient, type BaseClientOptions } from "./client.js";
import { callerTraceHeaders } from "./tracing.js";
import { createNodeTransport, resolveAddress, resolveToken } from "./transport-node.js";

/** Options of the Node {@link Client}. */
export interface NodeClientOptions extends BaseClientOptions {
  /**
   * The server: `host:port`, `http://host:port` or `https://host:port` (default `COMPOSER_ADDRESS`,
   * else 127.0.0.1:7070). A malformed one throws a TypeError from the constructor.
   */
  address?: string;
  /** TLS to a `host:port` address (as `https://host:port`). */
  tls?: boolean;
  /** connect interceptors for every call. */
  interceptors?: Interceptor[];
  /** A transport of your own (then `address`, `tls` and `interceptors` are not used). */
  transport?: Transport;
}

/**
 * A client of a Composer server from Node, over HTTP/2 gRPC. The token is `token`, else
 * `COMPOSER_TOKEN`; the address `address`, else `COMPOSER_ADDRESS`. Call {@link close} when done
 * (or use `await using`).
 */
export class Client extends ComposerClient {
  readonly address: string;
  readonly #close: () => void;

  constructor(options: NodeClientOptions = {}) {
    // A malformed address throws here, not at the first call (none is used with a transport).
    const address = resolveAddress(options.address, options.transport ? undefined : { tls: options.tls ?? false });
    let close = (): void => {};
    let transport = options.transport;
    if (!transport) {
      const made = createNodeTransport(address, {
        ...(options.tls ? { tls: true } : {}),
        ...(options.interceptors ? { interceptors: options.interceptors } : {}),
      });
      transport = made.transport;
      close = made.close;
    }
    super({
      transport,
      token: resolveToken(options.token),
      traceHeaders: callerTraceHeaders,
      ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}),
    });
    this.address = address;
    this.#close = close;
  }

  /** Closes the connection (calls still running fail). */
  override close(): void {
    this.#close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }
}
