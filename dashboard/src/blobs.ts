// Large payloads (docs/payloads.md): a value over the server's offload threshold stands in runs,
// nodes and history as a reference `{"$blob": {"sha256", "size", "head"}}`, at any depth. The pages
// show a reference as a block (size, digest, the first bytes) with a download, never the bytes.
import { isBlobReference, type Json } from "@composer-dev/composer/web";

/** What a reference names, read defensively: the pages never trust a value's shape. */
export interface BlobInfo {
  sha256: string;
  size: number;
  head: string;
}

const SHA256 = /^[0-9a-f]{64}$/;

/** The blob a value names when it is a well-formed reference; null otherwise (shown as plain JSON). */
export function blobOf(value: unknown): BlobInfo | null {
  if (!isBlobReference(value)) return null;
  const inner: unknown = (value as unknown as Record<string, unknown>)["$blob"];
  if (inner === null || typeof inner !== "object" || Array.isArray(inner)) return null;
  const { sha256, size, head } = inner as Record<string, unknown>;
  if (typeof sha256 !== "string" || !SHA256.test(sha256)) return null;
  const bytes = typeof size === "number" ? size : typeof size === "string" ? Number(size) : NaN;
  return { sha256, size: Number.isFinite(bytes) && bytes >= 0 ? bytes : 0, head: typeof head === "string" ? head : "" };
}

/** True when a reference stands anywhere in `value`. */
export function hasBlobs(value: Json | undefined): boolean {
  if (value === null || value === undefined || typeof value !== "object") return false;
  if (blobOf(value)) return true;
  if (Array.isArray(value)) return value.some(hasBlobs);
  return Object.values(value).some((v) => hasBlobs(v as Json));
}

/** A piece of a value's JSON text, or a reference standing in it. */
export type JsonPart = string | BlobInfo;

/**
 * `value` as `JSON.stringify(value, null, 2)` writes it, cut around its references: the text
 * pieces and the references in order (adjacent text merged).
 */
export function jsonParts(value: Json | undefined): JsonPart[] {
  const out: JsonPart[] = [];
  const text = (s: string): void => {
    const last = out.length - 1;
    if (last >= 0 && typeof out[last] === "string") out[last] = (out[last] as string) + s;
    else out.push(s);
  };
  const walk = (v: Json | undefined, indent: string): void => {
    const blob = blobOf(v);
    if (blob) return void out.push(blob);
    if (v === null || v === undefined || typeof v !== "object") return text(JSON.stringify(v ?? null));
    const inner = `${indent}  `;
    if (Array.isArray(v)) {
      if (v.length === 0) return text("[]");
      text("[\n");
      v.forEach((item, i) => {
        text(inner);
        walk(item, inner);
        text(i < v.length - 1 ? ",\n" : "\n");
      });
      return text(`${indent}]`);
    }
    const entries = Object.entries(v).filter(([, item]) => item !== undefined);
    if (entries.length === 0) return text("{}");
    text("{\n");
    entries.forEach(([key, item], i) => {
      text(`${inner}${JSON.stringify(key)}: `);
      walk(item as Json, inner);
      text(i < entries.length - 1 ? ",\n" : "\n");
    });
    text(`${indent}}`);
  };
  walk(value, "");
  return out;
}

/** The name a downloaded blob is saved under: `<first 12 hex of its sha256>.json`. */
export function blobFileName(blob: BlobInfo): string {
  return `${blob.sha256.slice(0, 12)}.json`;
}

/** Hands `bytes` to the browser as a download named `name` (an object URL and a temporary link). */
export function saveBytes(bytes: Uint8Array, name: string): void {
  // the SDK fills a fresh ArrayBuffer: no copy needed to make it a Blob part
  const file = new Blob([bytes as Uint8Array<ArrayBuffer>], { type: "application/json" });
  const url = URL.createObjectURL(file);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  link.hidden = true;
  document.body.appendChild(link);
  try {
    link.click();
  } finally {
    link.remove();
    // the download has started by now; give the browser time to read the object before it goes
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  }
}
