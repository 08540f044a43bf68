"""What the chat UI does, as plain methods: values in, values out, no Gradio.

:class:`ChatApp` holds every handler of the chat and debugging tabs, so the tests drive them against the real
engine without a browser; ``ui.app`` only lays out the page and wires these handlers to its components.
"""

from __future__ import annotations

import asyncio
import html
import json
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from localspec.app.catalog import user_models_dir
from localspec.app.config import PROJECT_ROOT, Config
from localspec.app.conversation import Conversation, Turn
from localspec.app.trace import Trace
from localspec.app.usertext import clean
from localspec.core.errors import LocalspecError

from . import debug_view as dv
from .render import LiveReply, notice_html, render_conversation, rows_by_position, stats_html, token_tooltip
from .session import ReplayReport, Session, Settings, timestamped_trace_path

# While a reply streams, the page reads one response (ChatApp.updates) that brings its new tokens every
# STREAM_INTERVAL_S and its stats every STATS_INTERVAL_S, both applied in one frame. Every update costs the
# browser CPU, and on a machine whose cores run llama.cpp that time is taken from the model (docs/performance.md,
# "The chat UI at the engine's speed").
STREAM_INTERVAL_S = 0.25
STATS_INTERVAL_S = 0.5


@dataclass
class ChatState:
    """Per-tab state (a ``gr.State``): the conversation and what the debugging tab shows."""

    conversation: Conversation = field(default_factory=Conversation)
    view: Trace | None = None  # the reply in the debugging tab: the latest one or a loaded trace
    selected: int | None = None  # token index selected in the debugging tab

    @property
    def turns(self) -> list[Turn]:
        return self.conversation.turns


class Update(NamedTuple):
    """One update of the chat tab; ``None`` leaves that output as it is."""

    chat: str | None  # the whole conversation: when a reply starts and ends, never while it streams
    stats: str | None
    notice: str | None
    state: ChatState
    textbox: str | None
    stream: str | None  # when a reply starts: its id, so the page reads its updates (:meth:`ChatApp.updates`)


@dataclass
class _Streaming:
    """A reply that streams now: what the page was sent of it, and the Stop that ends it."""

    reply: LiveReply
    cancel: threading.Event


