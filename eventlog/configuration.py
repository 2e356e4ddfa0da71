"""Typed, frozen configuration objects loaded from TOML.

Each component owns one frozen dataclass whose fields carry their documentation
(`field(metadata={"doc": ...})`) and whose `validate()` checks cross-field rules. This module
turns a TOML table into such an object and names the exact key and value when something is wrong:
an unknown key, a value of the wrong type, or a value outside its allowed range.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from eventlog.errors import ConfigError


class ConfigObject(Protocol):
    """What `from_mapping` needs of a config class: a dataclass.

    A class with rules across fields also defines `validate(self, section: str) -> None`, raising
    `ConfigError` naming the offending key; `from_mapping` calls it after building the object.
    """

    __dataclass_fields__: typing.ClassVar[dict[str, Any]]


C = TypeVar("C", bound=ConfigObject)


def doc(text: str, **limits: Any) -> dict[str, Any]:
    """Field metadata: the field's documentation plus optional `min` / `max` limits."""
    return {"doc": text, **limits}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning a parse error into a `ConfigError` that names the file."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(str(p), None, "config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), None, f"invalid TOML: {exc}") from None


def from_mapping(cls: type[C], data: Mapping[str, Any] | None, section: str) -> C:
    """Build `cls` from one TOML table; missing keys take their defaults.

    Raises `ConfigError` naming `section.key` for unknown keys, wrong types and out-of-range values.
    """
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{section}.{key}" if section else key
        field = fields.get(key)
        if field is None:
            known = ", ".join(sorted(fields))
            raise ConfigError(name, value, f"unknown key (known keys: {known})")
        kwargs[key] = _coerce(name, value, hints[key])
        _check_limits(name, kwargs[key], field.metadata)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(section)
    return obj


def describe(cls: type[ConfigObject]) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, doc) for every field: used to document config files."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = f.default if f.default is not dataclasses.MISSING else None
        rows.append((f.name, _type_name(hints[f.name]), default, f.metadata.get("doc", "")))
    return rows


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(name: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(name, value, f"must be one of {', '.join(repr(a) for a in allowed)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for arg in args:
            try:
                return _coerce(name, value, arg)
            except ConfigError as exc:
                errors.append(exc.problem)
        raise ConfigError(name, value, " or ".join(errors))
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise ConfigError(name, value, "must be a list")
        return tuple(_coerce(f"{name}[{i}]", v, item_tp) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(name, value, "must be a table")
        return from_mapping(tp, value, name)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(name, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, value, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(name, value, "must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(name, value, "must be a string")
        return value
    raise AssertionError(f"config field {name} has unsupported type {tp!r}")


def _check_limits(name: str, value: Any, metadata: Mapping[str, Any]) -> None:
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and value < low:
        raise ConfigError(name, value, f"must be >= {low}")
    if high is not None and value > high:
        raise ConfigError(name, value, f"must be <= {high}")


def parse_address(text: str, key: str) -> tuple[str, int]:
    """(host, port) of `text`, host:port; a ConfigError naming `key` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, text, "must be host:port")
    return host, int(port)
