// Unary gRPC calls straight on an HTTP/2 stream, for the Node transport.
//
// @connectrpc/connect-node's gRPC transport runs every call through WHATWG Headers, URL parsing
// and chains of async iterables (the request body, the envelope split, the parse), which costs a
// worker more CPU per task than its handlers do. A unary call needs none of that: one envelope
// out, one in, the status in the trailers. This file does exactly that on the same
// Http2SessionManager (its connection, keep-alive and reconnection), with connect's error
// semantics: the same codes, messages, details and metadata for the same failures. Streaming
// calls, and every call of a transport with interceptors, stay on connect's transport.
import type { ClientHttp2Stream, IncomingHttpHeaders, IncomingHttpStatusHeader } from "node:http2";

import { create, fromBinary, isMessage, toBinary, type DescMessage, type DescMethodUnary, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type Transport, type UnaryResponse } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { encodeEnvelope, getAbortSignalReason } from "@connectrpc/connect/protocol";
import { codeFromHttpStatus, findTrailerError, parseContentType, validateTrailer } from "@connectrpc/connect/protocol-grpc";

const USER_AGENT = "connect-es/2.1.2";

/** What a transport's `unary` takes as headers (a Headers, a record or pairs). */
type HeaderInit = Parameters<Transport["unary"]>[3];

/**
 * A transport whose unary calls go straight to `sessionManager` (gRPC, binary, no compression);
 * streaming calls go to `fallback`, a connect gRPC transport on the same session manager.
 */
export function createLeanGrpcTransport(baseUrl: string, sessionManager: Http2SessionManager, fallback: Transport): Transport {
  const url = new URL(baseUrl);
  const prefix = url.pathname.replace(/\/+$/, "");
  const sameOrigin = url.origin === sessionManager.authority;
  const paths = new WeakMap<object, string>();
  return {
    unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: HeaderInit | undefined,
      input: MessageInitShape<I>,
      contextValues?: ContextValues,
    ): Promise<UnaryResponse<I, O>> {
      if (!sameOrigin) return fallback.unary(method, signal, timeoutMs, header, input, contextValues);
      let path = paths.get(method);
      if (path === undefined) {
        path = `${prefix}/${method.parent.typeName}/${method.name}`;
        paths.set(method, path);
      }
      return unary(sessionManager, path, method, signal, timeoutMs !== undefined && timeoutMs <= 0 ? undefined : timeoutMs, header, input);
    },
    stream: fallback.stream.bind(fallback),
  };
}

/** Request headers as node wants them, as connect's `requestHeader` makes them. */
function requestHeaders(header: HeaderInit | undefined, timeoutMs: number | undefined): Record<string, string> {
  const out: Record<string, string> = Object.create(null) as Record<string, string>;
  if (header !== undefined) {
    if (Array.isArray(header) || header instanceof Headers) {
      new Headers(header as ConstructorParameters<typeof Headers>[0]).forEach((value, key) => append(out, key, value));
    } else {
      for (const key of Object.keys(header)) {
        const value = (header as Record<string, string>)[key];
        if (value !== undefined) append(out, key.toLowerCase(), String(value).trim());
      }
    }
  }
  out["content-type"] = "application/grpc+proto";
  if (out["user-agent"] === undefined) out["user-agent"] = USER_AGENT;
  if (timeoutMs !== undefined) out["grpc-timeout"] = `${timeoutMs}m`;
  out["te"] = "trailers";
  return out;
}

function append(out: Record<string, string>, key: string, value: string): void {
  const before = out[key];
  out[key] = before === undefined ? value : `${before}, ${value}`;
}

/** Node's response headers (or trailers) as WHATWG Headers, as connect-node makes them. */
function webHeaders(node: IncomingHttpHeaders | undefined): Headers {
  const headers = new Headers();
  if (!node) return headers;
  for (const [key, value] of Object.entries(node)) {
    if (key.startsWith(":") || value === undefined) continue;
    if (typeof value === "string") headers.append(key, value);
    else if (typeof value === "number") headers.append(key, String(value));
    else for (const v of value) headers.append(key, v);
  }
  return headers;
}

// --- errors, as connect-node maps them (node-error.js) -----------------------------------------

function nodeErrorCodes(reason: unknown): string[] {
  const codes: string[] = [];
  const seen: unknown[] = [];
  while (reason instanceof Error && !seen.includes(reason)) {
    seen.push(reason);
    const code = (reason as { code?: unknown }).code;
    if (typeof code === "string") codes.push(code);
    if (!("cause" in reason)) break;
    reason = reason.cause;
  }
  return codes;
}

