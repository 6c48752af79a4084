import datetime

from composer.v1 import common_pb2 as _common_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BulkOperationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BULK_OPERATION_KIND_UNSPECIFIED: _ClassVar[BulkOperationKind]
    BULK_OPERATION_KIND_CANCEL: _ClassVar[BulkOperationKind]
    BULK_OPERATION_KIND_RETRY: _ClassVar[BulkOperationKind]
    BULK_OPERATION_KIND_PAUSE: _ClassVar[BulkOperationKind]
    BULK_OPERATION_KIND_RESUME: _ClassVar[BulkOperationKind]
    BULK_OPERATION_KIND_MIGRATE: _ClassVar[BulkOperationKind]

class BulkOperationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BULK_OPERATION_STATUS_UNSPECIFIED: _ClassVar[BulkOperationStatus]
    BULK_OPERATION_STATUS_PENDING: _ClassVar[BulkOperationStatus]
    BULK_OPERATION_STATUS_RUNNING: _ClassVar[BulkOperationStatus]
    BULK_OPERATION_STATUS_SUCCEEDED: _ClassVar[BulkOperationStatus]
    BULK_OPERATION_STATUS_CANCELLED: _ClassVar[BulkOperationStatus]
    BULK_OPERATION_STATUS_FAILED: _ClassVar[BulkOperationStatus]
BULK_OPERATION_KIND_UNSPECIFIED: BulkOperationKind
BULK_OPERATION_KIND_CANCEL: BulkOperationKind
BULK_OPERATION_KIND_RETRY: BulkOperationKind
BULK_OPERATION_KIND_PAUSE: BulkOperationKind
BULK_OPERATION_KIND_RESUME: BulkOperationKind
BULK_OPERATION_KIND_MIGRATE: BulkOperationKind
BULK_OPERATION_STATUS_UNSPECIFIED: BulkOperationStatus
BULK_OPERATION_STATUS_PENDING: BulkOperationStatus
BULK_OPERATION_STATUS_RUNNING: BulkOperationStatus
BULK_OPERATION_STATUS_SUCCEEDED: BulkOperationStatus
BULK_OPERATION_STATUS_CANCELLED: BulkOperationStatus
BULK_OPERATION_STATUS_FAILED: BulkOperationStatus

