import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueRateLimit(_message.Message):
    __slots__ = ("queue", "per_second", "burst", "per_key_per_second", "per_key_burst", "create_time", "update_time")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PER_KEY_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PER_KEY_BURST_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    queue: str
    per_second: float
    burst: int
    per_key_per_second: float
    per_key_burst: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, queue: _Optional[str] = ..., per_second: _Optional[float] = ..., burst: _Optional[int] = ..., per_key_per_second: _Optional[float] = ..., per_key_burst: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetQueueRateLimitRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: QueueRateLimit
    def __init__(self, limit: _Optional[_Union[QueueRateLimit, _Mapping]] = ...) -> None: ...

class SetQueueRateLimitResponse(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: QueueRateLimit
    def __init__(self, limit: _Optional[_Union[QueueRateLimit, _Mapping]] = ...) -> None: ...

class GetQueueRateLimitRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GetQueueRateLimitResponse(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: QueueRateLimit
    def __init__(self, limit: _Optional[_Union[QueueRateLimit, _Mapping]] = ...) -> None: ...

class ListQueueRateLimitsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueueRateLimitsResponse(_message.Message):
    __slots__ = ("limits", "next_page_token")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[QueueRateLimit]
    next_page_token: str
    def __init__(self, limits: _Optional[_Iterable[_Union[QueueRateLimit, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteQueueRateLimitRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class DeleteQueueRateLimitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
