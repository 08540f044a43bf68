"""A Markdown table, as every benchmark report prints one."""

from __future__ import annotations

from collections.abc import Sequence


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``columns`` as the header (the first left-aligned, the rest right-aligned: numbers), one line per row."""
    lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)
