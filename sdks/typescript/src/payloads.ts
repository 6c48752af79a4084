// Large payloads (docs/payloads.md): references to blobs, the walk that finds and replaces them,
// the byte streams of BlobService, and the transfers through its presigned URLs (conformance C24:
// one HTTP request with the global `fetch`). Nothing here touches Node APIs (the browser Client
// uses it).
import type { CallOptions, Client as ConnectClient } from "@connectrpc/connect";

import { ComposerError, toComposerError } from "./errors.js";
import type { BlobService, GetBlobUrlResponse, StartBlobUploadResponse, BlobRef as WireBlobRef } from "./gen/composer/v1/blob_service_pb.js";
import { blobRefFromWire, type BlobRef } from "./models.js";
import type { Json } from "./values.js";

/** The key of a reference: an object whose only key is `$blob` names a blob. */
export const BLOB_KEY = "$blob";
/** The most bytes one UploadBlob message carries (BlobService takes chunks of at most 1 MiB). */
export const BLOB_CHUNK_BYTES = 1 << 20;

const SHA256 = /^[0-9a-f]{64}$/;
/** How many blobs one resolve downloads at once. */
const PARALLEL_DOWNLOADS = 4;
/** How many times a download broken by a transient error is taken up again where it stopped. */
const DOWNLOAD_RESUMES = 5;

/** A reference as it stands in a value: `{"$blob": {"sha256", "size", "head"}}`. */
export interface BlobReference {
  $blob: BlobRef;
}

/** True when `value` is a reference: an object (not an array) whose only key is `$blob`. */
export function isBlobReference(value: unknown): value is BlobReference {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  let only = false;
  for (const key in value) {
    if (!Object.prototype.hasOwnProperty.call(value, key)) continue;
    if (key !== BLOB_KEY || only) return false;
    only = true;
  }
  return only;
}

/** The reference object that stands for the blob `ref` names. */
export function blobReference(ref: BlobRef): BlobReference {
  return { [BLOB_KEY]: { sha256: ref.sha256, size: ref.size, head: ref.head } } as BlobReference;
}

/** The sha256 a reference names; a TypeError naming `path` when its `$blob` names no blob. */
function digestOf(reference: BlobReference, path: string): string {
  const inner = (reference as unknown as Record<string, unknown>)[BLOB_KEY];
  const sha256 = inner !== null && typeof inner === "object" ? (inner as Record<string, unknown>)["sha256"] : undefined;
  if (typeof sha256 !== "string" || !SHA256.test(sha256)) {
    throw new TypeError(`${path} is a reference (an object whose only key is "${BLOB_KEY}") without a sha256 of 64 lowercase hex digits`);
  }
  return sha256;
}

/** The distinct sha256s of the references in `value`, at any depth (in the order first met). */
export function referencedBlobs(value: Json): string[] {
  const found = new Set<string>();
  walk(value, "$", (reference, path) => {
    found.add(digestOf(reference, path));
  });
  return [...found];
}

/** True when `value` holds a reference anywhere. */
export function hasBlobReference(value: Json): boolean {
  if (value === null || typeof value !== "object") return false;
  if (isBlobReference(value)) return true;
  if (Array.isArray(value)) return value.some(hasBlobReference);
  for (const key of Object.keys(value)) if (hasBlobReference(value[key] as Json)) return true;
  return false;
}

function walk(value: Json, path: string, visit: (reference: BlobReference, path: string) => void): void {
  if (value === null || typeof value !== "object") return;
  if (isBlobReference(value)) return visit(value, path);
  if (Array.isArray(value)) {
    value.forEach((item, i) => walk(item, `${path}[${i}]`, visit));
    return;
  }
  for (const key of Object.keys(value)) walk(value[key] as Json, `${path}.${key}`, visit);
}

/**
 * A copy of `value` with every reference replaced by `values.get(sha256)`. A reference whose
 * digest `values` lacks stays as it is.
 */
