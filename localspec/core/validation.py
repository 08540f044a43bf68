"""Declared ranges for dataclass fields, checked in one place.

Settings dataclasses declare each field with :func:`setting`, giving its
allowed range or choices and a one-line help text. :func:`validate` checks a
whole instance and raises :class:`ConfigError` naming the key, the bad value
and what is allowed — the same message whether the value came from
config.yaml, a command-line flag or the UI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import Field, field, fields
from typing import Any

from localspec.core.errors import ConfigError


def setting(
    default: Any,
    help: str,
    lo: float | None = None,
    hi: float | None = None,
    choices: Sequence[Any] | None = None,
    lo_open: bool = False,
) -> Any:
    """A dataclass field with its allowed range (``lo``/``hi`` inclusive unless ``lo_open``) or choices."""
    return field(
        default=default,
        metadata={"help": help, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open},
    )


def allowed_text(f: Field) -> str:
    """Human description of a field's allowed values, for messages and ``--help``."""
    meta = f.metadata
    if meta.get("choices") is not None:
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return f"{'above' if meta.get('lo_open') else 'from'} {lo} {'up to' if meta.get('lo_open') else 'to'} {hi}"
    if lo is not None:
        return f"{'above' if meta.get('lo_open') else 'at least'} {lo}"
    if hi is not None:
        return f"at most {hi}"
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "value")
    return "a list of text" if kind.replace(" ", "") == "tuple[str,...]" else "any " + kind


def check_value(f: Field, value: Any, key: str) -> Any:
    """Coerce ``value`` to the field's type and check its range; return the clean value."""
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    typ = typ.replace(" ", "")
    value = coerce(value, typ, key, f)
    meta = f.metadata
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ConfigError(f"{key} = {value!r} is not allowed; use {allowed_text(f)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = meta.get("lo"), meta.get("hi")
        bad = (
            (isinstance(value, float) and not math.isfinite(value))
            or (lo is not None and (value <= lo if meta.get("lo_open") else value < lo))
            or (hi is not None and value > hi)
        )
        if bad:
            raise ConfigError(f"{key} = {value!r} is out of range; allowed: {allowed_text(f)}")
    return value


def validate(obj: Any, section: str) -> None:
    """Check (and coerce in place) every declared field of a settings dataclass."""
    for f in fields(obj):
        if "help" not in f.metadata:
            continue
        key = f"{section}.{f.name}" if section else f.name
        clean = check_value(f, getattr(obj, f.name), key)
        if clean is not getattr(obj, f.name):
            object.__setattr__(obj, f.name, clean)


def coerce(value: Any, typ: str, key: str, f: Field) -> Any:
    """``value`` as the field's type (``typ``: its annotation), or :class:`ConfigError` naming ``key``."""
    optional = typ.endswith("|None") or typ.startswith("None|") or typ.startswith("Optional[")
    base = typ.replace("|None", "").replace("None|", "").replace("Optional[", "").rstrip("]")
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} must be set; allowed: {allowed_text(f)}")
    if base == "tuple[str,...]":
        if isinstance(value, str):
            return tuple(part for part in value.replace(",", " ").split() if part)
        if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            return tuple(item.strip() for item in value if item.strip())
        raise ConfigError(f"{key} = {value!r} is not a list of text; write it like [a, b]")
    if base == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(f"{key} = {value!r} is not a boolean; use true or false")
    if base == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r} is not an integer")
        if isinstance(value, int):
            return value
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} = {value!r} is not an integer; allowed: {allowed_text(f)}") from None
        if not as_float.is_integer():
            raise ConfigError(f"{key} = {value!r} is not an integer; allowed: {allowed_text(f)}")
        return int(as_float)
    if base == "float":
        if isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r} is not a number")
        if isinstance(value, float):
            return value
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} = {value!r} is not a number; allowed: {allowed_text(f)}") from None
    if base == "str":
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} = {value!r} is not text")
    return value
