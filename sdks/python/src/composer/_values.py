"""Conversion between Python's JSON values and ``google.protobuf.Value``.

Every payload on the wire (run input and output, task input and output, event
payloads, failure details) is a ``google.protobuf.Value``. The SDK shows them
to users as plain Python: ``None``, ``bool``, ``int``, ``float``, ``str``,
``list`` and ``dict`` with string keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

# A JSON number is a double on the wire; integral values up to 2**53 come back
# as int, as json.loads would read them.
_MAX_SAFE_INT = 2**53


def to_value(obj: Any) -> struct_pb2.Value:
    """Converts a JSON-able Python value into a ``google.protobuf.Value``.

    Raises ``TypeError`` for anything that is not JSON (sets, bytes, objects,
    dicts with non-string keys) and ``ValueError`` for NaN and infinities.
    """
    value = struct_pb2.Value()
    _fill(value, obj, "$")
    return value


def _fill(value: struct_pb2.Value, obj: Any, path: str) -> None:
    if obj is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):
        value.bool_value = obj
    elif isinstance(obj, (int, float)):
        number = float(obj)
        if math.isnan(number) or math.isinf(number):
            raise ValueError(f"{path}: {obj!r} is not a JSON number")
        value.number_value = number
    elif isinstance(obj, str):
        value.string_value = obj
    elif isinstance(obj, Mapping):
        struct = value.struct_value
        struct.Clear()
        for key, item in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: object key {key!r} is not a string")
            _fill(struct.fields[key], item, f"{path}.{key}")
    elif isinstance(obj, (list, tuple)):
        values = value.list_value
        values.Clear()
        for index, item in enumerate(obj):
            _fill(values.values.add(), item, f"{path}[{index}]")
    else:
        raise TypeError(f"{path}: {type(obj).__name__} is not JSON (use dict, list, str, number, bool or None)")


def from_value(value: struct_pb2.Value | None) -> Any:
    """Converts a ``google.protobuf.Value`` into plain Python (an unset Value is ``None``)."""
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        number = value.number_value
        if number.is_integer() and abs(number) <= _MAX_SAFE_INT:
            return int(number)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return {key: from_value(item) for key, item in value.struct_value.fields.items()}
    return [from_value(item) for item in value.list_value.values]


def from_optional_field(message: Any, field: str) -> Any:
    """Returns a message's Value field as Python, ``None`` when the field is unset."""
    if not message.HasField(field):
        return None
    return from_value(getattr(message, field))
