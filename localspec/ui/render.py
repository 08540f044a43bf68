"""HTML for replies whose every token shows its fate (docs/design.md, Visual language), and the stats panel.

Everything here is a pure function of plain dicts — the ``to_dict()`` form of
:mod:`localspec.events`, which is also what a JSONL trace holds — so a live
reply and a trace loaded from disk render identically. Token text is always
HTML-escaped; colour is never the only cue (class + underline style + the
evidence on hover + a legend). While a reply streams, the page asks for
what changed (:class:`LiveReply`) and appends it to the bubble.

Markdown: a reply is split into prose and fenced code blocks. Prose keeps its
line breaks (``white-space: pre-wrap``); a code block becomes a ``<pre>`` of
coloured spans with the fence lines shown as a small language label, so code
stays monospaced and readable instead of a coloured fence breaking the
markdown renderer.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.core.perf import LOADED_FROM

STATUSES = ("accepted", "corrected", "bonus", "target")
LABELS = {
    "accepted": "accepted draft token",
    "corrected": "corrected by the target",
    "bonus": "bonus target token",
    "target": "target only (no draft)",
}

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)(?:^```[ \t]*$\n?|\Z)", re.MULTILINE | re.DOTALL)
_PARAGRAPH_END = re.compile(r"\n(?:[ \t]*\n)+")  # a blank line: prose is cut after it


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if value != 0 and abs(value) < 10 ** (-digits):
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def quote_piece(text: str | None) -> str:
    """A token's text as shown inside a tooltip or table: quoted, with whitespace made visible."""
    if text is None:
        return "–"
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    return f"'{shown}'"


def _known(token: dict[str, Any], row: dict[str, Any], key: str) -> float | None:
    """A token's ``p`` or acceptance probability: the rule's, or where bounds of the row's total decided
    without it, its row's record's."""
    value = token.get(key)
    return value if value is not None else row.get(key)


def token_tooltip(token: dict[str, Any], rows_by_position: dict[int, dict[str, Any]] | None = None) -> str:
    """The evidence behind one token's fate, as plain text (escaped later by the caller)."""
    status = token.get("status", "target")
    row = (rows_by_position or {}).get(token.get("position")) or {}
    p, q = _known(token, row, "p"), token.get("q")
    accept, uniform = _known(token, row, "accept_prob"), token.get("uniform")
    where = f"token #{token.get('index', 0) + 1}, step {token.get('step', 0) + 1}"
    if status == "accepted":
        parts = [f"accepted draft token ({where})", f"p(token) = {_fmt(p)} · q(token) = {_fmt(q)}"]
        if accept is not None:
            parts.append(f"acceptance probability min(1, p/q) = {_fmt(accept)}")
        if uniform is not None:
            parts.append(f"uniform u = {_fmt(uniform)} < {_fmt(accept)} → kept")
        elif accept is not None:
            parts.append("decided without a uniform: the target picked the same token")
        return "\n".join(parts)
    if status == "corrected":
        rejected = row.get("draft_text") if row else None
        rejected = quote_piece(rejected) if rejected is not None else f"token id {token.get('rejected_token')}"
        parts = [f"corrected ({where}): drawn from the residual max(0, p − q) after rejecting {rejected}"]
        if p is not None or q is not None:
            parts.append(f"rejected draft token: p = {_fmt(p)} · q = {_fmt(q)}")
        if accept is not None:
            parts.append(f"acceptance probability min(1, p/q) = {_fmt(accept)}")
        if uniform is not None:
            parts.append(f"uniform u = {_fmt(uniform)} ≥ {_fmt(accept)} → rejected")
        elif accept is not None:
            parts.append("decided without a uniform: the target picked a different token")
        return "\n".join(parts)
    if status == "bonus":
        parts = [f"bonus: free target token ({where}) — every draft token of this step was accepted"]
        if row and row.get("top_p"):
            top = {entry["token"]: entry["prob"] for entry in row["top_p"]}
            if token.get("token_id") in top:
                parts.append(f"p(token) = {_fmt(top[token['token_id']])}")
        return "\n".join(parts)
    return f"target only ({where}): sampled by the target with no draft"


@dataclass
class _Region:
    kind: str  # prose / code / open (fence line) / close (fence line)
    start: int
    end: int
    lang: str = ""


