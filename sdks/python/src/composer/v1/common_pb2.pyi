import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_COMPENSATING: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
    RUN_STATUS_PAUSED: _ClassVar[RunStatus]
    RUN_STATUS_QUEUED: _ClassVar[RunStatus]

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_SCHEDULED: _ClassVar[NodeStatus]
    NODE_STATUS_RUNNING: _ClassVar[NodeStatus]
    NODE_STATUS_WAITING: _ClassVar[NodeStatus]
    NODE_STATUS_COMPLETED: _ClassVar[NodeStatus]
    NODE_STATUS_FAILED: _ClassVar[NodeStatus]
    NODE_STATUS_SKIPPED: _ClassVar[NodeStatus]
    NODE_STATUS_CANCELLED: _ClassVar[NodeStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_COMPENSATING: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_PAUSED: RunStatus
RUN_STATUS_QUEUED: RunStatus
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_SCHEDULED: NodeStatus
NODE_STATUS_RUNNING: NodeStatus
NODE_STATUS_WAITING: NodeStatus
NODE_STATUS_COMPLETED: NodeStatus
NODE_STATUS_FAILED: NodeStatus
NODE_STATUS_SKIPPED: NodeStatus
NODE_STATUS_CANCELLED: NodeStatus

class Failure(_message.Message):
    __slots__ = ("code", "message", "node_id", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    node_id: str
    details: _struct_pb2.Value
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., node_id: _Optional[str] = ..., details: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class WorkflowVersion(_message.Message):
    __slots__ = ("namespace", "name", "version", "description", "source", "definition", "content_hash", "create_time")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    version: int
    description: str
    source: str
    definition: _struct_pb2.Value
    content_hash: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., description: _Optional[str] = ..., source: _Optional[str] = ..., definition: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., content_hash: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkflowSummary(_message.Message):
    __slots__ = ("namespace", "name", "latest_version", "description", "update_time")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    latest_version: int
    description: str
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., latest_version: _Optional[int] = ..., description: _Optional[str] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node_id", "node_type", "status", "attempt", "output", "error", "start_time", "end_time", "input", "worker_id", "lease_expire_time")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_type: str
    status: NodeStatus
    attempt: int
    output: _struct_pb2.Value
    error: Failure
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    input: _struct_pb2.Value
    worker_id: str
    lease_expire_time: _timestamp_pb2.Timestamp
    def __init__(self, node_id: _Optional[str] = ..., node_type: _Optional[str] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., attempt: _Optional[int] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[Failure, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., worker_id: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "namespace", "workflow_name", "workflow_version", "status", "input", "output", "error", "labels", "idempotency_key", "parent_run_id", "parent_node_id", "create_time", "update_time", "end_time", "nodes", "priority", "concurrency_key")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    namespace: str
    workflow_name: str
    workflow_version: int
    status: RunStatus
    input: _struct_pb2.Value
    output: _struct_pb2.Value
    error: Failure
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    parent_run_id: str
    parent_node_id: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    nodes: _containers.RepeatedCompositeFieldContainer[NodeState]
    priority: int
    concurrency_key: str
    def __init__(self, run_id: _Optional[str] = ..., namespace: _Optional[str] = ..., workflow_name: _Optional[str] = ..., workflow_version: _Optional[int] = ..., status: _Optional[_Union[RunStatus, str]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[Failure, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., parent_node_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., priority: _Optional[int] = ..., concurrency_key: _Optional[str] = ...) -> None: ...

class HistoryEvent(_message.Message):
    __slots__ = ("sequence", "event_time", "event_type", "node_id", "attempt", "actor", "details")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    event_time: _timestamp_pb2.Timestamp
    event_type: str
    node_id: str
    attempt: int
    actor: str
    details: _struct_pb2.Value
    def __init__(self, sequence: _Optional[int] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event_type: _Optional[str] = ..., node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., actor: _Optional[str] = ..., details: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
