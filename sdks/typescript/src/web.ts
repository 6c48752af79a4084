// The browser entry point, @composer-dev/composer/web: the Client over grpc-web (fetch).
// Nothing here touches Node APIs.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";

import { ComposerClient, type BaseClientOptions } from "./client.js";

/** Options of the browser {@link Client}. */
export interface WebClientOptions extends BaseClientOptions {
  /** The server's URL, e.g. `http://127.0.0.1:7070` (its `--cors-origins` must list this page's origin). */
  baseUrl?: string;
  /** connect interceptors for every call. */
  interceptors?: Interceptor[];
  /** A transport of your own (then `baseUrl` and `interceptors` are not used). */
  transport?: Transport;
}

/**
 * A client of a Composer server from a browser, over grpc-web. Pass the token explicitly.
 * grpc-web cannot stream a request: `uploadBlob` throws UNIMPLEMENTED, and `startRun` /
 * `sendEvent` send a large input or payload inline for the server to offload (it must fit the
 * server's `maxMessageBytes`). `downloadBlob`, `resolvePayload` and `waitForResult` work.
 */
export class Client extends ComposerClient {
  constructor(options: WebClientOptions) {
    const transport =
      options.transport ??
      createGrpcWebTransport({
        baseUrl: (options.baseUrl ?? "").replace(/\/+$/, ""),
        interceptors: options.interceptors ?? [],
      });
    // grpc-web over fetch cannot stream a request: no uploadBlob; large values go inline and the
    // server offloads them (downloadBlob, a response stream, works).
    super({ transport, token: options.token, clientStreaming: false, ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}) });
  }
}

export * from "./common.js";
