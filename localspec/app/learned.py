"""What adaptive drafting learnt, kept between processes: a small file in the user's cache.

Adaptive drafting learns each model's cost per batch size and the pair's
acceptance as it goes; a new process (a one-shot ``localspec generate``, a
restarted UI) used to start from a timing of a few batches and the prior,
and its first reply paid for learning again. The state is kept per pair,
settings, build and machine, one entry each in ``learned.json``: a new build
or new hardware has a new key, so what another one learnt is never used,
and a file that is missing, corrupt or of another version is ignored (and
replaced by the next save). It is a cache, not a record: no error reading or
writing it ever reaches a reply.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from localspec.app.files import write_atomically
from localspec.app.invariance import build_id, cache_dir
from localspec.drafting.adaptive import Learned
from localspec.drafting.calibrate import Costs

VERSION = 1  # of the entries' layout: a file of another version is ignored
MAX_ENTRIES = 64  # pairs x settings x builds kept; the least recently saved go first


def store_path() -> Path:
    return cache_dir() / "learned.json"


def identity(target_path: Path, draft_path: Path | None, settings: dict[str, Any]) -> str:
    """The key of a pair on this build and machine with these load settings (each file by path, size
    and modification time: a re-downloaded or re-quantised file is another model)."""
    from localspec.llama.runtime import devices

    def file(path: Path | None) -> list | None:
        if path is None:
            return None
        stat = path.stat()
        return [str(path.resolve()), stat.st_size, int(stat.st_mtime)]

    machine = [[device.name, device.description] for device in devices()] + [os.cpu_count()]
    raw = json.dumps([file(target_path), file(draft_path), settings, build_id(), machine], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def load(key: str) -> dict[tuple, Learned]:
    """The learnt state saved under ``key`` (empty where there is none or the file cannot be read)."""
    try:
        data = json.loads(store_path().read_text(encoding="utf-8"))
        if data.get("version") != VERSION or key not in data.get("entries", {}):
            return {}
        return {tuple(item["settings"]): _learned(item) for item in data["entries"][key]["controllers"]}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def save(key: str, learned: dict[tuple, Learned], about: str) -> None:
    """Keep ``learned`` under ``key`` (``about``: the pair and build, for a person reading the file).
    Written to a temporary file and renamed (:func:`~localspec.app.files.write_atomically`), so a reader never
    sees half of it."""
    if not learned:
        return
    path = store_path()
    try:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            entries = data["entries"] if data.get("version") == VERSION else {}
            entries = entries if isinstance(entries, dict) else {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            entries = {}
        entries.pop(key, None)  # re-inserted last: the most recently saved
        entries[key] = {"about": about, "controllers": [_plain(settings, item) for settings, item in learned.items()]}
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"version": VERSION, "entries": entries}, indent=1))
    except (OSError, ValueError, TypeError):
        pass


def _plain(settings: tuple, learned: Learned) -> dict[str, Any]:
    costs = learned.costs
    return {
        "settings": list(settings),
        "verify_s": {str(rows): seconds for rows, seconds in costs.verify_s.items()},
        "draft_token_s": costs.draft_token_s,
        "catch_up_token_s": costs.catch_up_token_s,
        "other_row_s": costs.other_row_s,
        "switch_s": costs.switch_s,
        "accepted": learned.accepted,
        "examined": learned.examined,
        "lookup": {str(bin_): list(counts) for bin_, counts in learned.lookup.items()},
    }


def _learned(item: dict[str, Any]) -> Learned:
    """An entry read back; a value of the wrong kind raises (and the whole file is then ignored)."""

    def seconds(value) -> float | None:
        if value is None:
            return None
        value = float(value)
        if not 0 <= value < 3600:  # NaN and infinity too
            raise ValueError(f"a cost of {value} s")
        return value

    costs = Costs({int(rows): seconds(t) for rows, t in item["verify_s"].items()}, seconds(item["draft_token_s"]),
                  seconds(item["catch_up_token_s"]), seconds(item["other_row_s"]),
                  seconds(item.get("switch_s")))  # fmt: skip
    lookup = {int(bin_): (float(agreed), float(compared)) for bin_, (agreed, compared) in item["lookup"].items()}
    return Learned(costs, float(item["accepted"]), float(item["examined"]), lookup)
