"""JSON round-trip for the frozen dataclasses that attnforge records (snapshots, plans, records).

``to_jsonable`` turns a dataclass tree into plain JSON values (tuples become lists, enums their values);
``from_jsonable`` rebuilds it from the type hints, strictly: an unknown or missing field names its dotted path.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class DecodeError(ValueError):
    """A JSON document does not fit the dataclass; ``path`` is the dotted path of the bad field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or '<root>'}: {problem}")
        self.path = path
        self.problem = problem


def loads(text: str | bytes) -> Any:
    """``json.loads``, with a document nested deeper than Python's parser recurses (``[[[...`` a few thousand deep)
    refused as any invalid JSON is.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or nested too deeply (the parser's ``RecursionError``).
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def to_jsonable(value: Any) -> Any:
    """Convert dataclasses, enums, tuples and mappings into JSON-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def from_jsonable(cls: type[T], data: Any, path: str = "") -> T:
    """Rebuild ``cls`` from ``data`` produced by :func:`to_jsonable`.

    Raises:
        DecodeError: a field is missing, unknown or of the wrong type; the message names its dotted path.
    """
    return typing.cast(T, _decode(cls, data, path))


def _decode(tp: Any, data: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, data, path)
            except DecodeError as exc:
                errors.append(exc.problem)
        raise DecodeError(path, "; ".join(errors) or f"expected one of {args}")
    if origin is typing.Literal:
        if data not in get_args(tp):
            raise DecodeError(path, f"expected one of {get_args(tp)}, got {data!r}")
        return data
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):  # a NamedTuple
        hints = get_type_hints(tp)
        items = _decode(tuple[tuple(hints[f] for f in tp._fields)], data, path)  # type: ignore[misc]
        return tp(*items)
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(path, f"expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise DecodeError(path, f"expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(data, dict):
            raise DecodeError(path, f"expected an object, got {type(data).__name__}")
        vt = get_args(tp)[1] if get_args(tp) else Any
        return {k: _decode(vt, v, f"{path}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise DecodeError(path, f"expected an object, got {type(data).__name__}")
        hints = get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise DecodeError(f"{path}.{unknown[0]}" if path else unknown[0], "unknown field")
        kwargs = {}
        for name, f in fields.items():
            sub = f"{path}.{name}" if path else name
            if name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise DecodeError(sub, "missing field")
                continue
            kwargs[name] = _decode(hints[name], data[name], sub)
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise DecodeError(path, f"expected one of {[m.value for m in tp]}, got {data!r}") from None
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise DecodeError(path, f"expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise DecodeError(path, f"expected {tp.__name__}, got {data!r}")
        return data
    raise DecodeError(path, f"cannot decode type {tp!r}")