function errorFromNodeReason(reason: unknown): ConnectError {
  let code = Code.Internal;
  const codes = nodeErrorCodes(reason);
  if (codes.includes("ERR_STREAM_WRITE_AFTER_END")) code = Code.Aborted;
  else if (codes.some((c) => c === "ERR_STREAM_DESTROYED" || c === "ERR_HTTP2_INVALID_STREAM" || c === "ECONNRESET")) code = Code.Aborted;
  else if (codes.some((c) => c === "ETIMEDOUT" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "ECONNREFUSED")) code = Code.Unavailable;
  const error = ConnectError.from(reason, code);
  if (error !== reason) error.cause = reason;
  return error;
}

const H2_CODES: Record<number, [string, Code]> = {
  0x1: ["PROTOCOL_ERROR", Code.Internal],
  0x2: ["INTERNAL_ERROR", Code.Internal],
  0x3: ["FLOW_CONTROL_ERROR", Code.Internal],
  0x4: ["SETTINGS_TIMEOUT", Code.Internal],
  0x6: ["FRAME_SIZE_ERROR", Code.Internal],
  0x7: ["REFUSED_STREAM", Code.Unavailable],
  0x8: ["CANCEL", Code.Canceled],
  0x9: ["COMPRESSION_ERROR", Code.Internal],
  0xa: ["CONNECT_ERROR", Code.Internal],
  0xb: ["ENHANCE_YOUR_CALM", Code.ResourceExhausted],
  0xc: ["INADEQUATE_SECURITY", Code.PermissionDenied],
  0xd: ["HTTP_1_1_REQUIRED", Code.PermissionDenied],
};

function errorFromResetCode(rstCode: number | undefined): ConnectError | undefined {
  const known = rstCode === undefined ? undefined : H2_CODES[rstCode];
  if (!known || rstCode === undefined) return undefined;
  return new ConnectError(`http/2 stream closed with error code ${known[0]} (0x${rstCode.toString(16)})`, known[1]);
}

const H2_CANCEL = 0x8;
const H2_INTERNAL_ERROR = 0x2;

// --- one call ------------------------------------------------------------------------------------

