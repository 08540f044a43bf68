"""One reply as a replayable record: a header, then its events in the order they happened.

A :class:`Trace` is what every front end keeps of a reply: the terminal and
the UI fill one as the reply streams, ``localspec generate --trace`` saves
one, and the debugging view draws one — live, or loaded from a JSONL file
that anyone can attach to a bug report and open without the models.

The file: line 1 is the header (format version, models, every setting, the
prompt); then one line per token and per step event, and the result last. A
saved conversation puts a ``turn`` line before each reply's events.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localspec.core.errors import ConfigError
from localspec.core.events import Event, GenerationResult, GenerationStats

TRACE_VERSION = 1


def event_dict(event: Event) -> dict[str, Any]:
    """An event as its trace line (the result gets its ``kind`` here: the dataclass has no field for it)."""
    data = event.to_dict()
    return {"kind": "result", **data} if isinstance(event, GenerationResult) else data


@dataclass
class Trace:
    """Header plus events as dicts, in order; ``error``/``notice`` are what the user was told about it."""

    header: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    notice: str = ""  # e.g. the target was reloaded so greedy output equals target-only
    source: str = "live"  # live / loaded / replay
    id: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)  # names it to the UI (not saved)

    # --- recording --------------------------------------------------------
    def add(self, event: Event | dict[str, Any]) -> None:
        self.events.append(event if isinstance(event, dict) else event_dict(event))

    # --- reading ----------------------------------------------------------
    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def tokens(self) -> list[dict[str, Any]]:
        return self.of_kind("token")

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.of_kind("step")

    @property
    def result(self) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e.get("kind") == "result"), None)

    @property
    def text(self) -> str:
        result = self.result
        return result["text"] if result is not None else "".join(t.get("text", "") for t in self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [t["token_id"] for t in self.tokens]

    def stats(self) -> GenerationStats:
        """The reply's counters: the result's own when it finished, else rebuilt from the steps so far."""
        result = self.result
        if result is not None:
            return GenerationStats.from_dict(result["stats"])
        options = self.header.get("options", {})
        return GenerationStats.from_steps(
            self.steps, mode=options.get("mode", ""), drafter=self.header.get("draft", ""),
            seed=options.get("seed", 0), k=options.get("draft_tokens", 0),
        )  # fmt: skip

    # --- files --------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the JSONL file (the folder must exist: a typo in a path should not create folders)."""
        path = Path(path)
        if not path.parent.is_dir():
            raise ConfigError(
                f"cannot save to {path}: the folder {path.parent} does not exist; create it or choose another"
            )
        header = {"kind": "header", "version": TRACE_VERSION, "created": time.time()}
        header |= {k: v for k, v in self.header.items() if k not in header}
        try:
            with path.open("w", encoding="utf-8") as file:
                for line in (header, *self.events):
                    file.write(json.dumps(line, ensure_ascii=False, default=_plain) + "\n")
        except OSError as error:
            raise ConfigError(f"cannot write {path} ({error.strerror}); choose another path") from None
        return path

    @classmethod
    def load(cls, source: str | Path | Iterable[str]) -> Trace:
        """Parse a JSONL trace, keeping the order of its lines; a malformed line gets a message naming its number."""
        if isinstance(source, (str, Path)):
            try:
                lines = Path(source).read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as error:
                raise ConfigError(f"cannot read trace {source} ({getattr(error, 'strerror', None) or error})") from None
        else:
            lines = list(source)
        trace: Trace | None = None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise ConfigError(f"trace line {number} is not JSON; is this a localspec trace?") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"trace line {number} is not a JSON object; is this a localspec trace?")
            if trace is None:
                if obj.get("kind") != "header":
                    raise ConfigError("trace does not start with a header line; is this a localspec trace?")
                if obj.get("version") != TRACE_VERSION:
                    raise ConfigError(
                        f"trace format version {obj.get('version')} is not supported (expected {TRACE_VERSION})"
                    )
                trace = cls(header=obj, source="loaded")
            elif obj.get("kind") in ("token", "step", "result", "turn"):
                trace.events.append(obj)
        if trace is None:
            raise ConfigError("trace is empty")
        return trace


def _plain(value: Any) -> Any:
    if hasattr(value, "value"):
        return value.value
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def trace_header(config, engine, prepared, options) -> dict[str, Any]:
    """The header of a reply's trace: models, every setting, the options and the prompt (text and tokens)."""
    return {
        "target": engine.target.name,
        "draft": engine.drafter.name if engine.drafter is not None else "none",
        "config": config.to_dict(),
        "options": {k: v for k, v in asdict(options).items() if k != "stop"} | {"stop": list(options.stop)},
        "prompt_text": prepared.text,
        "prompt_tokens": prepared.tokens,
    }
