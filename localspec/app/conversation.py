"""A chat, as every front end runs it: turns of plain text, the prompt each reply sees, the reply's trace.

The terminal chat, the Gradio UI (one per browser tab) and any later front
end keep a :class:`Conversation` and ask it for replies, so they all decide
the same way how a prompt is built (the model's chat template, or raw text),
which old turns are left out when the conversation outgrows the context,
what a reply records, and how its numbers are worded.

Turns hold bare text only: colours and markers are display, never prompt
(docs/design.md, Visual language). Each turn's prompt renders the whole kept history; the loop's
cache sync then evaluates only what is new since the previous turn.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.app.config import Config
from localspec.app.templates import Message
from localspec.app.trace import Trace, trace_header
from localspec.app.usertext import clean
from localspec.core.errors import LocalspecError, PromptTooLongError
from localspec.core.events import Event, GenerationStats


@dataclass
class Turn:
    """One exchange: what the user wrote and the reply's trace (None until the reply starts)."""

    user: str
    trace: Trace | None = None
    answer: str | None = None  # a reply written elsewhere (an API client sends its history), not generated here

    @property
    def reply(self) -> str:
        if self.answer is not None:
            return self.answer
        return self.trace.text if self.trace is not None else ""

    @property
    def replied(self) -> bool:
        """Whether the turn has a reply the next prompt carries (one that failed does not count)."""
        return self.answer is not None or (self.trace is not None and not self.trace.error)


