// Checks a run's input against the workflow's input_schema before StartRun, so the user sees the
// problem at the field. A small JSON Schema subset (type, required, properties,
// additionalProperties, items, enum, const, min/max, lengths, pattern); the server checks the
// full schema again. Validators that compile schemas to code (ajv) need eval, which the CSP forbids.
import type { Json } from "@composer-dev/composer/web";

export interface SchemaProblem {
  path: string;
  message: string;
}

type Schema = { [key: string]: Json };

function typeOf(value: Json): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

function matchesType(value: Json, type: string): boolean {
  const actual = typeOf(value);
  return actual === type || (type === "number" && actual === "integer");
}

function isSchema(value: Json | undefined): value is Schema {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function check(value: Json, schema: Json | undefined, path: string, problems: SchemaProblem[]): void {
  if (schema === true || schema === undefined) return;
  if (schema === false) {
    problems.push({ path, message: "is not allowed" });
    return;
  }
  if (!isSchema(schema)) return;
  const types = typeof schema["type"] === "string" ? [schema["type"]] : Array.isArray(schema["type"]) ? schema["type"].filter((t): t is string => typeof t === "string") : [];
  if (types.length > 0 && !types.some((t) => matchesType(value, t))) {
    problems.push({ path, message: `must be ${types.join(" or ")}, not ${typeOf(value)}` });
    return;
  }
  if (Array.isArray(schema["enum"]) && !schema["enum"].some((e) => JSON.stringify(e) === JSON.stringify(value))) {
    problems.push({ path, message: `must be one of ${schema["enum"].map((e) => JSON.stringify(e)).join(", ")}` });
  }
  if ("const" in schema && JSON.stringify(schema["const"]) !== JSON.stringify(value)) {
    problems.push({ path, message: `must be ${JSON.stringify(schema["const"])}` });
  }
  if (typeof value === "number") {
    if (typeof schema["minimum"] === "number" && value < schema["minimum"]) problems.push({ path, message: `must be at least ${schema["minimum"]}` });
    if (typeof schema["maximum"] === "number" && value > schema["maximum"]) problems.push({ path, message: `must be at most ${schema["maximum"]}` });
  }
  if (typeof value === "string") {
    if (typeof schema["minLength"] === "number" && value.length < schema["minLength"]) problems.push({ path, message: `must have at least ${schema["minLength"]} characters` });
    if (typeof schema["maxLength"] === "number" && value.length > schema["maxLength"]) problems.push({ path, message: `must have at most ${schema["maxLength"]} characters` });
    if (typeof schema["pattern"] === "string") {
      try {
        if (!new RegExp(schema["pattern"], "u").test(value)) problems.push({ path, message: `must match ${schema["pattern"]}` });
      } catch {
        // a pattern this browser cannot read is left to the server
      }
    }
  }
  if (Array.isArray(value)) {
    if (typeof schema["minItems"] === "number" && value.length < schema["minItems"]) problems.push({ path, message: `must have at least ${schema["minItems"]} items` });
    if (typeof schema["maxItems"] === "number" && value.length > schema["maxItems"]) problems.push({ path, message: `must have at most ${schema["maxItems"]} items` });
    value.forEach((item, i) => check(item, schema["items"], `${path}[${i}]`, problems));
  }
  if (isSchema(value)) {
    const required = Array.isArray(schema["required"]) ? schema["required"] : [];
    for (const name of required) if (typeof name === "string" && !(name in value)) problems.push({ path: `${path}.${name}`, message: "is required" });
    const properties = isSchema(schema["properties"]) ? schema["properties"] : {};
    for (const [name, item] of Object.entries(value)) {
      if (name in properties) check(item, properties[name], `${path}.${name}`, problems);
      else if (schema["additionalProperties"] === false) problems.push({ path: `${path}.${name}`, message: "is not an allowed property" });
      else check(item, schema["additionalProperties"] === true ? undefined : schema["additionalProperties"], `${path}.${name}`, problems);
    }
  }
}

/** Every problem of `value` against `schema` (none: valid); paths start at `input`. */
export function validate(value: Json, schema: Json): SchemaProblem[] {
  const problems: SchemaProblem[] = [];
  if (schema !== null) check(value, schema, "input", problems);
  return problems;
}

/** JSON text as a value, or the parse error as a readable message. */
export function parseJson(text: string): { ok: true; value: Json } | { ok: false; message: string } {
  if (text.trim() === "") return { ok: true, value: null };
  try {
    return { ok: true, value: JSON.parse(text) as Json };
  } catch (error) {
    return { ok: false, message: `not valid JSON: ${(error as Error).message}` };
  }
}