export function replaceBlobReferences(value: Json, values: ReadonlyMap<string, Json>, path = "$"): Json {
  if (value === null || typeof value !== "object") return value;
  if (isBlobReference(value)) {
    const sha256 = digestOf(value, path);
    return values.has(sha256) ? (values.get(sha256) as Json) : value;
  }
  if (Array.isArray(value)) return value.map((item, i) => replaceBlobReferences(item, values, `${path}[${i}]`));
  const out: { [key: string]: Json } = {};
  for (const key of Object.keys(value)) {
    const item = replaceBlobReferences(value[key] as Json, values, `${path}.${key}`);
    if (key === "__proto__") Object.defineProperty(out, key, { value: item, writable: true, enumerable: true, configurable: true });
    else out[key] = item;
  }
  return out;
}

/**
 * The UTF-8 bytes of `text` (a compact JSON text) when they are more than `limit`; undefined when
 * they fit (or `limit` is 0 or less: never offload). Encodes only when the length in UTF-16 units
 * leaves it open (a unit is 1 to 3 bytes of UTF-8).
 */
export function bytesOverLimit(text: string, limit: number): Uint8Array | undefined {
  if (!(limit > 0) || text.length * 3 <= limit) return undefined;
  const bytes = new TextEncoder().encode(text);
  return bytes.length > limit ? bytes : undefined;
}

/** `data` cut into pieces of at most `size` bytes (views, not copies); none for empty data. */
export function* chunksOf(data: Uint8Array, size = BLOB_CHUNK_BYTES): Generator<Uint8Array, void, undefined> {
  if (!(size >= 1)) throw new RangeError("a chunk holds at least one byte");
  for (let start = 0; start < data.length; start += size) yield data.subarray(start, Math.min(start + size, data.length));
}

type Blobs = ConnectClient<typeof BlobService>;

function checkData(data: Uint8Array): void {
  if (!(data instanceof Uint8Array)) throw new TypeError("uploadBlob takes the bytes of a JSON text, as a Uint8Array");
}

function checkSha256(sha256: string): void {
  if (typeof sha256 !== "string" || !SHA256.test(sha256)) {
    throw new TypeError(`downloadBlob takes a sha256 of 64 lowercase hex digits, not ${JSON.stringify(sha256)}`);
  }
}

/** UploadBlob: `data` streamed in chunks of 1 MiB; the reference the server made of it. */
export async function uploadBytes(blobs: Blobs, data: Uint8Array, options: CallOptions): Promise<BlobRef> {
  checkData(data);
  async function* requests(): AsyncGenerator<{ data: Uint8Array }, void, undefined> {
    for (const chunk of chunksOf(data)) yield { data: chunk };
  }
  try {
    const response = await blobs.uploadBlob(requests(), options);
    if (!response.blob) throw new ComposerError("INTERNAL", "UploadBlob answered without a reference");
    return blobRefFromWire(response.blob);
  } catch (error) {
    throw toComposerError(error);
  }
}

/**
 * DownloadBlob: the whole blob. A stream broken by a transient error (UNAVAILABLE,
 * DEADLINE_EXCEEDED) is opened again from the last byte received, a few times; the bytes are
 * checked against the size the first chunk announced and, where WebCrypto is at hand, the digest.
 */
export async function downloadBytes(blobs: Blobs, sha256: string, options: CallOptions): Promise<Uint8Array> {
  checkSha256(sha256);
  let buffer: Uint8Array | undefined;
  let received = 0;
  let size = -1;
  for (let resumes = 0; ; resumes++) {
    try {
      for await (const chunk of blobs.downloadBlob({ sha256, offset: BigInt(received) }, options)) {
        if (size < 0) {
          size = Number(chunk.size);
          buffer = new Uint8Array(size);
        }
        if (received + chunk.data.length > size) {
          throw new ComposerError("DATA_LOSS", `blob ${sha256} sent more than its ${size} bytes`);
        }
        (buffer as Uint8Array).set(chunk.data, received);
        received += chunk.data.length;
      }
      break;
    } catch (error) {
      const converted = toComposerError(error);
      if (!converted.retryable || resumes >= DOWNLOAD_RESUMES || options.signal?.aborted) throw converted;
      await pause(100 * 2 ** resumes, options.signal);
    }
  }
  if (size < 0) size = 0; // an empty stream: an empty blob
  if (received !== size) throw new ComposerError("DATA_LOSS", `blob ${sha256} ended after ${received} of its ${size} bytes`);
  const bytes = buffer ?? new Uint8Array(0);
  const hex = await digestOf256(bytes);
  if (hex !== undefined && hex !== sha256) throw new ComposerError("DATA_LOSS", `the bytes of blob ${sha256} have the digest ${hex}`);
  return bytes;
}