function unary<I extends DescMessage, O extends DescMessage>(
  sessionManager: Http2SessionManager,
  path: string,
  method: DescMethodUnary<I, O>,
  signal: AbortSignal | undefined,
  timeoutMs: number | undefined,
  header: HeaderInit | undefined,
  input: MessageInitShape<I>,
): Promise<UnaryResponse<I, O>> {
  return new Promise<UnaryResponse<I, O>>((resolve, reject) => {
    if (signal?.aborted) {
      reject(ConnectError.from(getAbortSignalReason(signal), Code.Canceled));
      return;
    }
    let body: Uint8Array;
    try {
      const message = isMessage(input, method.input) ? (input as MessageShape<I>) : create(method.input, input);
      body = encodeEnvelope(0, serialize(method.input, message));
    } catch (error) {
      reject(ConnectError.from(error));
      return;
    }
    const headers = requestHeaders(header, timeoutMs);
    let stream: ClientHttp2Stream | undefined;
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    let responseHeaders: (IncomingHttpHeaders & IncomingHttpStatusHeader) | undefined;
    let trailers: IncomingHttpHeaders | undefined;
    const chunks: Buffer[] = [];
    let received = 0;

    const cleanup = (): void => {
      settled = true;
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    const fail = (error: ConnectError): void => {
      if (settled) return;
      cleanup();
      if (stream && !stream.closed) stream.close(error.code === Code.Canceled ? H2_CANCEL : H2_INTERNAL_ERROR);
      reject(error);
    };
    function onAbort(this: AbortSignal): void {
      fail(ConnectError.from(getAbortSignalReason(signal as AbortSignal), Code.Canceled));
    }
    signal?.addEventListener("abort", onAbort);
    if (timeoutMs !== undefined) {
      timer = setTimeout(() => fail(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
    }

    const finish = (): void => {
      if (settled) return;
      try {
        const result = parseResponse(method, responseHeaders, chunks, received, trailers);
        cleanup();
        resolve(result);
      } catch (error) {
        fail(error instanceof ConnectError ? error : ConnectError.from(error));
      }
    };

    sessionManager.request("POST", path, headers, {}).then(
      (opened) => {
        stream = opened;
        if (settled) {
          if (!opened.closed) opened.close(H2_CANCEL);
          return;
        }
        opened.on("response", (h: IncomingHttpHeaders & IncomingHttpStatusHeader) => {
          responseHeaders = h;
        });
        opened.on("data", (chunk: Buffer) => {
          chunks.push(chunk);
          received += chunk.length;
          sessionManager.notifyResponseByteRead(opened);
        });
        opened.on("trailers", (t: IncomingHttpHeaders) => {
          trailers = t;
        });
        opened.on("end", () => {
          sessionManager.notifyResponseByteRead(opened);
          finish();
        });
        opened.on("error", (error: unknown) => {
          if (opened.writableEnded && nodeErrorCodes(error).includes("ERR_STREAM_WRITE_AFTER_END")) return;
          fail(errorFromNodeReason(error));
        });
        opened.on("close", () => {
          const error = errorFromResetCode(opened.rstCode);
          if (error) fail(error);
          else if (responseHeaders !== undefined) finish();
          else fail(new ConnectError("protocol error: the stream closed without a response", Code.Unavailable));
        });
        opened.end(body);
      },
      (error: unknown) => fail(error instanceof ConnectError ? error : errorFromNodeReason(error)),
    );
  });
}

function serialize(desc: DescMessage, message: MessageShape<DescMessage>): Uint8Array {
  try {
    return toBinary(desc, message);
  } catch (e) {
    throw new ConnectError(`serialize binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}

/** The call's outcome from what the stream received, checked as connect's gRPC transport does. */
function parseResponse<I extends DescMessage, O extends DescMessage>(
  method: DescMethodUnary<I, O>,
  nodeHeaders: (IncomingHttpHeaders & IncomingHttpStatusHeader) | undefined,
  chunks: Buffer[],
  received: number,
  nodeTrailers: IncomingHttpHeaders | undefined,
): UnaryResponse<I, O> {
  const status = nodeHeaders?.[":status"] ?? 0;
  let header: Headers | undefined;
  const headerOf = (): Headers => (header ??= webHeaders(nodeHeaders));
  // validateResponseWithCompression
  if (status !== 200) throw new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status), headerOf());
  const mimeType = nodeHeaders?.["content-type"] ?? null;
  if (parseContentType(mimeType) === undefined) throw new ConnectError(`unsupported content type ${mimeType}`, Code.Unknown);
  const encoding = nodeHeaders?.["grpc-encoding"];
  if (encoding !== undefined && String(encoding).toLowerCase() !== "identity") {
    throw new ConnectError(`unsupported response encoding "${encoding}"`, Code.Internal, headerOf());
  }
  const headerHasStatus = nodeHeaders?.["grpc-status"] !== undefined;
  const headerError = headerHasStatus ? findTrailerError(headerOf()) : undefined;
  // the envelopes
  const data = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, received);
  let message: MessageShape<O> | undefined;
  let offset = 0;
  while (offset < data.length) {
    if (data.length - offset < 5) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
    const flags = data[offset] as number;
    const length = data.readUInt32BE(offset + 1);
    if (data.length - offset - 5 < length) throw new ConnectError("protocol error: promised " + length + " bytes in enveloped message, got " + (data.length - offset - 5) + " bytes", Code.InvalidArgument);
    if ((flags & 0b01) === 0b01) throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
    const bytes = data.subarray(offset + 5, offset + 5 + length);
    offset += 5 + length;
    if (message !== undefined) throw new ConnectError("protocol error: received extra output message for unary method", Code.Unimplemented);
    try {
      message = fromBinary(method.output, bytes);
    } catch (e) {
      throw new ConnectError(`parse binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
    }
  }
  // validateTrailer
  const trailerStatus = nodeTrailers?.["grpc-status"];
  let trailer: Headers | undefined;
  const trailerOf = (): Headers => (trailer ??= webHeaders(nodeTrailers));
  // the Headers are made only for a call that did not plainly succeed
  if (trailerStatus !== "0" || nodeTrailers?.["grpc-status-details-bin"] !== undefined) validateTrailer(trailerOf(), headerOf());
  if (message === undefined) {
    if (headerError) throw headerError;
    throw new ConnectError("protocol error: missing output message for unary method", trailerStatus !== undefined ? Code.Unimplemented : Code.Unknown);
  }
  const response = {
    stream: false as const,
    service: method.parent,
    method,
    message,
    get header(): Headers {
      return headerOf();
    },
    get trailer(): Headers {
      return trailerOf();
    },
  };
  return response as unknown as UnaryResponse<I, O>;
}
