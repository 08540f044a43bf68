"""The acceptance debugging view: step table, plots, top-10 of p vs q, replay comparison.

Pure functions of a :class:`localspec.app.trace.Trace`, drawing with
matplotlib's object API on the Agg canvas — no pyplot global state, which
would not be safe with Gradio's worker threads.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from localspec.app.trace import Trace  # noqa: E402

from .render import _fmt, quote_piece, render_tokens, rows_by_position  # noqa: E402
from .session import ReplayReport  # noqa: E402

COLOURS = {"accepted": "#16a34a", "corrected": "#ea580c", "bonus": "#2563eb", "target": "#6b7280"}
DRAFT_COLOUR, VERIFY_COLOUR, OTHER_COLOUR = "#a78bfa", "#0ea5e9", "#cbd5e1"

STEP_COLUMNS = ["step", "drafter", "position", "draft token", "q(draft)", "p(draft)", "accept prob", "uniform",
                "outcome", "emitted", "draft ms", "verify ms"]  # fmt: skip


def step_rows(run: Trace) -> list[list[Any]]:
    """One table row per verified position: the draft token, q and p of it, and its fate."""
    out: list[list[Any]] = []
    tokens_by_position = {t["position"]: t for t in run.tokens}
    for step in run.steps:
        for n, row in enumerate(step.get("rows", [])):
            if row.get("outcome") == "not-reached":
                continue
            emitted = tokens_by_position.get(row["position"])
            emitted_text = quote_piece(emitted.get("text")) if emitted else ""
            if emitted and row.get("outcome") == "rejected":
                emitted_text += " (correction)"
            out.append([
                step["step"] + 1,
                (step.get("source") or "–") if n == 0 else "",
                row["position"],
                quote_piece(row.get("draft_text")) if row.get("draft_token") is not None else "(bonus row)",
                _round(row.get("q")),
                _round(row.get("p")),
                _round(row.get("accept_prob")),
                _round(row.get("uniform")),
                row.get("outcome", ""),
                emitted_text,
                round(step.get("draft_s", 0.0) * 1000, 2) if n == 0 else "",
                round(step.get("verify_s", 0.0) * 1000, 2) if n == 0 else "",
            ])  # fmt: skip
    return out


def _round(value: float | None) -> Any:
    return "" if value is None else round(float(value), 4)


def summary_html(run: Trace | None) -> str:
    """One line about the run shown: where it came from, models, mode, seed, tokens."""
    if run is None:
        return '<div class="ls-summary ls-muted">No reply yet: chat first, or load a trace (.jsonl).</div>'
    header = run.header
    options = header.get("options", {})
    stats = run.stats()
    source = {"live": "current reply", "loaded": "loaded trace", "replay": "replay"}.get(run.source, run.source)
    reason = (run.result or {}).get("stop_reason", "streaming…")
    items = [
        ("source", source),
        ("target", header.get("target", "?")),
        ("draft", header.get("draft", "?")),
        ("mode", options.get("mode", "?")),
        ("K", options.get("draft_tokens", "?")),
        ("seed", options.get("seed", "?")),
        ("tokens", stats.n_tokens),
        ("steps", stats.steps),
        ("acceptance", f"{stats.acceptance_rate:.0%}" if stats.drafted else "–"),
        ("α (accepted/examined)", f"{stats.alpha:.3f}" if stats.examined else "–"),
        ("stop", reason),
    ]
    cells = "".join(
        f'<div class="ls-kv"><span class="ls-k">{html.escape(k)}</span>'
        f'<span class="ls-v">{html.escape(str(v))}</span></div>'
        for k, v in items
    )
    return f'<div class="ls-summary">{cells}</div>'


# --- plots ---------------------------------------------------------------
def _figure(width: float = 5.2, height: float = 3.0) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.25)
    return fig, ax


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#6b7280")
    ax.set_xticks([])
    ax.set_yticks([])


def acceptance_by_position_plot(run: Trace | None) -> Figure:
    """Rate at which draft position i was accepted, against the geometric prediction α**i."""
    fig, ax = _figure()
    ax.set_title("acceptance by draft position", fontsize=11, loc="left")
    stats = run.stats() if run is not None else None
    if stats is None or not stats.drafted_by_position:
        _empty(ax, "no draft tokens in this reply")
        return fig
    positions = list(range(1, len(stats.drafted_by_position) + 1))
    rates = [a / d if d else 0.0 for a, d in zip(stats.accepted_by_position, stats.drafted_by_position)]
    alpha = stats.alpha
    ax.bar(positions, rates, color=COLOURS["accepted"], alpha=0.8, label="measured")
    ax.plot(positions, [alpha**i for i in positions], "o--", color="#111827", label=f"α^i  (α = {alpha:.2f})")
    for x, rate, n in zip(positions, rates, stats.drafted_by_position):
        ax.text(x, rate + 0.02, f"n={n}", ha="center", fontsize=7, color="#6b7280")
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(draft token i accepted)")
    ax.set_ylim(0, 1.1)
    ax.set_xticks(positions)
    ax.legend(frameon=False, fontsize=8, loc="lower left")
    return fig


def running_acceptance_plot(run: Trace | None) -> Figure:
    """Accepted / drafted so far, over the reply, with each step's own rate as faint dots."""
    fig, ax = _figure()
    ax.set_title("running acceptance over the reply", fontsize=11, loc="left")
    steps = [s for s in (run.steps if run is not None else []) if s.get("drafted")]
    if not steps:
        _empty(ax, "no draft tokens in this reply")
        return fig
    xs, running, per_step = [], [], []
    drafted = accepted = emitted = 0
    for step in run.steps if run is not None else []:
        emitted += len(step.get("emitted", []))
        if not step.get("drafted"):
            continue
        drafted += len(step["drafted"])
        accepted += step.get("n_accepted", 0)
        xs.append(emitted)
        running.append(accepted / drafted)
        per_step.append(step.get("n_accepted", 0) / len(step["drafted"]))
    ax.scatter(xs, per_step, s=10, color=COLOURS["corrected"], alpha=0.35, label="this step")
    ax.plot(xs, running, color=COLOURS["accepted"], linewidth=2, label="running")
    ax.set_xlabel("tokens emitted")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return fig


