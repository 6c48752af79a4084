// Server addresses: the forms a Client and a Worker accept, from the option or COMPOSER_ADDRESS, and
// the clear error a malformed one throws from the constructor (before any call). No server.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { Client, Worker } from "../../src/index.js";
import { baseUrlOf } from "../../src/transport-node.js";

const saved = process.env["COMPOSER_ADDRESS"];
afterEach(() => {
  if (saved === undefined) delete process.env["COMPOSER_ADDRESS"];
  else process.env["COMPOSER_ADDRESS"] = saved;
});

test("host:port, http://host:port and https://host:port are accepted; the scheme decides TLS", () => {
  assert.equal(baseUrlOf("127.0.0.1:7070"), "http://127.0.0.1:7070");
  assert.equal(baseUrlOf("127.0.0.1:7070", true), "https://127.0.0.1:7070");
  assert.equal(baseUrlOf("composer.internal:7070"), "http://composer.internal:7070");
  assert.equal(baseUrlOf("[::1]:7070"), "http://[::1]:7070");
  assert.equal(baseUrlOf("http://127.0.0.1:7070"), "http://127.0.0.1:7070");
  assert.equal(baseUrlOf("http://127.0.0.1:7070/"), "http://127.0.0.1:7070");
  assert.equal(baseUrlOf("HTTPS://composer.example.com:8443"), "https://composer.example.com:8443");
  assert.equal(baseUrlOf("https://composer.example.com"), "https://composer.example.com", "a URL may use its scheme's port");
  assert.equal(baseUrlOf("https://composer.example.com:8443", true), "https://composer.example.com:8443");
});

test("a malformed address throws a TypeError naming it, why, and the accepted forms", () => {
  const cases: [string, RegExp][] = [
    ["", /it is empty/],
    ["localhost", /it has no port/],
    ["localhost:", /it has no port/],
    ["localhost:http", /the port "http" is not a number from 1 to 65535/],
    ["localhost:0", /the port "0" is not a number/],
    ["localhost:70700", /the port "70700" is not a number/],
    ["grpc://localhost:7070", /the scheme grpc:\/\/ is not http:\/\/ or https:\/\//],
    ["dns:///localhost:7070", /the scheme dns:\/\/ is not/],
    ["http://localhost:7070/composer", /it has a path, query or fragment/],
    ["http://localhost:7070?x=1", /the port "7070\?x=1" is not a number|it has a path, query or fragment/],
    ["http://user:pw@localhost:7070", /it carries credentials/],
    ["local host:7070", /it is not host:port/],
  ];
  for (const [address, why] of cases) {
    assert.throws(
      () => baseUrlOf(address),
      (e: unknown) => {
        assert.ok(e instanceof TypeError, `${address}: ${String(e)}`);
        assert.match(e.message, why, address);
        assert.ok(e.message.startsWith(`invalid Composer server address ${JSON.stringify(address)}: `), e.message);
        assert.ok(e.message.endsWith("expected host:port, http://host:port or https://host:port"), e.message);
        return true;
      },
    );
  }
  assert.throws(() => baseUrlOf("http://localhost:7070", true), /http:\/\/ with tls: use https:\/\//);
});

test("Client and Worker take every form, from the option or from COMPOSER_ADDRESS", () => {
  for (const address of ["127.0.0.1:7070", "http://127.0.0.1:7070", "https://127.0.0.1:7443"]) {
    const client = new Client({ address });
    assert.equal(client.address, address);
    client.close();
    assert.equal(new Worker({ address }).address, address);

    process.env["COMPOSER_ADDRESS"] = address;
    const fromEnv = new Client();
    assert.equal(fromEnv.address, address);
    fromEnv.close();
    assert.equal(new Worker().address, address);
  }
});

test("a malformed address fails the constructor at once, naming COMPOSER_ADDRESS when it came from there", () => {
  assert.throws(() => new Client({ address: "localhost" }), /^TypeError: invalid Composer server address "localhost": it has no port/);
  assert.throws(() => new Worker({ address: "grpc://localhost:7070" }), /invalid Composer server address "grpc:\/\/localhost:7070": the scheme/);

  process.env["COMPOSER_ADDRESS"] = "localhost:http";
  assert.throws(() => new Client(), /invalid Composer server address COMPOSER_ADDRESS="localhost:http": the port "http"/);
  assert.throws(() => new Worker(), /invalid Composer server address COMPOSER_ADDRESS="localhost:http": the port "http"/);
  // An explicit address wins over a bad COMPOSER_ADDRESS.
  const client = new Client({ address: "127.0.0.1:7070" });
  client.close();
});
