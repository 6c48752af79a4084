"""Smoke test of the generated wire layer (composer.v1): it imports, its
messages round-trip, and the gRPC stubs for every service exist and bind to a
grpc.aio channel."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil

import grpc
from google.protobuf import json_format, struct_pb2

import composer
import composer.v1
from composer.v1 import run_service_pb2, run_service_pb2_grpc, worker_service_pb2

SERVICES = {
    "run_service": "RunService",
    "server_service": "ServerService",
    "worker_service": "WorkerService",
    "workflow_service": "WorkflowService",
}


def generated_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(composer.v1.__path__, "composer.v1."))


def test_package_entry() -> None:
    assert composer.__version__
    assert composer.__doc__


def test_every_generated_module_imports() -> None:
    names = generated_modules()
    for stem in ["common", *SERVICES]:
        assert f"composer.v1.{stem}_pb2" in names
        assert f"composer.v1.{stem}_pb2_grpc" in names
    for name in names:
        importlib.import_module(name)


def test_request_with_value_payload_round_trips() -> None:
    payload = struct_pb2.Value()
    payload.struct_value.update({"order_id": "A-17", "amount": 12.5, "items": [1, 2], "rush": True})
    request = run_service_pb2.StartRunRequest(
        workflow_name="checkout",
        version=3,
        input=payload,
        idempotency_key="order-A-17",
        labels={"team": "payments"},
    )

    decoded = run_service_pb2.StartRunRequest.FromString(request.SerializeToString())
    assert decoded == request
    assert decoded.input.struct_value["order_id"] == "A-17"
    assert decoded.input.struct_value.fields["items"].list_value.values[1].number_value == 2
    assert decoded.labels["team"] == "payments"

    as_json = json_format.MessageToDict(decoded)
    assert as_json["workflowName"] == "checkout"
    assert as_json["input"]["amount"] == 12.5
    assert json_format.ParseDict(as_json, run_service_pb2.StartRunRequest()) == request


def test_messages_reference_each_other_across_files() -> None:
    task = worker_service_pb2.Task(task_id="t-1", attempt=2, lease_token="lease-9")
    task.lease_duration.FromSeconds(30)
    response = worker_service_pb2.PollTasksResponse(tasks=[task])
    decoded = worker_service_pb2.PollTasksResponse.FromString(response.SerializeToString())
    assert decoded.tasks[0].lease_duration.seconds == 30
    assert decoded.tasks[0].lease_token == "lease-9"


def test_every_service_has_grpc_stubs() -> None:
    found: dict[str, str] = {}
    for name in generated_modules():
        if name.endswith("_pb2"):
            module = importlib.import_module(name)
            for service in module.DESCRIPTOR.services_by_name.values():
                found[service.name] = name
    # Every composer.v1 service, also any added later, must have its stubs.
    assert set(SERVICES.values()) <= set(found), found
    for service, pb2_name in found.items():
        descriptor = importlib.import_module(pb2_name).DESCRIPTOR.services_by_name[service]
        assert descriptor.full_name == f"composer.v1.{service}"
        assert descriptor.methods, service
        grpc_module = importlib.import_module(f"{pb2_name}_grpc")
        for cls in [f"{service}Stub", f"{service}Servicer"]:
            assert isinstance(getattr(grpc_module, cls, None), type), cls
        assert callable(getattr(grpc_module, f"add_{service}Servicer_to_server"))


def test_stub_binds_to_grpc_aio_channel() -> None:
    async def bind() -> None:
        # No server is contacted: an aio channel connects lazily.
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
            stub = run_service_pb2_grpc.RunServiceStub(channel)
            assert isinstance(stub.StartRun, grpc.aio.UnaryUnaryMultiCallable)
            assert isinstance(stub.WatchRun, grpc.aio.UnaryStreamMultiCallable)

    asyncio.run(bind())
