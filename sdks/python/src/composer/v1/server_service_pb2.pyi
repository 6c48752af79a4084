from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("server_version", "protocol_version", "features", "payload_offload_bytes", "max_payload_bytes", "max_message_bytes", "blob_urls")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_OFFLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOB_URLS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    protocol_version: str
    features: _containers.RepeatedScalarFieldContainer[str]
    payload_offload_bytes: int
    max_payload_bytes: int
    max_message_bytes: int
    blob_urls: bool
    def __init__(self, server_version: _Optional[str] = ..., protocol_version: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ..., payload_offload_bytes: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., blob_urls: _Optional[bool] = ...) -> None: ...
