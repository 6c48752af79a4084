// JSON values <-> google.protobuf.Value, with a strict check of what is JSON.
import { create, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";

/** A JSON value: what inputs, outputs, payloads and details are. */
export type Json = JsonValue;

/** Thrown by {@link toJsonValue} for a value that is not JSON (a function, NaN, a cycle, a Map...). */
export class NotJsonError extends TypeError {
  override name = "NotJsonError";
}

/**
 * Checks that `value` is JSON and returns it as plain JSON. `undefined` at the top is `null`;
 * object properties that are `undefined` are dropped (as `JSON.stringify` does); a `toJSON`
 * method (a `Date`) is honoured. Functions, symbols, bigints, non-finite numbers, cycles and
 * non-plain objects (`Map`, `Set`, class instances without `toJSON`) throw {@link NotJsonError}.
 */
export function toJsonValue(value: unknown): Json {
  return convert(value, "$", new Set());
}

function convert(value: unknown, path: string, seen: Set<object>): Json {
  if (value === null || value === undefined) return null;
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      if (!Number.isFinite(value)) throw new NotJsonError(`${path} is ${value}, which JSON cannot hold`);
      return value;
    case "bigint":
      throw new NotJsonError(`${path} is a bigint, which JSON cannot hold (convert it to a string or number)`);
    case "function":
    case "symbol":
      throw new NotJsonError(`${path} is a ${typeof value}, not JSON`);
  }
  const object = value as Record<string, unknown> & { toJSON?: () => unknown };
  if (seen.has(object)) throw new NotJsonError(`${path} refers back to itself (a cycle)`);
  if (typeof object.toJSON === "function") return convert(object.toJSON(), path, seen);
  seen.add(object);
  try {
    if (Array.isArray(object)) return object.map((item, i) => convert(item, `${path}[${i}]`, seen));
    const proto = Object.getPrototypeOf(object) as unknown;
    if (proto !== Object.prototype && proto !== null) {
      const kind = (object.constructor as { name?: string } | undefined)?.name ?? "object";
      throw new NotJsonError(`${path} is a ${kind}, not a plain object`);
    }
    const out: { [key: string]: Json } = {};
    for (const [key, item] of Object.entries(object)) {
      if (item === undefined) continue;
      out[key] = convert(item, `${path}.${key}`, seen);
    }
    return out;
  } finally {
    seen.delete(object);
  }
}

/** A JSON value as a `google.protobuf.Value` (throws {@link NotJsonError}). */
export function toValue(value: unknown): Value {
  const json = toJsonValue(value);
  return json === null ? create(ValueSchema, { kind: { case: "nullValue", value: 0 } }) : fromJson(ValueSchema, json);
}

/** A `google.protobuf.Value` field as JSON (`null` when the field is unset). */
export function fromValue(value: Value | undefined): Json {
  if (value === undefined || value.kind.case === undefined) return null;
  return toJson(ValueSchema, value);
}
