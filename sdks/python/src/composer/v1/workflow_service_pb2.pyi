from composer.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplayVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLAY_VERDICT_UNSPECIFIED: _ClassVar[ReplayVerdict]
    REPLAY_VERDICT_IDENTICAL: _ClassVar[ReplayVerdict]
    REPLAY_VERDICT_COMPATIBLE: _ClassVar[ReplayVerdict]
    REPLAY_VERDICT_INCOMPATIBLE: _ClassVar[ReplayVerdict]
    REPLAY_VERDICT_UNREPLAYABLE: _ClassVar[ReplayVerdict]

class CheckScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECK_SCOPE_UNSPECIFIED: _ClassVar[CheckScope]
    CHECK_SCOPE_IN_FLIGHT: _ClassVar[CheckScope]
    CHECK_SCOPE_COMPLETED: _ClassVar[CheckScope]
REPLAY_VERDICT_UNSPECIFIED: ReplayVerdict
REPLAY_VERDICT_IDENTICAL: ReplayVerdict
REPLAY_VERDICT_COMPATIBLE: ReplayVerdict
REPLAY_VERDICT_INCOMPATIBLE: ReplayVerdict
REPLAY_VERDICT_UNREPLAYABLE: ReplayVerdict
CHECK_SCOPE_UNSPECIFIED: CheckScope
CHECK_SCOPE_IN_FLIGHT: CheckScope
CHECK_SCOPE_COMPLETED: CheckScope

class RegisterWorkflowRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: str
    def __init__(self, source: _Optional[str] = ...) -> None: ...

class RegisterWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "created")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    workflow: _common_pb2.WorkflowVersion
    created: bool
    def __init__(self, workflow: _Optional[_Union[_common_pb2.WorkflowVersion, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ValidateWorkflowRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: str
    def __init__(self, source: _Optional[str] = ...) -> None: ...

class ValidationProblem(_message.Message):
    __slots__ = ("path", "message")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    path: str
    message: str
    def __init__(self, path: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ValidateWorkflowResponse(_message.Message):
    __slots__ = ("valid", "problems")
    VALID_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    problems: _containers.RepeatedCompositeFieldContainer[ValidationProblem]
    def __init__(self, valid: _Optional[bool] = ..., problems: _Optional[_Iterable[_Union[ValidationProblem, _Mapping]]] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetWorkflowResponse(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: _common_pb2.WorkflowVersion
    def __init__(self, workflow: _Optional[_Union[_common_pb2.WorkflowVersion, _Mapping]] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "name_prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    name_prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., name_prefix: _Optional[str] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows", "next_page_token")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkflowSummary]
    next_page_token: str
    def __init__(self, workflows: _Optional[_Iterable[_Union[_common_pb2.WorkflowSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListWorkflowVersionsRequest(_message.Message):
    __slots__ = ("name", "page_size", "page_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    page_size: int
    page_token: str
    def __init__(self, name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkflowVersionsResponse(_message.Message):
    __slots__ = ("versions", "next_page_token")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkflowVersion]
    next_page_token: str
    def __init__(self, versions: _Optional[_Iterable[_Union[_common_pb2.WorkflowVersion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RecordedRun(_message.Message):
    __slots__ = ("run", "workflow", "events")
    RUN_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    workflow: _common_pb2.WorkflowVersion
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.HistoryEvent]
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., workflow: _Optional[_Union[_common_pb2.WorkflowVersion, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_common_pb2.HistoryEvent, _Mapping]]] = ...) -> None: ...

class ReplayRunRequest(_message.Message):
    __slots__ = ("run_id", "history", "source", "version", "node_mapping")
    class NodeMappingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_MAPPING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    history: RecordedRun
    source: str
    version: int
    node_mapping: _containers.ScalarMap[str, str]
    def __init__(self, run_id: _Optional[str] = ..., history: _Optional[_Union[RecordedRun, _Mapping]] = ..., source: _Optional[str] = ..., version: _Optional[int] = ..., node_mapping: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReplayRunResponse(_message.Message):
    __slots__ = ("replay",)
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    replay: RunReplay
    def __init__(self, replay: _Optional[_Union[RunReplay, _Mapping]] = ...) -> None: ...

class ReplayDivergence(_message.Message):
    __slots__ = ("rule", "node_id", "sequence", "message")
    RULE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    rule: str
    node_id: str
    sequence: int
    message: str
    def __init__(self, rule: _Optional[str] = ..., node_id: _Optional[str] = ..., sequence: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReplayDifference(_message.Message):
    __slots__ = ("kind", "node_id", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    node_id: str
    message: str
    def __init__(self, kind: _Optional[str] = ..., node_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RunReplay(_message.Message):
    __slots__ = ("run_id", "workflow_version", "status", "verdict", "divergence", "differences", "unreplayable_reason", "events")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DIVERGENCE_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCES_FIELD_NUMBER: _ClassVar[int]
    UNREPLAYABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    workflow_version: int
    status: _common_pb2.RunStatus
    verdict: ReplayVerdict
    divergence: ReplayDivergence
    differences: _containers.RepeatedCompositeFieldContainer[ReplayDifference]
    unreplayable_reason: str
    events: int
    def __init__(self, run_id: _Optional[str] = ..., workflow_version: _Optional[int] = ..., status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., verdict: _Optional[_Union[ReplayVerdict, str]] = ..., divergence: _Optional[_Union[ReplayDivergence, _Mapping]] = ..., differences: _Optional[_Iterable[_Union[ReplayDifference, _Mapping]]] = ..., unreplayable_reason: _Optional[str] = ..., events: _Optional[int] = ...) -> None: ...

class CheckWorkflowVersionRequest(_message.Message):
    __slots__ = ("name", "source", "version", "node_mapping", "scope", "page_size", "page_token")
    class NodeMappingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_MAPPING_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    version: int
    node_mapping: _containers.ScalarMap[str, str]
    scope: CheckScope
    page_size: int
    page_token: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., version: _Optional[int] = ..., node_mapping: _Optional[_Mapping[str, str]] = ..., scope: _Optional[_Union[CheckScope, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class CheckWorkflowVersionResponse(_message.Message):
    __slots__ = ("checked", "identical", "compatible", "incompatible", "unreplayable", "runs", "next_page_token")
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    IDENTICAL_FIELD_NUMBER: _ClassVar[int]
    COMPATIBLE_FIELD_NUMBER: _ClassVar[int]
    INCOMPATIBLE_FIELD_NUMBER: _ClassVar[int]
    UNREPLAYABLE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checked: int
    identical: int
    compatible: int
    incompatible: int
    unreplayable: int
    runs: _containers.RepeatedCompositeFieldContainer[RunReplay]
    next_page_token: str
    def __init__(self, checked: _Optional[int] = ..., identical: _Optional[int] = ..., compatible: _Optional[int] = ..., incompatible: _Optional[int] = ..., unreplayable: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[RunReplay, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