def _regions(text: str) -> list[_Region]:
    """Split reply text into prose paragraphs, fenced code, and the fence lines themselves.

    Prose is cut after each blank line: each paragraph is a block of its own in the page, so a streamed
    token lays out its paragraph again, not the whole reply (in one block, a long reply's every update
    cost the browser more, and on shared cores the model with it)."""
    regions: list[_Region] = []
    cursor = 0
    for match in _FENCE.finditer(text):
        if match.start() > cursor:
            regions += _paragraphs(text, cursor, match.start())
        regions.append(_Region("open", match.start(), match.start(2), match.group(1).strip()))
        regions.append(_Region("code", match.start(2), match.end(2), match.group(1).strip()))
        if match.end() > match.end(2):
            regions.append(_Region("close", match.end(2), match.end()))
        cursor = match.end()
    if cursor < len(text):
        regions += _paragraphs(text, cursor, len(text))
    return regions


def _paragraphs(text: str, start: int, end: int) -> list[_Region]:
    cuts = [match.end() for match in _PARAGRAPH_END.finditer(text, start, end) if match.end() < end]
    bounds = [start, *cuts, end]
    return [_Region("prose", lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def rows_by_position(steps: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Verified rows of every step, keyed by absolute position (the later step wins)."""
    out: dict[int, dict[str, Any]] = {}
    for step in steps:
        for row in step.get("rows", []):
            if row.get("outcome") != "not-reached":
                out[row["position"]] = row
    return out


@dataclass(frozen=True)
class Block:
    """One element of a reply's bubble: prose, a fenced code block, or a code block's language label.
    ``pieces`` are (token index, start, end) of the token text it shows (a token may span two blocks)."""

    kind: str  # prose / code / label
    lang: str
    pieces: tuple[tuple[int, int, int], ...]


def layout(tokens: Sequence[dict[str, Any]]) -> list[Block]:
    """The blocks a reply's tokens fall into: fenced code blocks become code (their fence lines hidden, the
    opening one a language label), the rest prose."""
    pieces = [t.get("text", "") for t in tokens]
    starts, offset = [], 0
    for piece in pieces:
        starts.append(offset)
        offset += len(piece)
    blocks: list[Block] = []
    index = 0  # first token that may overlap the current region
    for region in _regions("".join(pieces)):
        if region.kind in ("open", "close"):
            while index < len(tokens) and starts[index] + len(pieces[index]) <= region.end:
                index += 1
            if region.kind == "open":
                blocks.append(Block("label", region.lang or "code", ()))
            continue
        found = []
        i = index
        while i < len(tokens) and starts[i] < region.end:
            lo, hi = max(starts[i], region.start), min(starts[i] + len(pieces[i]), region.end)
            if hi > lo:
                found.append((i, lo - starts[i], hi - starts[i]))
            if starts[i] + len(pieces[i]) <= region.end:
                i += 1
            else:
                break
        index = i
        blocks.append(Block(region.kind, region.lang, tuple(found)))
    return blocks


def render_spans(
    tokens: Sequence[dict[str, Any]], pieces: Sequence[tuple[int, int, int]], highlight: int | None = None
) -> str:
    """The spans of ``pieces``: each token coloured by its fate (class, underline, ``data-status``), its index in
    ``data-i``; its evidence is read when it is hovered (:func:`token_tooltip`), not carried in every span."""
    out = []
    for i, lo, hi in pieces:
        status = tokens[i].get("status", "target")
        status = status if status in STATUSES else "target"
        extra = " ls-hl" if highlight is not None and i == highlight else ""
        text = html.escape(tokens[i].get("text", "")[lo:hi])
        out.append(f'<span class="ls-tok ls-{status}{extra}" data-status="{status}" data-i="{i}">{text}</span>')
    return "".join(out)


def render_block(block: Block, number: int, tokens: Sequence[dict[str, Any]], highlight: int | None = None) -> str:
    """One block as the element the browser keeps (``data-b``: its place in the bubble)."""
    if block.kind == "label":
        return f'<div class="ls-code-label" data-b="{number}">{html.escape(block.lang)}</div>'
    spans = render_spans(tokens, block.pieces, highlight)
    if block.kind == "code":
        return f'<pre class="ls-code" data-b="{number}"><code>{spans}</code></pre>'
    return f'<span class="ls-prose" data-b="{number}">{spans}</span>'


def render_tokens(tokens: Sequence[dict[str, Any]], highlight: int | None = None, cursor: bool = False) -> str:
    """A reply as coloured, escaped spans; code fences become ``<pre>`` blocks."""
    body = "".join(render_block(block, n, tokens, highlight) for n, block in enumerate(layout(tokens)))
    return body + ('<span class="ls-cursor">▍</span>' if cursor else "")


class LiveReply:
    """What the page shows of a reply that is streaming, as numbered operations on its bubble.

    Each operation keeps the bubble's first ``block`` blocks — and, when
    ``keep`` is a token index, block ``block`` itself up to that token, then
    appends ``spans`` to it — drops the rest and appends ``blocks``. A reply
    that only grows costs one append of its new tokens; a fence that turns
    prose into code rewrites only the blocks from there on. The page asks
    for the operations after the last one it applied, so none is lost.
    """

    def __init__(self) -> None:
        self._shown: list[Block] = []
        self._ops: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def update(self, tokens: Sequence[dict[str, Any]]) -> None:
        """Add the operation that brings the page from what it was sent to ``tokens`` (none if nothing changed)."""
        with self._lock:
            blocks = layout(tokens)
            same = 0
            while same < min(len(blocks), len(self._shown)) and blocks[same] == self._shown[same]:
                same += 1
            if same == len(blocks) == len(self._shown):
                return
            op: dict[str, Any] = {"seq": len(self._ops) + 1, "block": same, "keep": None, "spans": ""}
            if same < min(len(blocks), len(self._shown)):
                old, new = self._shown[same], blocks[same]
                if (old.kind, old.lang) == (new.kind, new.lang) and old.kind != "label":
                    kept = 0
                    while kept < min(len(old.pieces), len(new.pieces)) and old.pieces[kept] == new.pieces[kept]:
                        kept += 1
                    op["keep"] = new.pieces[kept][0] if kept < len(new.pieces) else len(tokens)
                    if kept < len(old.pieces):  # a token cut anew keeps the index of its first piece
                        op["keep"] = min(op["keep"], old.pieces[kept][0])
                    op["spans"] = render_spans(tokens, [p for p in new.pieces if p[0] >= op["keep"]])
                    same += 1
            op["blocks"] = "".join(render_block(block, n, tokens) for n, block in enumerate(blocks) if n >= same)
            self._shown = blocks
            self._ops.append(op)

    def ops_after(self, seq: int) -> list[dict[str, Any]]:
        """The operations numbered after ``seq``, in order."""
        with self._lock:
            return self._ops[max(seq, 0) :]


def legend() -> str:
    """The colour key, with the same classes the tokens use (and words, not just colour)."""
    items = "".join(
        f'<span class="ls-legend-item"><span class="ls-tok ls-{s}" data-status="{s}">{html.escape(s)}</span>'
        f'<span class="ls-legend-text">{html.escape(LABELS[s])}</span></span>'
        for s in STATUSES
    )
    return (
        f'<div class="ls-legend" id="ls-legend">{items}'
        '<span class="ls-legend-hint">hover a token for p, q, acceptance probability and the uniform that decided it;'
        " click it to inspect its top-10 in the Debugging tab</span></div>"
    )


def status_counts(tokens: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for token in tokens:
        status = token.get("status", "target")
        counts[status if status in counts else "target"] += 1
    return counts


def render_conversation(turns: Sequence[Any], pending: str | None = None, busy: bool = True) -> str:
    """The whole chat: user bubbles in plain escaped text, assistant bubbles as token spans.

    ``turns`` are :class:`localspec.app.conversation.Turn` objects: ``user`` (str) and
    ``trace`` (a :class:`localspec.app.trace.Trace`, or None while waiting). ``pending`` is a message
    queued behind another conversation's generation (``busy``) or about to start.
    """
    parts: list[str] = []
    for n, turn in enumerate(turns):
        parts.append(_user_bubble(turn.user))
        run = turn.trace
        last = n == len(turns) - 1
        if run is None:
            parts.append(_waiting_bubble())
            continue
        streaming = run.result is None and last and not run.error
        body = render_tokens(run.tokens, cursor=streaming)
        if not run.tokens and streaming:
            body = '<span class="ls-muted">thinking…</span><span class="ls-cursor">▍</span>'
        footer = _reply_footer(run)
        parts.append(
            f'<div class="ls-msg ls-assistant" data-turn="{n}" data-reply="{run.id}">'
            f'<div class="ls-bubble">{body}</div>'
            f"{footer}</div>"
        )
    if pending is not None:
        parts.append(_user_bubble(pending))
        parts.append(_waiting_bubble() if busy else _thinking_bubble())
    if not parts:
        parts.append(
            '<div class="ls-empty"><div class="ls-empty-title">Ask anything.</div>'
            "<div>Every token of the reply is coloured by its fate: a draft token the target "
            "<b>accepted</b>, a token the target <b>corrected</b> after rejecting the draft, or the "
            "free <b>bonus</b> token after a fully accepted draft.</div></div>"
        )
    return f'<div class="ls-chat" id="ls-chat-log">{"".join(parts)}</div>'


def _user_bubble(text: str) -> str:
    return f'<div class="ls-msg ls-user"><div class="ls-bubble">{html.escape(text)}</div></div>'


def _waiting_bubble() -> str:
    return (
        '<div class="ls-msg ls-assistant"><div class="ls-bubble ls-waiting" id="ls-waiting">'
        '<span class="ls-spinner" aria-hidden="true"></span>'
        "waiting for the other conversation to finish — the models generate one reply at a time"
        "</div></div>"
    )


def _thinking_bubble() -> str:
    return (
        '<div class="ls-msg ls-assistant"><div class="ls-bubble"><span class="ls-muted">thinking…</span>'
        '<span class="ls-cursor">▍</span></div></div>'
    )


def _reply_footer(run: Any) -> str:
    counts = status_counts(run.tokens)
    chips = " ".join(f'<span class="ls-chip ls-chip-{s}">{counts[s]} {s}</span>' for s in STATUSES if counts[s])
    extra = ""
    if run.error:
        extra = f'<span class="ls-chip ls-chip-error">error: {html.escape(run.error)}</span>'
    elif run.result is not None:
        reason = run.result.get("stop_reason", "")
        if reason == "cancelled":
            extra = '<span class="ls-chip ls-chip-stop">stopped</span>'
        elif reason in ("max_tokens", "context_full"):
            extra = f'<span class="ls-chip">stop: {html.escape(reason.replace("_", " "))}</span>'
    mode = run.header.get("options", {}).get("mode", "")
    seed = run.header.get("options", {}).get("seed")
    meta = f'<span class="ls-meta">{html.escape(str(mode))} · seed {seed}</span>' if mode else ""
    return f'<div class="ls-footer">{chips} {extra} {meta}</div>'


def notice_html(message: str, kind: str = "error") -> str:
    """A one-line banner (errors, information) shown under the chat."""
    if not message:
        return ""
    icon = {"error": "⚠", "info": "ℹ", "ok": "✓"}.get(kind, "")
    return f'<div class="ls-notice ls-notice-{kind}" role="alert">{icon} {html.escape(message)}</div>'


def stats_html(speed: Any | None) -> str:
    """The live stats panel: tok/s, acceptance, tokens per step, measured vs predicted speedup, verdict."""

    def card(label: str, value: str, hint: str = "", key: str = "") -> str:
        return (
            f'<div class="ls-card" data-stat="{key}"><div class="ls-card-v">{html.escape(value)}</div>'
            f'<div class="ls-card-k">{html.escape(label)}</div>'
            + (f'<div class="ls-card-h">{html.escape(hint)}</div>' if hint else "")
            + "</div>"
        )

    if speed is None or not speed.tokens:
        return (
            '<div class="ls-stats" id="ls-stats"><div class="ls-muted">Stats appear as the reply streams.</div></div>'
        )
    speedup = f"{speed.measured_speedup:.2f}×" if speed.measured_speedup is not None else "–"
    predicted = f"predicted {speed.predicted_speedup:.2f}×" if speed.predicted_speedup is not None else ""
    if speed.target_token_s:
        predicted += f" · target alone {speed.target_token_s * 1000:.0f} ms/token"
        if speed.load is not None and speed.load >= LOADED_FROM:
            predicted += f" now ({speed.target_token_s / speed.load * 1000:.0f} at best)"
    cards = "".join([
        card("tokens / s", f"{speed.tokens_per_second:.1f}", f"{speed.tokens} tokens", "tps"),
        card("acceptance", f"{speed.acceptance:.0%}" if speed.acceptance is not None else "–",
             "accepted / drafted", "acc"),
        card("tokens / step", f"{speed.tokens_per_step:.2f}", "emitted per target pass", "tps-step"),
        card("speedup", speedup, predicted or "vs the target alone", "speedup"),
        card("drafter", speed.sources.split(" ")[0], speed.sources, "drafter") if speed.sources else "",
    ])  # fmt: skip
    verdict = (
        f'<div class="ls-verdict{" ls-verdict-slow" if speed.slow else ""}">{html.escape(speed.verdict)}</div>'
        if speed.verdict
        else ""
    )
    return f'<div class="ls-stats" id="ls-stats"><div class="ls-cards">{cards}</div>{verdict}</div>'
