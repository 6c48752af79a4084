// Smoke test of the generated wire layer (src/gen/composer/v1): messages
// round-trip, service descriptors list their methods, and connect clients
// build on both transports the SDK uses (gRPC in Node, grpc-web in browsers).
// No server is contacted.
import assert from "node:assert/strict";
import { test } from "node:test";

import { create, equals, fromBinary, fromJson, toBinary, toJson } from "@bufbuild/protobuf";
import { DurationSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { createGrpcWebTransport } from "@connectrpc/connect-web";

import { RunStatus } from "../../src/gen/composer/v1/common_pb.js";
import { RunService, StartRunRequestSchema } from "../../src/gen/composer/v1/run_service_pb.js";
import { ServerService } from "../../src/gen/composer/v1/server_service_pb.js";
import {
  PollTasksResponseSchema,
  TaskSchema,
  WorkerService,
} from "../../src/gen/composer/v1/worker_service_pb.js";
import { WorkflowService } from "../../src/gen/composer/v1/workflow_service_pb.js";

test("StartRunRequest with a Value payload round-trips", () => {
  const request = create(StartRunRequestSchema, {
    workflowName: "checkout",
    version: 3,
    input: fromJson(ValueSchema, { order_id: "A-17", amount: 12.5, items: [1, 2], rush: true }),
    idempotencyKey: "order-A-17",
    labels: { team: "payments" },
  });

  const decoded = fromBinary(StartRunRequestSchema, toBinary(StartRunRequestSchema, request));
  assert.ok(equals(StartRunRequestSchema, decoded, request));
  assert.equal(decoded.workflowName, "checkout");
  assert.equal(decoded.labels["team"], "payments");

  const json = toJson(StartRunRequestSchema, decoded);
  assert.deepEqual(json, {
    workflowName: "checkout",
    version: 3,
    input: { order_id: "A-17", amount: 12.5, items: [1, 2], rush: true },
    idempotencyKey: "order-A-17",
    labels: { team: "payments" },
  });
  assert.ok(equals(StartRunRequestSchema, fromJson(StartRunRequestSchema, json), request));
});

test("messages reference each other across files", () => {
  const response = create(PollTasksResponseSchema, {
    tasks: [
      create(TaskSchema, {
        taskId: "t-1",
        attempt: 2,
        leaseToken: "lease-9",
        leaseDuration: create(DurationSchema, { seconds: 30n }),
      }),
    ],
  });
  const decoded = fromBinary(PollTasksResponseSchema, toBinary(PollTasksResponseSchema, response));
  assert.equal(decoded.tasks[0]?.leaseToken, "lease-9");
  assert.equal(decoded.tasks[0]?.leaseDuration?.seconds, 30n);
  assert.equal(RunStatus[RunStatus.COMPLETED], "COMPLETED");
});

test("service descriptors list their methods", () => {
  const services = [RunService, ServerService, WorkerService, WorkflowService];
  assert.deepEqual(
    services.map((s) => s.typeName),
    [
      "composer.v1.RunService",
      "composer.v1.ServerService",
      "composer.v1.WorkerService",
      "composer.v1.WorkflowService",
    ],
  );
  for (const service of services) {
    assert.ok(service.methods.length > 0, `${service.typeName} has no methods`);
  }
  assert.equal(RunService.method.startRun.name, "StartRun");
  assert.equal(RunService.method.watchRun.methodKind, "server_streaming");
  assert.deepEqual(
    WorkerService.methods.map((m) => m.name),
    ["PollTasks", "Heartbeat", "CompleteTask", "FailTask"],
  );
});

test("connect clients build on the gRPC and grpc-web transports", () => {
  const grpc = createClient(
    WorkerService,
    createGrpcTransport({ baseUrl: "http://127.0.0.1:1" }),
  );
  const grpcWeb = createClient(
    RunService,
    createGrpcWebTransport({ baseUrl: "http://127.0.0.1:1" }),
  );
  assert.equal(typeof grpc.pollTasks, "function");
  assert.equal(typeof grpc.heartbeat, "function");
  assert.equal(typeof grpcWeb.startRun, "function");
  assert.equal(typeof grpcWeb.watchRun, "function");
});