class ChatApp:
    """All handlers. ``key`` identifies a browser tab (Gradio's session hash) for Stop and hover evidence."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._cancels: dict[str, threading.Event] = {}
        self._replies: weakref.WeakValueDictionary[str, Trace] = (
            weakref.WeakValueDictionary()
        )  # while a chat holds them
        self._live: dict[str, _Streaming] = {}  # the replies streaming now, by id
        self._busy = threading.Event()

    # --- chat ------------------------------------------------------------
    def queue_message(self, message: str, state: ChatState, key: str = "default") -> tuple[str, str, str]:
        """Show the user's message at once (and say so when another tab is generating).

        Runs outside the queue when the user sends, so it is where a new request
        begins: an older Stop is forgotten here, and a Stop pressed from now on —
        even while the request still waits in the queue — cancels this one.
        """
        self.new_request(key)
        message = clean(message or "").strip()
        if not message:
            return "", render_conversation(state.turns), ""
        return "", render_conversation(state.turns, pending=message, busy=self._busy.is_set()), message

    def respond(self, message: str, state: ChatState, settings: Settings, key: str = "default",
                every: float | None = STATS_INTERVAL_S) -> Iterator[Update]:  # fmt: skip
        """Stream a reply: the conversation once with the new turn, then the stats every ``every`` seconds,
        then the conversation once more, finished. The page passes ``every=None`` and reads the tokens and
        stats in between from :meth:`updates`, so its cost per token does not grow with the reply; the reply
        runs on a thread of its own and never waits for the page."""
        message = (message or "").strip()
        if not message:
            yield Update(render_conversation(state.turns), self._stats(state), "", state, "", None)
            return
        cancel = self._cancel_event(key)
        if cancel.is_set():  # Stop was pressed while this request waited in the queue
            notice = notice_html("stopped before the reply began — your message is back in the box", "info")
            yield Update(render_conversation(state.turns), self._stats(state), notice, state, message, None)
            return
        self._busy.set()
        try:
            try:
                config = settings.apply(self.session.config)
                events = state.conversation.reply(self.session.engine, config, message, cancel, config.trace.top_n)
                next(events, None)  # settings, prompt and model errors surface here, before the turn is added
            except LocalspecError as error:
                yield Update(
                    render_conversation(state.turns), self._stats(state), notice_html(str(error)), state, message, None
                )
                return
            trace = state.turns[-1].trace
            state.view, state.selected = trace, None
            self._replies[trace.id] = trace
            self._live[trace.id] = _Streaming(LiveReply(), cancel)
            info = notice_html(trace.notice, "info") if trace.notice else ""
            started = json.dumps({"reply": trace.id})  # the page starts reading its updates
            done = threading.Event()
            threading.Thread(target=_run_reply, args=(events, trace, done), name="localspec-reply", daemon=True).start()
            try:
                yield Update(render_conversation(state.turns), self._stats(state), info, state, "", started)
                while not done.wait(every):  # every=None: one wait, to the reply's end
                    yield Update(None, self._stats(state), None, state, None, None)
            finally:
                if not done.is_set():  # the page went away mid-reply: end it within a step, as Stop does
                    cancel.set()
                    done.wait()
                self._live.pop(trace.id, None)
            notice = notice_html(trace.error) if trace.error else info
            yield Update(render_conversation(state.turns), self._stats(state), notice, state, "", None)
        finally:
            self._busy.clear()

    async def updates(self, reply_id: str) -> AsyncIterator[str]:
        """What the page reads while a reply streams: one JSON line every ``STREAM_INTERVAL_S`` with the
        operations since the last line (``ops``, numbered from 1), the stats panel every ``STATS_INTERVAL_S``
        (``stats``), and whether the reply is over (``done``). One response, not a request per update: a
        request costs the browser several times what a line of a response does (docs/performance.md). The
        page reads it to the reply's end, so a response that ends before is a page gone away, and the reply
        ends within a step, as Stop ends it."""
        streaming, run = self._live.get(reply_id), self._replies.get(reply_id)
        if streaming is None or run is None:
            yield json.dumps({"ops": [], "done": True}) + "\n"  # over (the final render shows it) or unknown
            return
        sent, stats_due, over = 0, 0.0, False
        try:
            while not over:
                over = run.result is not None or bool(run.error)  # its last tokens came before its result
                streaming.reply.update(run.tokens)
                update: dict[str, Any] = {"ops": streaming.reply.ops_after(sent), "done": over}
                sent += len(update["ops"])
                if over or time.perf_counter() >= stats_due:
                    update["stats"] = stats_html(self.session.speed(run))
                    stats_due = time.perf_counter() + STATS_INTERVAL_S
                if update["ops"] or "stats" in update:
                    yield json.dumps(update) + "\n"
                if not over:
                    await asyncio.sleep(STREAM_INTERVAL_S)
        finally:
            if not over:
                streaming.cancel.set()

    def evidence(self, where: str) -> str:
        """The evidence behind one token of a reply in a chat (``"reply id:token index"``), as its hover shows it;
        "" if there is no such token. Read when the token is hovered, so no update carries it."""
        reply_id, _, index = where.partition(":")
        run = self._replies.get(reply_id)
        try:
            return token_tooltip(run.tokens[int(index)], rows_by_position(run.steps))
        except (AttributeError, IndexError, ValueError):
            return ""

    def stop(self, key: str = "default") -> None:
        """Ask this tab's generation to stop (the loop ends within one step), or its queued one not to start."""
        self._cancel_event(key).set()

    def new_request(self, key: str = "default") -> None:
        """This tab sent a new request: an older Stop is forgotten; one pressed from now on cancels it."""
        self._cancel_event(key).clear()

    def _cancel_event(self, key: str) -> threading.Event:
        return self._cancels.setdefault(key, threading.Event())

    def pop_for_regenerate(self, state: ChatState, key: str = "default") -> tuple[str, ChatState, str]:
        """Drop the last reply and return its user message to be sent again (a new request, like a send)."""
        self.new_request(key)
        last = state.conversation.pop()
        if last is None:
            return "", state, render_conversation(state.turns)
        return last.user, state, render_conversation(state.turns, pending=last.user, busy=self._busy.is_set())

    def clear(self) -> tuple[ChatState, str, str, str]:
        return ChatState(), render_conversation([]), self._stats(ChatState()), ""

    def _stats(self, state: ChatState) -> str:
        trace = state.turns[-1].trace if state.turns else None
        return stats_html(self.session.speed(trace) if trace is not None else None)

    # --- model pair --------------------------------------------------------
    def load_pair(self, target: str, draft: str) -> tuple[str, str]:
        """(notice html, header badge). On any error the previous pair stays usable: loaded, or loaded again with
        the next message where it was released to make room."""
        loaded, before = self.session.loaded, self.session.pair_name
        try:
            name = self.session.load_pair(target, draft)
        except LocalspecError as error:
            if self.session.loaded:
                keep = f" — still using {before}"
            elif loaded:
                keep = f" — even with {before} released to make room; the next message loads it again"
            else:
                keep = ""
            return notice_html(f"{error}{keep}"), self.badge()
        warning = self.session.engine.pair_warning()
        if warning:
            return notice_html(f"loaded {name} — {warning}"), self.badge()
        return notice_html(f"loaded {name}", "ok"), self.badge()

    def badge(self) -> str:
        where = self.session.engine.compute_line if self.session.loaded else ""
        line = f'<div class="ls-where" id="ls-where">{html.escape(where)}</div>' if where else ""
        return f'<span class="ls-badge" id="ls-pair-badge">{html.escape(self.session.pair_name)}</span>{line}'

    # --- debugging view ------------------------------------------------------
    def debug_outputs(self, state: ChatState) -> tuple[Any, ...]:
        """summary, step table rows, three plots, token choices, selected token, top-10 html."""
        run = state.view
        choices = dv.token_choices(run)
        selected = (
            state.selected
            if state.selected is not None and run is not None and state.selected < len(run.tokens)
            else None
        )
        if selected is None and run is not None:
            selected = _first_interesting(run)
        return (
            dv.summary_html(run),
            dv.step_rows(run) if run is not None else [],
            dv.acceptance_by_position_plot(run),
            dv.running_acceptance_plot(run),
            dv.timeline_plot(run),
            choices,
            selected,
            dv.top_table_html(run, selected),
        )

    def select_token(self, state: ChatState, index: Any) -> tuple[ChatState, str]:
        state.selected = int(index) if index not in (None, "") else None
        return state, dv.top_table_html(state.view, state.selected)

    def pick_from_chat(self, value: str, state: ChatState) -> ChatState:
        """A click on a token in the chat ("turn:index:nonce"): show that reply and token."""
        try:
            turn, index = (int(part) for part in (value or "").split(":")[:2])
            run = state.turns[turn].trace
        except (ValueError, IndexError):
            return state
        if run is not None:
            state.view, state.selected = run, index
        return state

    def save_trace(self, state: ChatState) -> tuple[str | None, str]:
        """Write the viewed run as JSONL (same format as ``generate --trace``); (file path, notice)."""
        if state.view is None:
            return None, notice_html("nothing to save yet: chat first or load a trace")
        folder = trace_folder(self.session.config)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = state.view.save(timestamped_trace_path(folder))
        except (OSError, LocalspecError) as error:
            path = state.view.save(Path(tempfile.mkdtemp(prefix="localspec-")) / "trace.jsonl")
            return str(path), notice_html(f"could not write to {folder} ({error}); saved to {path}", "info")
        return str(path), notice_html(f"saved {path}", "ok")

    def load_trace(self, path: str | None, state: ChatState) -> tuple[ChatState, str]:
        if not path:
            return state, ""
        try:
            state.view, state.selected = Trace.load(path), None
        except LocalspecError as error:
            return state, notice_html(f"{Path(path).name}: {error}")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return state, notice_html(f"{Path(path).name} cannot be read ({error}); choose a .jsonl trace")
        return state, notice_html(f"loaded trace {Path(path).name}", "ok")

    def replay(self, state: ChatState) -> tuple[str, ReplayReport | None]:
        """'Replay without draft' for the viewed run: (html verdict, report)."""
        if state.view is None:
            return dv.replay_html(None, "nothing to replay: generate a reply in invariant mode first"), None
        try:
            report = self.session.replay_without_draft(state.view)
        except LocalspecError as error:
            return dv.replay_html(None, str(error)), None
        return dv.replay_html(report), report


