"""Small files in the user's cache, written so that no reader ever sees half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file of this process, renamed over it: a reader sees the
    old file or the new one, two processes never write the same temporary file, and a write cut short (a
    full disk, Ctrl-C) leaves no temporary file behind."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)