class StartRunRequest(_message.Message):
    __slots__ = ("workflow_name", "version", "input", "idempotency_key", "labels", "priority")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    version: int
    input: _struct_pb2.Value
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    priority: int
    def __init__(self, workflow_name: _Optional[str] = ..., version: _Optional[int] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "skip_nodes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_NODES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    skip_nodes: bool
    def __init__(self, run_id: _Optional[str] = ..., skip_nodes: _Optional[bool] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("workflow_name", "statuses", "labels", "create_time_after", "create_time_before", "parent_run_id", "page_size", "page_token", "workflow_version", "search")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.RunStatus]
    labels: _containers.ScalarMap[str, str]
    create_time_after: _timestamp_pb2.Timestamp
    create_time_before: _timestamp_pb2.Timestamp
    parent_run_id: str
    page_size: int
    page_token: str
    workflow_version: int
    search: str
    def __init__(self, workflow_name: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_common_pb2.RunStatus, str]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., create_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., workflow_version: _Optional[int] = ..., search: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_common_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CountRunsRequest(_message.Message):
    __slots__ = ("workflow_name", "workflow_version", "labels", "create_time_after", "create_time_before", "parent_run_id", "search")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    workflow_version: int
    labels: _containers.ScalarMap[str, str]
    create_time_after: _timestamp_pb2.Timestamp
    create_time_before: _timestamp_pb2.Timestamp
    parent_run_id: str
    search: str
    def __init__(self, workflow_name: _Optional[str] = ..., workflow_version: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., create_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_run_id: _Optional[str] = ..., search: _Optional[str] = ...) -> None: ...

class CountRunsResponse(_message.Message):
    __slots__ = ("counts", "more")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[RunStatusCount]
    more: bool
    def __init__(self, counts: _Optional[_Iterable[_Union[RunStatusCount, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class RunStatusCount(_message.Message):
    __slots__ = ("status", "count")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RunStatus
    count: int
    def __init__(self, status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., count: _Optional[int] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class RetryRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RetryRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class SendEventRequest(_message.Message):
    __slots__ = ("run_id", "correlation_key", "event_name", "payload", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_KEY_FIELD_NUMBER: _ClassVar[int]
    EVENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    correlation_key: str
    event_name: str
    payload: _struct_pb2.Value
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., correlation_key: _Optional[str] = ..., event_name: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SendEventResponse(_message.Message):
    __slots__ = ("delivered_run_ids", "stored")
    DELIVERED_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    delivered_run_ids: _containers.RepeatedScalarFieldContainer[str]
    stored: bool
    def __init__(self, delivered_run_ids: _Optional[_Iterable[str]] = ..., stored: _Optional[bool] = ...) -> None: ...

class GetRunHistoryRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetRunHistoryResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.HistoryEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[_common_pb2.HistoryEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ("run", "events")
    RUN_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.HistoryEvent]
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_common_pb2.HistoryEvent, _Mapping]]] = ...) -> None: ...

class PauseRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ResumeRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class RunFilter(_message.Message):
    __slots__ = ("workflow_name", "workflow_version", "statuses", "labels", "create_time_after", "create_time_before", "parent_run_id", "search")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    workflow_name: str
    workflow_version: int
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.RunStatus]
    labels: _containers.ScalarMap[str, str]
    create_time_after: _timestamp_pb2.Timestamp
    create_time_before: _timestamp_pb2.Timestamp
    parent_run_id: str
    search: str
    def __init__(self, workflow_name: _Optional[str] = ..., workflow_version: _Optional[int] = ..., statuses: _Optional[_Iterable[_Union[_common_pb2.RunStatus, str]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., create_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_run_id: _Optional[str] = ..., search: _Optional[str] = ...) -> None: ...

class BulkCancelRunsRequest(_message.Message):
    __slots__ = ("filter", "all", "reason", "request_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    filter: RunFilter
    all: bool
    reason: str
    request_id: str
    def __init__(self, filter: _Optional[_Union[RunFilter, _Mapping]] = ..., all: _Optional[bool] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class BulkCancelRunsResponse(_message.Message):
    __slots__ = ("operation", "created")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    created: bool
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class BulkRetryRunsRequest(_message.Message):
    __slots__ = ("filter", "all", "request_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    filter: RunFilter
    all: bool
    request_id: str
    def __init__(self, filter: _Optional[_Union[RunFilter, _Mapping]] = ..., all: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class BulkRetryRunsResponse(_message.Message):
    __slots__ = ("operation", "created")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    created: bool
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class BulkPauseRunsRequest(_message.Message):
    __slots__ = ("filter", "all", "reason", "request_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    filter: RunFilter
    all: bool
    reason: str
    request_id: str
    def __init__(self, filter: _Optional[_Union[RunFilter, _Mapping]] = ..., all: _Optional[bool] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class BulkPauseRunsResponse(_message.Message):
    __slots__ = ("operation", "created")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    created: bool
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class BulkResumeRunsRequest(_message.Message):
    __slots__ = ("filter", "all", "request_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    filter: RunFilter
    all: bool
    request_id: str
    def __init__(self, filter: _Optional[_Union[RunFilter, _Mapping]] = ..., all: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class BulkResumeRunsResponse(_message.Message):
    __slots__ = ("operation", "created")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    created: bool
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class MigrateRunsRequest(_message.Message):
    __slots__ = ("filter", "target_version", "node_mapping", "request_id")
    class NodeMappingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FILTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_MAPPING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    filter: RunFilter
    target_version: int
    node_mapping: _containers.ScalarMap[str, str]
    request_id: str
    def __init__(self, filter: _Optional[_Union[RunFilter, _Mapping]] = ..., target_version: _Optional[int] = ..., node_mapping: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class MigrateRunsResponse(_message.Message):
    __slots__ = ("operation", "created")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    created: bool
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class BulkOperation(_message.Message):
    __slots__ = ("operation_id", "namespace", "kind", "status", "filter", "reason", "matched", "succeeded", "skipped", "failed", "failures", "created_by", "create_time", "update_time", "end_time", "error", "target_version", "node_mapping")
    class NodeMappingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_MAPPING_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    namespace: str
    kind: BulkOperationKind
    status: BulkOperationStatus
    filter: RunFilter
    reason: str
    matched: int
    succeeded: int
    skipped: int
    failed: int
    failures: _containers.RepeatedCompositeFieldContainer[BulkOperationFailure]
    created_by: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    error: str
    target_version: int
    node_mapping: _containers.ScalarMap[str, str]
    def __init__(self, operation_id: _Optional[str] = ..., namespace: _Optional[str] = ..., kind: _Optional[_Union[BulkOperationKind, str]] = ..., status: _Optional[_Union[BulkOperationStatus, str]] = ..., filter: _Optional[_Union[RunFilter, _Mapping]] = ..., reason: _Optional[str] = ..., matched: _Optional[int] = ..., succeeded: _Optional[int] = ..., skipped: _Optional[int] = ..., failed: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[BulkOperationFailure, _Mapping]]] = ..., created_by: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., target_version: _Optional[int] = ..., node_mapping: _Optional[_Mapping[str, str]] = ...) -> None: ...

class BulkOperationFailure(_message.Message):
    __slots__ = ("run_id", "message")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    message: str
    def __init__(self, run_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GetBulkOperationRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...

class GetBulkOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ...) -> None: ...

class ListBulkOperationsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBulkOperationsResponse(_message.Message):
    __slots__ = ("operations", "next_page_token")
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[BulkOperation]
    next_page_token: str
    def __init__(self, operations: _Optional[_Iterable[_Union[BulkOperation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelBulkOperationRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...

class CancelBulkOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: BulkOperation
    def __init__(self, operation: _Optional[_Union[BulkOperation, _Mapping]] = ...) -> None: ...