def timeline_plot(run: Trace | None) -> Figure:
    """Draft vs verify (vs everything else) milliseconds for every step, stacked: one filled outline per
    part, whatever the reply's length (a bar per step and part was thousands of artists to draw, and as
    many objects for the garbage collector, after every long reply)."""
    fig, ax = _figure()
    ax.set_title("time per step", fontsize=11, loc="left")
    steps = run.steps if run is not None else []
    if not steps:
        _empty(ax, "no steps yet")
        return fig
    edges = [s["step"] + 0.5 for s in steps] + [steps[-1]["step"] + 1.5]
    parts = np.array([[s.get(key, 0.0) * 1000 for s in steps] for key in ("draft_s", "verify_s", "other_s")])
    tops = parts.cumsum(axis=0)  # each part stacked on the ones before it
    labelled = list(zip(tops, (DRAFT_COLOUR, VERIFY_COLOUR, OTHER_COLOUR), ("draft", "verify", "other")))
    for top, colour, label in reversed(labelled):  # the highest drawn first, each lower one over it
        ax.stairs(top, edges, fill=True, color=colour, label=label)
    if len(steps) < 80:  # few steps: a gap between them, as bars would have
        ax.vlines(edges, 0, tops[-1].max(), color="white", linewidth=2.5)
    handles, labels = ax.get_legend_handles_labels()
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.legend(handles[::-1], labels[::-1], frameon=False, fontsize=8, ncols=3, loc="upper right")
    return fig


# --- one token -------------------------------------------------------------
def token_choices(run: Trace | None) -> list[tuple[str, int]]:
    """(label, index) for the token picker: '#12 'hello' (accepted)'."""
    if run is None:
        return []
    return [(f"#{i + 1} {quote_piece(t.get('text'))} ({t.get('status')})", i) for i, t in enumerate(run.tokens)]