@dataclass
class Conversation:
    """The turns of one chat and the system prompt; ``dropped`` oldest turns are out of the prompt."""

    system: str | None = None  # None: the config's chat.system_prompt ("" = the template's own default)
    turns: list[Turn] = field(default_factory=list)
    dropped: int = 0
    _warned: set[str] = field(default_factory=set, repr=False)

    def history(self) -> list[tuple[str, str]]:
        """Plain-text (user, assistant) pairs the next prompt carries: kept turns whose reply did not fail."""
        return self._history(self.dropped)

    def _history(self, dropped: int) -> list[tuple[str, str]]:
        return [(t.user, t.reply) for t in self.turns[dropped:] if t.replied]

    def system_prompt(self, config: Config) -> str:
        return config.chat.system_prompt if self.system is None else self.system

    def clear(self) -> None:
        self.turns.clear()
        self.dropped = 0

    def pop(self) -> Turn | None:
        """Take back the last turn (to regenerate it)."""
        if not self.turns:
            return None
        turn = self.turns.pop()
        self.dropped = min(self.dropped, len(self.turns))
        return turn

    # --- the prompt ---------------------------------------------------------
    def prompt(self, engine, config: Config, user: str) -> tuple[Any, int, str]:
        """The prompt for ``user``: (prepared prompt, turns to leave out, a note when that number grew).

        A conversation that no longer fits leaves out its oldest turns, keeping
        room for a reply (up to a quarter of the context). A message too long
        on its own raises :class:`PromptTooLongError` and changes nothing: the
        history is still there for the next, shorter message.
        """
        if not config.chat.chat_template:
            return engine.encode_prompt(config, [], user), self.dropped, ""  # raw text: no history
        n_ctx = engine.target.context_size
        reserve = max(1, min(config.sampling.max_tokens, n_ctx // 4))
        dropped = self.dropped
        while True:
            prepared = engine.encode_prompt(config, self._history(dropped), user, system=self.system_prompt(config))
            if len(prepared.tokens) + reserve <= n_ctx or dropped >= len(self.turns):
                break
            dropped += 1
        if len(prepared.tokens) >= n_ctx:
            raise PromptTooLongError(
                f"this message needs {len(prepared.tokens)} tokens but the context holds {n_ctx}; "
                "shorten it or restart with a larger context (--ctx)"
            )
        note = ""
        if dropped > self.dropped:
            note = f"(the context is full: the oldest {dropped} turn(s) are left out of the prompt)"
        return prepared, dropped, note

    # --- one reply ----------------------------------------------------------
    def reply(
        self,
        engine,
        config: Config,
        user: str,
        cancel: threading.Event | None = None,
        detail_top: int = 0,
        stop: Sequence[str] = (),
    ) -> Iterator[Event]:
        """Stream one reply to ``user``; the new turn's trace grows with every event yielded.

        Settings, prompt and model problems raise :class:`LocalspecError` before
        the turn is added. A problem mid-reply ends the stream and is kept in
        ``trace.error``; the partial reply stays in the conversation, as does
        one cut short by ``cancel`` (the partial text is the answer).
        """
        user = clean(user)  # kept in the turn, shown and saved: valid Unicode only
        prepared, dropped, note = self.prompt(engine, config, user)
        options = engine.options(config, detail_top=detail_top, stop=tuple(stop) or None)
        params = config.sampling.params()
        if options.mode != "target-only" and engine.drafter is not None:
            try:
                engine.target_token_seconds()  # measured once per pair, before the reply takes the engine lock
            except LocalspecError:
                pass  # speedups are then not shown; the reply itself may still work
        notes = [note, self._invariance_note(engine, options, params)]
        trace = Trace(header=trace_header(config, engine, prepared, options), notice="\n".join(n for n in notes if n))
        self.turns.append(Turn(user, trace))
        self.dropped = dropped
        events = engine.stream(prepared.tokens, options, params, cancel)
        try:
            for event in events:
                trace.add(event)
                yield event
        except LocalspecError as error:
            trace.error = str(error)
        finally:
            events.close()  # releases the engine lock even when the caller stops early

    def _invariance_note(self, engine, options, params) -> str:
        """Once per mode: the line saying the target was reloaded (or cannot be) so greedy output is exact."""
        line = engine.ensure_invariance(options, params) or ""
        if not line or line in self._warned:
            return ""
        self._warned.add(line)
        return line

    # --- saving -------------------------------------------------------------
    def trace(self, config: Config) -> Trace:
        """The whole conversation as one trace: a header holding it, then per turn a ``turn`` line and its events."""
        replied = [t for t in self.turns if t.trace is not None]
        last = replied[-1].trace.header
        system = self.system_prompt(config)
        messages = [Message("system", system)] if system else []
        for turn in replied:
            messages += [Message("user", turn.user), Message("assistant", turn.reply)]
        header = {k: last[k] for k in ("target", "draft", "options", "prompt_text") if k in last}
        header |= {"config": config.to_dict(), "conversation": [m.as_dict() for m in messages], "turns": len(replied)}
        if self.dropped:
            header["prompt_window_starts_at_turn"] = self.dropped
        whole = Trace(header=header)
        for number, turn in enumerate(replied):
            whole.add({"kind": "turn", "turn": number, "user": turn.user, "reply": turn.reply,
                       "n_prompt": len(turn.trace.header.get("prompt_tokens", [])),
                       "options": turn.trace.header.get("options", {})})  # fmt: skip
            for event in turn.trace.events:
                whole.add(event)
        return whole

    def save(self, path: str | Path, config: Config) -> Trace:
        whole = self.trace(config)
        whole.save(path)
        return whole

    def stats(self) -> list[GenerationStats]:
        """The counters of every finished reply, oldest first."""
        return [t.trace.stats() for t in self.turns if t.trace is not None and t.trace.result is not None]


def stats_line(stats: GenerationStats, stop_reason: str, target_token_s: float | None = None) -> str:
    """The one-line summary of a reply every front end prints: tokens, speed, acceptance, prompt, stop."""
    parts = [f"{stats.n_tokens} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.drafted:
        parts += [f"acceptance {stats.acceptance_rate:.0%}", f"{stats.tokens_per_step:.2f} tokens/step"]
        if target_token_s and stats.n_tokens:
            parts.append(f"{stats.tokens_per_second * target_token_s:.2f}x vs target alone")
    elif stats.mode == "target-only":
        parts.append("target only")
    if "lookup" in stats.drafter or stats.drafter == "ngram":  # hybrid drafting: which drafter each step used
        parts.append(stats.steps_by_source())
    parts.append(f"prompt {stats.n_prompt} ({stats.n_prompt_evaluated + 1} new)")
    parts.append(f"stop: {stop_reason}")
    return "[" + " · ".join(parts) + "]"