def _run_reply(events: Iterator[Any], trace: Trace, done: threading.Event) -> None:
    """Run a reply to its end on a thread of its own (its trace records every event as it comes), so the
    decode loop never waits while the page is updated; ``done`` is set when it has ended."""
    try:
        for _event in events:
            pass
    except Exception as error:  # a bug ends the reply with a message on the page instead of a hang
        trace.error = trace.error or f"internal error: {type(error).__name__}: {error}"
    finally:
        done.set()


def _first_interesting(run: Trace) -> int | None:
    """Default token for the top-10 view: the first correction, else the first token."""
    for i, token in enumerate(run.tokens):
        if token.get("status") == "corrected":
            return i
    return 0 if run.tokens else None


def model_choices(config: Config) -> tuple[list[str], list[str]]:
    """GGUF files in the models folder and models/ (plus the configured ones) for the pair pickers."""
    folders = dict.fromkeys([user_models_dir(), PROJECT_ROOT / "models"])
    found = sorted(str(p) for folder in folders for p in folder.glob("*.gguf"))
    configured = [str(config.resolve_path(v)) if v.lower() not in ("ngram", "none") else v
                  for v in (config.model.target, config.model.draft)]  # fmt: skip
    targets = list(dict.fromkeys([configured[0], *found]))
    drafts = list(dict.fromkeys([configured[1], *found, "ngram", "none"]))
    return targets, drafts


def trace_folder(config: Config) -> Path:
    """Where the UI saves traces (``trace.dir``, resolved like every configured path)."""
    return config.resolve_path(config.trace.dir)


def allowed_paths(config: Config) -> list[str]:
    """Folders Gradio may serve files from besides the working directory: saved traces, wherever
    the UI was started from, and the fallback temporary folder."""
    return [str(trace_folder(config)), tempfile.gettempdir()]