/** The SHA-256 of `bytes` in lowercase hex, where WebCrypto is at hand; undefined where it is not. */
async function digestOf256(bytes: Uint8Array): Promise<string | undefined> {
  const subtle = (globalThis as { crypto?: { subtle?: { digest(algorithm: string, data: Uint8Array): Promise<ArrayBuffer> } } }).crypto?.subtle;
  if (!subtle) return undefined;
  const digest = new Uint8Array(await subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

// --- presigned URLs (C24) ----------------------------------------------------------------------
//
// A presigned URL is a credential for as long as it lives: nothing here puts one in a log line or
// an error message. The errors `fetch` throws may quote it, so none of them leaves this module:
// a failed request is only "failed".

/**
 * Why a transfer did not go through a presigned URL: `"refused"`, the server answered
 * FAILED_PRECONDITION (it gives no URLs; or UNIMPLEMENTED, it has no such call: the caller uses
 * the streams from then on); `"failed"`, the HTTP request failed (the store unreachable from here,
 * a status other than 2xx, bytes that are not the blob: the caller uses the stream for this one
 * call).
 */
export type UrlFallback = "refused" | "failed";

/** FAILED_PRECONDITION or UNIMPLEMENTED: `"refused"`; any other error of a URL call is thrown. */
function refusedOrThrow(error: unknown): "refused" {
  const converted = toComposerError(error);
  if (converted.code === "FAILED_PRECONDITION" || converted.code === "UNIMPLEMENTED") return "refused";
  throw converted;
}

/**
 * One HTTP request to a presigned URL: the response when its status is 2xx, undefined when the
 * request failed. An abort of `signal` is thrown (as the streams throw it), never swallowed.
 */
async function request(
  url: string,
  init: { method: "GET" | "PUT"; body?: Uint8Array<ArrayBuffer>; headers?: Record<string, string> },
  signal: AbortSignal | undefined,
): Promise<Response | undefined> {
  let response: Response;
  try {
    response = await fetch(url, { ...init, ...(signal ? { signal } : {}) });
  } catch (error) {
    if (signal?.aborted) throw toComposerError(signal.reason ?? error);
    return undefined;
  }
  if (response.ok) return response;
  // Let the connection be reused; the body (the store's error document) is not read.
  await response.body?.cancel().catch(() => undefined);
  return undefined;
}

/**
 * An upload through a presigned URL: StartBlobUpload, one HTTP PUT of `data` to its URL, then
 * FinishBlobUpload, whose reference it returns, once checked to name `data` (where WebCrypto is at
 * hand; a reference to other bytes counts as a failed request). `unary` are the options of
 * StartBlobUpload; `finish` those of FinishBlobUpload (the server reads the whole upload: no
 * deadline, like the streams). Any other error of the calls is thrown as the stream's would be.
 */
export async function uploadThroughUrl(blobs: Blobs, data: Uint8Array, unary: CallOptions, finish: CallOptions): Promise<BlobRef | UrlFallback> {
  checkData(data);
  let started: StartBlobUploadResponse;
  try {
    started = await blobs.startBlobUpload({}, unary);
  } catch (error) {
    return refusedOrThrow(error);
  }
  if (!started.url || !started.uploadId) return "failed";
  // Azure's Put Blob needs the header; S3 and GCS ignore it.
  const put = await request(started.url, { method: "PUT", body: data as Uint8Array<ArrayBuffer>, headers: { "x-ms-blob-type": "BlockBlob" } }, unary.signal);
  if (!put) return "failed";
  await put.body?.cancel().catch(() => undefined);
  let blob: WireBlobRef | undefined;
  try {
    blob = (await blobs.finishBlobUpload({ uploadId: started.uploadId }, finish)).blob;
  } catch (error) {
    return refusedOrThrow(error);
  }
  if (!blob) throw new ComposerError("INTERNAL", "FinishBlobUpload answered without a reference");
  const ref = blobRefFromWire(blob);
  const hex = await digestOf256(data);
  // What reached the store is not what was sent: the stream carries it.
  if (ref.size !== data.length || (hex !== undefined && ref.sha256 !== hex)) return "failed";
  return ref;
}

/**
 * A download through a presigned URL: GetBlobUrl, then one HTTP GET of its URL. The bytes are
 * checked against the size GetBlobUrl gave and, where WebCrypto is at hand, the digest; bytes that
 * fail the checks count as a failed request (the stream, which checks them again, then decides).
 * NOT_FOUND, and any other error of GetBlobUrl but a refusal, is thrown as the stream's would be.
 */
export async function downloadThroughUrl(blobs: Blobs, sha256: string, unary: CallOptions): Promise<Uint8Array | UrlFallback> {
  checkSha256(sha256);
  let answer: GetBlobUrlResponse;
  try {
    answer = await blobs.getBlobUrl({ sha256 }, unary);
  } catch (error) {
    return refusedOrThrow(error);
  }
  if (!answer.url) return "failed";
  const got = await request(answer.url, { method: "GET" }, unary.signal);
  if (!got) return "failed";
  let bytes: Uint8Array;
  try {
    bytes = new Uint8Array(await got.arrayBuffer());
  } catch (error) {
    if (unary.signal?.aborted) throw toComposerError(unary.signal.reason ?? error);
    return "failed";
  }
  if (bytes.length !== Number(answer.size)) return "failed";
  const hex = await digestOf256(bytes);
  if (hex !== undefined && hex !== sha256) return "failed";
  return bytes;
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, ms);
    function abort(): void {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/**
 * A copy of `value` with every reference, at any depth, replaced by the JSON value of the blob it
 * names, each distinct blob downloaded once (`download`). A blob's value that holds references
 * itself is resolved too.
 */
export async function resolveBlobReferences(value: Json, download: (sha256: string) => Promise<Uint8Array>): Promise<Json> {
  const values = new Map<string, Json>();
  const decoder = new TextDecoder("utf-8", { fatal: true });
  let pending = referencedBlobs(value);
  for (let depth = 0; pending.length > 0; depth++) {
    if (depth > 64) throw new ComposerError("FAILED_PRECONDITION", "blobs refer to blobs more than 64 deep");
    const fetched = new Map<string, Json>();
    let next = 0;
    const fetchOne = async (): Promise<void> => {
      while (next < pending.length) {
        const sha256 = pending[next++] as string;
        const bytes = await download(sha256);
        let parsed: Json;
        try {
          parsed = JSON.parse(decoder.decode(bytes)) as Json;
        } catch (error) {
          throw new ComposerError("DATA_LOSS", `blob ${sha256} is not the JSON text of a value: ${(error as Error).message}`);
        }
        fetched.set(sha256, parsed);
      }
    };
    await Promise.all(Array.from({ length: Math.min(PARALLEL_DOWNLOADS, pending.length) }, fetchOne));
    const found = new Set<string>();
    for (const [sha256, parsed] of fetched) {
      values.set(sha256, parsed);
      for (const inner of referencedBlobs(parsed)) if (!values.has(inner)) found.add(inner);
    }
    pending = [...found].filter((sha256) => !fetched.has(sha256));
  }
  // Blob values may hold references: replace inside them first (they form no cycle, being
  // content-addressed), then in the value.
  const resolved = new Map<string, Json>();
  const resolving = new Set<string>();
  const resolvedOf = (sha256: string): Json => {
    const done = resolved.get(sha256);
    if (done !== undefined || resolved.has(sha256)) return done as Json;
    if (resolving.has(sha256)) throw new ComposerError("FAILED_PRECONDITION", `blob ${sha256} refers to itself`);
    resolving.add(sha256);
    const raw = values.get(sha256) as Json;
    const inner = hasBlobReference(raw) ? replaceBlobReferences(raw, new Map(referencedBlobs(raw).map((s) => [s, resolvedOf(s)]))) : raw;
    resolving.delete(sha256);
    resolved.set(sha256, inner);
    return inner;
  };
  for (const sha256 of values.keys()) resolvedOf(sha256);
  return replaceBlobReferences(value, resolved);
}
