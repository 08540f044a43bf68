"""JSONL traces: the same events the UI shows, written line by line, replayable offline.

Line 1 is a header (format version, models, settings, prompt); then one line
per step and per token event in the order they happened; the last line is
the result. A user can attach a trace to a bug report and anyone can load it
into the debugging view without the models.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TextIO

from .errors import ConfigError
from .events import GenerationResult, StepEvent, TokenEvent

TRACE_VERSION = 1


class TraceWriter:
    """Writes events as they come; usable as a context manager."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("w", encoding="utf-8")
        self._write({"kind": "header", "version": TRACE_VERSION, "created": time.time(), **header})

    def _write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, ensure_ascii=False, default=_default) + "\n")

    def write(self, event: TokenEvent | StepEvent | GenerationResult) -> None:
        self._write(event.to_dict() if not isinstance(event, GenerationResult) else {"kind": "result", **event.to_dict()})

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _default(value: Any) -> Any:
    if hasattr(value, "value"):
        return value.value
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


@dataclass
class Trace:
    """A trace read back: plain dicts, exactly as written."""

    header: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None


def read_trace(source: str | Path | Iterable[str]) -> Trace:
    """Parse a JSONL trace; a malformed line gets a message naming its number."""
    lines = Path(source).read_text(encoding="utf-8").splitlines() if isinstance(source, (str, Path)) else list(source)
    trace: Trace | None = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ConfigError(f"trace line {number} is not JSON; is this a localspec trace?") from None
        kind = obj.get("kind")
        if trace is None:
            if kind != "header":
                raise ConfigError("trace does not start with a header line; is this a localspec trace?")
            if obj.get("version") != TRACE_VERSION:
                raise ConfigError(f"trace format version {obj.get('version')} is not supported (expected {TRACE_VERSION})")
            trace = Trace(header=obj)
        elif kind == "step":
            trace.steps.append(obj)
        elif kind == "token":
            trace.tokens.append(obj)
        elif kind == "result":
            trace.result = obj
    if trace is None:
        raise ConfigError("trace is empty")
    return trace
