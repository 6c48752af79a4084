from composer.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
