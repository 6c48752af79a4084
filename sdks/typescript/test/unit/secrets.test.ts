// The client's secret calls against a fake SecretService: the requests they build, the typed
// Secret they return, paging, error decoding, and that a secret's value shows up in no model, no
// error and nothing the client keeps after the call.
import assert from "node:assert/strict";
import { test } from "node:test";
import { inspect } from "node:util";

import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import {
  ComposerClient,
  isFailedPrecondition,
  isInvalidArgument,
  isNotFound,
  isPermissionDenied,
  type Secret,
} from "../../src/index.js";
import { badRequest, FakeServer, wireError } from "./fake.js";

const FIRST_SET = new Date("2030-01-02T03:04:05.000Z");
const LAST_SET = new Date("2030-01-03T04:05:06.000Z");
const VALUE = "s3cr3t-Value-that-must-stay-hidden";
const NAME_RULE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

function clientOf(fake: FakeServer, token = "operator"): ComposerClient {
  return new ComposerClient({ transport: fake, token });
}

/** Everything a log line or an error reporter could show of `thing`. */
function renderings(thing: unknown): string {
  const shown = [String(thing), inspect(thing, { depth: 8, showHidden: true })];
  try {
    shown.push(JSON.stringify(thing));
  } catch {
    // not JSON
  }
  return shown.join("\n");
}

function assertHidden(what: string, ...things: unknown[]): void {
  for (const thing of things) assert.ok(!renderings(thing).includes(VALUE), `${what} shows the value: ${renderings(thing)}`);
}

/** A SecretService keeping versions and times (never values) and refusing as the server does. */
function fakeSecrets(): { fake: FakeServer; sent: { name: string; value: Uint8Array }[]; state: { noKey: boolean } } {
  const secrets = new Map<string, { name: string; version: number; createTime: unknown; updateTime: unknown; updatedBy: string }>();
  const sent: { name: string; value: Uint8Array }[] = [];
  const state = { noKey: false };
  const refuse = (name?: string): void => {
    if (state.noKey) throw wireError(Code.FailedPrecondition, "this server has no secrets key-encryption key");
    if (name !== undefined && !NAME_RULE.test(name)) {
      throw wireError(Code.InvalidArgument, "invalid name", [
        { type: "google.rpc.BadRequest", value: badRequest([["name", "must be 1 to 64 characters from A-Z a-z 0-9 _ . -"]]) },
      ]);
    }
  };
  const fake = new FakeServer({
    SetSecret: (request) => {
      // A copy as it arrives: the client zeroes the bytes it made once the call is over.
      sent.push({ name: request.name, value: Uint8Array.from(request.value as Uint8Array) });
      refuse(request.name);
      if (request.value.length === 0) {
        throw wireError(Code.InvalidArgument, "invalid value", [{ type: "google.rpc.BadRequest", value: badRequest([["value", "must not be empty"]]) }]);
      }
      const secret = secrets.get(request.name) ?? { name: request.name, version: 0, createTime: timestampFromDate(FIRST_SET), updateTime: undefined, updatedBy: "" };
      secret.version += 1;
      secret.updateTime = timestampFromDate(LAST_SET);
      secret.updatedBy = "ci";
      secrets.set(request.name, secret);
      return { secret: { ...secret } };
    },
    ListSecrets: (request) => {
      refuse();
      const names = [...secrets.keys()].sort();
      const start = Number(request.pageToken || 0);
      const end = Math.min(start + (request.pageSize || 100), names.length);
      return { secrets: names.slice(start, end).map((n) => secrets.get(n)), nextPageToken: end < names.length ? String(end) : "" };
    },
    DeleteSecret: (request) => {
      refuse(request.name);
      if (!secrets.delete(request.name)) throw wireError(Code.NotFound, `no secret ${request.name}`);
      return {};
    },
  });
  return { fake, sent, state };
}

test("setSecret sends the name and the value and returns the secret without it", async () => {
  const { fake, sent } = fakeSecrets();
  const client = clientOf(fake);
  const first: Secret = await client.setSecret("stripe-key", VALUE);
  assert.deepEqual(first, { name: "stripe-key", version: 1, createTime: FIRST_SET, updateTime: LAST_SET, updatedBy: "ci" });
  assert.deepEqual(sent[0], { name: "stripe-key", value: new TextEncoder().encode(VALUE) });
  assert.equal(fake.headers("SetSecret")[0]!.get("authorization"), "Bearer operator");

  // Bytes go as they are, and stay the caller's: the client does not touch them.
  const binary = new Uint8Array([0, 0xff, 0x62, 0x69, 0x6e]);
  const second = await client.setSecret("stripe-key", binary);
  assert.deepEqual(sent[1]!.value, binary);
  assert.deepEqual(binary, new Uint8Array([0, 0xff, 0x62, 0x69, 0x6e]));
  assert.equal(second.version, 2);
  assert.deepEqual(second.createTime, FIRST_SET);
  assertHidden("a Secret", first, second);
});

