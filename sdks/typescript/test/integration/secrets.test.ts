// setSecret, listSecrets and deleteSecret against the real server (docs/secrets.md). The servers
// get a secrets key from the harness (secretsKeyFile); each test acts in a namespace of its own (a
// token minted for it), so the namespace's list holds only what the test set.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { toBinary } from "@bufbuild/protobuf";

import { Client, isFailedPrecondition, isInvalidArgument, isNotFound, isPermissionDenied, type Secret } from "../../src/index.js";
import { ListSecretsResponseSchema } from "../../src/gen/composer/v1/secret_service_pb.js";
import { ServerProcess, useServer, hex, mintToken } from "./harness.js";

const stack = useServer();

async function listed(client: Client, pageSize?: number): Promise<Secret[]> {
  const out: Secret[] = [];
  for await (const secret of client.listSecrets(pageSize === undefined ? {} : { pageSize })) out.push(secret);
  return out;
}

function contains(haystack: Uint8Array, needle: Uint8Array): boolean {
  return Buffer.from(haystack).includes(Buffer.from(needle));
}

describe("secrets", { timeout: 120_000 }, () => {
  test("a secret is set twice, listed without its value, deleted, and then NOT_FOUND", async () => {
    const suffix = hex();
    const subject = `ops-${suffix}`;
    const client = new Client({ address: stack.server.address, token: mintToken(["operator"], { namespace: `secrets-${suffix}`, subject }) });
    try {
      const name = `stripe-key-${suffix}`;
      const value = `sk_live_${hex(16)}`;

      const first = await client.setSecret(name, value);
      assert.equal(first.name, name);
      assert.equal(first.version, 1);
      assert.equal(first.updatedBy, subject);
      assert.ok(first.createTime instanceof Date && first.updateTime instanceof Date, JSON.stringify(first));

      const second = await client.setSecret(name, new TextEncoder().encode(`${value}-rotated`));
      assert.equal(second.version, 2);
      assert.deepEqual(second.createTime, first.createTime);
      assert.ok(second.updateTime! >= first.updateTime!);

      assert.deepEqual(await listed(client, 1), [second]);
      // The answer on the wire, unknown fields and all, carries no value.
      const answer = await client.raw.secrets.listSecrets({}, client.callOptions());
      assert.deepEqual(answer.secrets.map((s) => s.name), [name]);
      assert.ok(!contains(toBinary(ListSecretsResponseSchema, answer), new TextEncoder().encode(value)), "the list answer carries the value");

      await client.deleteSecret(name);
      assert.deepEqual(await listed(client), []);
      const again = await client.deleteSecret(name).catch((e: unknown) => e);
      assert.ok(isNotFound(again), String(again));

      const badName = await client.setSecret("not a name!", value).catch((e: unknown) => e);
      assert.ok(isInvalidArgument(badName), String(badName));
      assert.ok(badName.fieldViolations.some((v) => v.field === "name"), String(badName));
      assert.ok(!String(badName).includes(value) && !badName.message.includes(value));
      const empty = await client.setSecret(name, "").catch((e: unknown) => e);
      assert.ok(isInvalidArgument(empty), String(empty));
      assert.ok(empty.fieldViolations.some((v) => v.field === "value"), String(empty));

      assert.ok(!readFileSync(stack.server.logPath, "utf8").includes(value), "the server logged the value");
    } finally {
      client.close();
    }
  });

  test("a reader may not touch the namespace's secrets, and another namespace sees none", async () => {
    const suffix = hex();
    const namespace = `secrets-${suffix}`;
    const name = `db-password-${suffix}`;
    const operator = new Client({ address: stack.server.address, token: mintToken(["operator"], { namespace }) });
    const reader = new Client({ address: stack.server.address, token: mintToken(["reader"], { namespace }) });
    const elsewhere = new Client({ address: stack.server.address, token: mintToken(["operator"], { namespace: `other-${suffix}` }) });
    try {
      await operator.setSecret(name, "hunter2");
      const set = await reader.setSecret(name, "overwritten").catch((e: unknown) => e);
      assert.ok(isPermissionDenied(set), String(set));
      const list = await listed(reader).catch((e: unknown) => e);
      assert.ok(isPermissionDenied(list), String(list));
      const deleted = await reader.deleteSecret(name).catch((e: unknown) => e);
      assert.ok(isPermissionDenied(deleted), String(deleted));

      assert.deepEqual(await listed(elsewhere), []);
      const missing = await elsewhere.deleteSecret(name).catch((e: unknown) => e);
      assert.ok(isNotFound(missing), String(missing));
      assert.deepEqual((await listed(operator)).map((s) => [s.name, s.version]), [[name, 1]]);
    } finally {
      operator.close();
      reader.close();
      elsewhere.close();
    }
  });

  test("a server given no secrets key answers FAILED_PRECONDITION", async () => {
    const keyless = new ServerProcess(stack.server.databaseUrl, stack.server.redisUrl, [], { secretsKey: false });
    await keyless.start();
    const suffix = hex();
    const client = new Client({ address: keyless.address, token: mintToken(["operator"], { namespace: `keyless-${suffix}` }) });
    try {
      const refused = await client.setSecret(`k-${suffix}`, "value").catch((e: unknown) => e);
      assert.ok(isFailedPrecondition(refused), String(refused));
    } finally {
      client.close();
      await keyless.stop();
    }
  });
});
