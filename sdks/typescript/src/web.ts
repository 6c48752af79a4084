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
 * server's `maxMessageBytes`). `downloadBlob`, `resolvePayload` and `waitForResult` work, over
 * the server's stream even where it gives presigned URLs (see below).
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
    // No presigned URLs (C24) here: a page's fetch to the bucket is cross-origin, so it works only
    // where the bucket's CORS rules allow this page's origin (and PUT). Where they do not, every
    // transfer would first fail and then fall back to the stream, and the browser itself prints
    // the refused request's URL, a credential while it lives, to the console, which the page
    // cannot prevent. The browser stays on the server's streams.
    super({
      transport,
      token: options.token,
      clientStreaming: false,
      blobUrls: false,
      ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}),
    });
  }
}

export * from "./common.js";