test("nothing the client made of a string value outlives the call", async () => {
  const { fake } = fakeSecrets();
  await clientOf(fake).setSecret("stripe-key", VALUE);
  const request = fake.requests("SetSecret")[0];
  assert.equal(request.value.length, new TextEncoder().encode(VALUE).length);
  assert.ok(request.value.every((b: number) => b === 0), "the request's bytes were not zeroed after the call");
  assertHidden("the request after the call", request);
});

test("a value of another type, or text that is not UTF-8, is refused before any call, naming no value", async () => {
  const { fake } = fakeSecrets();
  const client = clientOf(fake);
  const wrongType = await client.setSecret("k", [1, 2, 3] as unknown as Uint8Array).catch((e: unknown) => e);
  assert.ok(wrongType instanceof TypeError && /Array/.test(wrongType.message), String(wrongType));
  const loneSurrogate = await client.setSecret("k", `${VALUE}\uD800`).catch((e: unknown) => e);
  assert.ok(loneSurrogate instanceof TypeError && /UTF-8/.test(loneSurrogate.message), String(loneSurrogate));
  assertHidden("the refusal", wrongType, loneSurrogate);
  assert.equal(fake.requests("SetSecret").length, 0);
});

test("refusals are typed with their field violations and carry no trace of the value", async () => {
  const { fake, state } = fakeSecrets();
  const client = clientOf(fake);
  const badName = await client.setSecret("not a name!", VALUE).catch((e: unknown) => e);
  assert.ok(isInvalidArgument(badName), String(badName));
  assert.deepEqual(badName.fieldViolations.map((v) => v.field), ["name"]);
  assertHidden("a bad name's error", badName);

  const empty = await client.setSecret("empty", "").catch((e: unknown) => e);
  assert.ok(isInvalidArgument(empty), String(empty));
  assert.deepEqual(empty.fieldViolations.map((v) => v.field), ["value"]);

  assert.ok(isNotFound(await client.deleteSecret("stripe-key").catch((e: unknown) => e)));

  state.noKey = true;
  const noKey = await client.setSecret("stripe-key", VALUE).catch((e: unknown) => e);
  assert.ok(isFailedPrecondition(noKey), String(noKey));
  assertHidden("a keyless server's error", noKey);
});

test("a reader's token is refused PERMISSION_DENIED", async () => {
  const fake = new FakeServer({
    SetSecret: () => {
      throw wireError(Code.PermissionDenied, "role reader may not call SecretService");
    },
    DeleteSecret: () => {
      throw wireError(Code.PermissionDenied, "role reader may not call SecretService");
    },
  });
  const reader = clientOf(fake, "reader");
  const denied = await reader.setSecret("stripe-key", VALUE).catch((e: unknown) => e);
  assert.ok(isPermissionDenied(denied), String(denied));
  assertHidden("a reader's error", denied);
  assert.ok(isPermissionDenied(await reader.deleteSecret("stripe-key").catch((e: unknown) => e)));
});

test("listSecrets pages through every secret", async () => {
  const { fake } = fakeSecrets();
  const client = clientOf(fake);
  for (const name of ["s4", "s2", "s0", "s3", "s1"]) await client.setSecret(name, VALUE);
  const listed: Secret[] = [];
  for await (const secret of client.listSecrets({ pageSize: 2 })) listed.push(secret);
  assert.deepEqual(listed.map((s) => `${s.name}@${s.version}`), ["s0@1", "s1@1", "s2@1", "s3@1", "s4@1"]);
  assert.deepEqual(fake.requests("ListSecrets").map((r) => [r.pageSize, r.pageToken]), [
    [2, ""],
    [2, "2"],
    [2, "4"],
  ]);
  assertHidden("the listed secrets", listed);

  // The default page size is the other lists'; a loop that stops early fetches no more.
  for await (const _ of client.listSecrets()) break;
  assert.equal(fake.requests("ListSecrets")[3].pageSize, 100);
  assert.equal(fake.requests("ListSecrets").length, 4);

  await client.deleteSecret("s0");
  assert.deepEqual(fake.requests("DeleteSecret").map((r) => r.name), ["s0"]);
});