def top_table_html(run: Trace | None, index: int | None) -> str:
    """Top-10 of p and of q side by side at the position of token ``index``, with bars."""
    if run is None or index is None or not 0 <= int(index) < len(run.tokens):
        return '<div class="ls-muted">Pick a token (or click one in the chat) to see the top-10 of p and q.</div>'
    index = int(index)
    token = run.tokens[index]
    row = rows_by_position(run.steps).get(token["position"])
    head = (
        f'<div class="ls-top-head"><span class="ls-tok ls-{html.escape(token.get("status", "target"))}">'
        f"{html.escape(token.get('text') or '')}</span> token #{index + 1} · position {token['position']} · "
        f"{html.escape(token.get('status', ''))}</div>"
    )
    if row is None or not (row.get("top_p") or row.get("top_q")):
        return head + (
            '<div class="ls-muted">No top-N recorded for this position (trace.top_n = 0, or a deterministic '
            "drafter).</div>"
        )
    chosen, drafted = token.get("token_id"), row.get("draft_token")

    def column(title: str, entries: Sequence[dict[str, Any]], colour: str) -> str:
        if not entries:
            return (
                f'<div class="ls-top-col"><div class="ls-top-title">{title}</div>'
                '<div class="ls-muted">not recorded</div></div>'
            )
        lines = []
        for entry in entries:
            marks = []
            if entry["token"] == chosen:
                marks.append("emitted")
            if drafted is not None and entry["token"] == drafted:
                marks.append("drafted")
            cls = " ls-top-chosen" if marks else ""
            lines.append(
                f'<tr class="{cls.strip()}"><td class="ls-top-tok">{html.escape(quote_piece(entry["text"]))}</td>'
                f'<td class="ls-top-bar"><span style="width:{max(1.0, entry["prob"] * 100):.1f}%;background:{colour}">'
                f'</span></td><td class="ls-top-p">{_fmt(entry["prob"])}</td>'
                f'<td class="ls-top-mark">{" ".join(marks)}</td></tr>'
            )
        return (f'<div class="ls-top-col"><div class="ls-top-title">{title}</div>'
                f'<table class="ls-top">{"".join(lines)}</table></div>')  # fmt: skip

    evidence = (
        f'<div class="ls-top-evidence">draft token {html.escape(quote_piece(row.get("draft_text")))} · '
        f"q = {_fmt(row.get('q'))} · p = {_fmt(row.get('p'))} · accept prob = {_fmt(row.get('accept_prob'))} · "
        f"uniform = {_fmt(row.get('uniform'))} · outcome: {html.escape(row.get('outcome', ''))}</div>"
        if row.get("draft_token") is not None
        else '<div class="ls-top-evidence">bonus row: the target alone chose this token</div>'
    )
    top_p, top_q = row.get("top_p", []), row.get("top_q", [])
    # a model draft draws from its head (sampling.draft_weights): fewer tokens than the list's length
    head_only = 0 < len(top_q) < len(top_p)
    q_title = f"draft q (its head: the {len(top_q)} it drew from)" if head_only else "draft q (top-10)"
    return (
        head + evidence + '<div class="ls-top-cols">'
        + column("target p (top-10)", top_p, COLOURS["bonus"])
        + column(q_title, top_q, COLOURS["accepted"])
        + "</div>"
    )  # fmt: skip


def replay_html(report: ReplayReport | None, message: str = "") -> str:
    """Verdict of 'replay without draft': identical, or both texts with the first difference marked."""
    if report is None:
        if message:
            return f'<div class="ls-notice ls-notice-error">⚠ {html.escape(message)}</div>'
        return (
            '<div class="ls-muted">In <b>invariant</b> mode the same seed gives the same text with any draft or '
            "none. Generate a reply in invariant mode, then replay it without the draft to check.</div>"
        )
    kind = "ok" if report.identical else "error"
    icon = "✓" if report.identical else "✗"
    first = report.first_difference
    body = (
        f'<div class="ls-notice ls-notice-{kind}" id="ls-replay-verdict">{icon} {html.escape(report.explanation)}</div>'
    )
    if not report.identical:
        body += (
            '<div class="ls-replay-cols"><div><div class="ls-top-title">with draft</div><div class="ls-bubble">'
            f"{render_tokens(report.original.tokens, highlight=first)}</div></div>"
            '<div><div class="ls-top-title">without draft</div><div class="ls-bubble">'
            f"{render_tokens(report.replay.tokens, highlight=first)}</div></div></div>"
        )
    return body
