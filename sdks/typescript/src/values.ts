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
      // a `__proto__` key (JSON.parse makes one) stays a key, not the output's prototype
      setOwn(out, key, convert(item, `${path}.${key}`, seen));
    }
    return out;
  } finally {
    seen.delete(object);
  }
}

// The worker converts every task's input and output: built directly, as the `create` and
// `fromJson` / `toJson` of @bufbuild/protobuf would, without their reflection. A value nested
// deeper than FAST_DEPTH takes the library's path, which also keeps its recursion limit.
const FAST_DEPTH = 64;

class TooDeep extends Error {}

/** The `google.protobuf.Value` of `json`, already checked to be JSON (`fromJson(ValueSchema, json)`). */
function valueOf(json: Json, depth: number): Value {
  if (depth > FAST_DEPTH) throw new TooDeep();
  let kind: Value["kind"];
  switch (typeof json) {
    case "number":
      kind = { case: "numberValue", value: json };
      break;
    case "string":
      kind = { case: "stringValue", value: json };
      break;
    case "boolean":
      kind = { case: "boolValue", value: json };
      break;
    default:
      if (json === null) kind = { case: "nullValue", value: 0 };
      else if (Array.isArray(json)) {
        const values: Value[] = new Array(json.length);
        for (let i = 0; i < json.length; i++) values[i] = valueOf(json[i] as Json, depth + 1);
        kind = { case: "listValue", value: { $typeName: "google.protobuf.ListValue", values } };
      } else {
        const fields: { [key: string]: Value } = {};
        for (const key of Object.keys(json)) setOwn(fields, key, valueOf(json[key] as Json, depth + 1));
        kind = { case: "structValue", value: { $typeName: "google.protobuf.Struct", fields } };
      }
  }
  return { $typeName: "google.protobuf.Value", kind };
}

/** The JSON of a `google.protobuf.Value` (`toJson(ValueSchema, value)`). */
function jsonOf(value: Value, depth: number): Json {
  if (depth > FAST_DEPTH) throw new TooDeep();
  const kind = value.kind;
  switch (kind.case) {
    case "nullValue":
      return null;
    case "numberValue":
      if (!Number.isFinite(kind.value)) throw new Error(`${value.$typeName} cannot be NaN or Infinity`);
      return kind.value;
    case "boolValue":
    case "stringValue":
      return kind.value;
    case "structValue": {
      const out: { [key: string]: Json } = {};
      const fields = kind.value.fields;
      for (const key of Object.keys(fields)) setOwn(out, key, jsonOf(fields[key] as Value, depth + 1));
      return out;
    }
    case "listValue": {
      const values = kind.value.values;
      const out: Json[] = new Array(values.length);
      for (let i = 0; i < values.length; i++) out[i] = jsonOf(values[i] as Value, depth + 1);
      return out;
    }
    default:
      throw new Error(`${value.$typeName} must have a value`);
  }
}

/** `obj[key] = value`, as an own property even for `__proto__` (as @bufbuild/protobuf does). */
function setOwn<T>(obj: { [key: string]: T }, key: string, value: T): void {
  if (key === "__proto__") Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
  else obj[key] = value;
}

/** A JSON value as a `google.protobuf.Value` (throws {@link NotJsonError}). */
export function toValue(value: unknown): Value {
  return valueOfJson(toJsonValue(value));
}

/** The `google.protobuf.Value` of a value already checked to be JSON ({@link toJsonValue}'s result). */
export function valueOfJson(json: Json): Value {
  if (json === null) return create(ValueSchema, { kind: { case: "nullValue", value: 0 } });
  try {
    return valueOf(json, 0);
  } catch (error) {
    if (!(error instanceof TooDeep)) throw error;
    return fromJson(ValueSchema, json);
  }
}

/** A `google.protobuf.Value` field as JSON (`null` when the field is unset). */
export function fromValue(value: Value | undefined): Json {
  if (value === undefined || value.kind.case === undefined) return null;
  try {
    return jsonOf(value, 0);
  } catch (error) {
    if (!(error instanceof TooDeep)) throw error;
    return toJson(ValueSchema, value);
  }
}
