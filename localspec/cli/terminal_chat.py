"""`localspec chat`: a multi-turn terminal conversation that shows every token's fate as it streams.

Each turn renders the whole conversation with the model's chat template; the
generation loop's cache sync then evaluates only the tokens that are new since
the previous turn, so a long chat costs no more per turn than its new text.
The conversation keeps bare text only: colours and markers are display, never
prompt (docs/design.md, Visual language). Ctrl-C during a reply stops it after the current step and
keeps what was written; Ctrl-C or Ctrl-D at the prompt leaves.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from localspec.app.config import Config, describe
from localspec.app.conversation import Conversation, stats_line
from localspec.cli.interrupt import cancel_on_interrupt
from localspec.cli.term_render import TokenStyle
from localspec.core.errors import ConfigError, LocalspecError
from localspec.core.events import TokenEvent

PROMPT = "you> "


# ----------------------------------------------------------------------
# input
class LineReader:
    """Reads one line; raises EOFError (Ctrl-D / end of input) or KeyboardInterrupt (Ctrl-C)."""

    def read(self, prompt: str) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class TerminalReader(LineReader):
    """prompt_toolkit: line editing, Up/Down history kept across sessions, Esc-Enter for a new line."""

    def __init__(self, history_path: Path | None, colour: bool) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        history = InMemoryHistory()
        if history_path is not None:
            try:
                history_path.parent.mkdir(parents=True, exist_ok=True)
                history_path.touch(exist_ok=True)
                history = FileHistory(str(history_path))
            except OSError:
                pass  # a read-only home still gets in-memory history
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event) -> None:  # noqa: ANN001
            event.current_buffer.insert_text("\n")

        self._session = PromptSession(history=history, key_bindings=bindings, enable_history_search=True)
        self._colour = colour

    def read(self, prompt: str) -> str:
        message: Any = [("bold", prompt)] if self._colour else prompt
        return self._session.prompt(message)


class PlainReader(LineReader):
    """Standard input that is not a terminal (a pipe, a file): one message per line."""

    def __init__(self, chrome: TextIO, echo: bool) -> None:
        self._chrome = chrome
        self._echo = echo
        if hasattr(sys.stdin, "reconfigure"):
            sys.stdin.reconfigure(errors="replace")  # bytes that are not UTF-8 become U+FFFD, not a crash

    def read(self, prompt: str) -> str:
        self._chrome.write(prompt)
        self._chrome.flush()
        line = sys.stdin.readline()
        if not line:
            self._chrome.write("\n")
            raise EOFError
        line = line.rstrip("\n")
        if self._echo:
            self._chrome.write(line + "\n")
        return line


def history_file() -> Path:
    root = os.environ.get("LOCALSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "localspec")
    return Path(root) / "chat_history"


# ----------------------------------------------------------------------
# Slash commands that change a setting. What each does, its type and its allowed values come from
# the setting's declaration (localspec/app/config.py); /help is written from it too.
SETTING_COMMANDS: dict[str, str] = {
    "/mode": "speculative.mode",
    "/temp": "sampling.temperature",
    "/k": "speculative.draft_tokens",
    "/seed": "sampling.seed",
    "/max": "sampling.max_tokens",
}


def help_text() -> str:
    """The /help screen: the fixed commands, then one line per setting command from its declaration."""
    lines = ["commands:", "  /help              this list",
             "  /reset             forget the conversation (and its /stats)",
             "  /system [TEXT]     show or set the system prompt (/system default = the template's own)"]  # fmt: skip
    for command, key in SETTING_COMMANDS.items():
        info = describe(key)
        value = "NAME" if info.choices else {"int": "N", "float": "X"}.get(info.kind, "TEXT")
        choices = f": {', '.join(info.choices)}" if info.choices else ""
        lines.append(f"  {command + ' [' + value + ']':<18} {info.help}{choices}")
    lines += [
        "  /markers           toggle the [corrected] / {bonus} text markers",
        "  /stats             acceptance by draft position for the conversation so far",
        "  /save [FILE]       write the conversation and its trace as JSONL",
        "  /quit              leave (also Ctrl-D, or Ctrl-C at the prompt)",
        "Ctrl-C during a reply stops it and keeps the partial text. Esc then Enter inserts a new line.",
        "Start a message with // to send text that begins with /.",
    ]
    return "\n".join(lines)


class ChatSession:
    """The REPL: reads lines, runs slash commands, streams replies, keeps the conversation."""

    def __init__(self, engine, config: Config, style: TokenStyle, reader: LineReader,
                 out: TextIO | None = None, chrome: TextIO | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.config = config
        self.style = style
        self.reader = reader
        self.out = out or sys.stdout
        self.chrome = chrome or self.out  # banner, stats and notes
        self.conversation = Conversation()

    # -- output helpers ---------------------------------------------------
    def say(self, text: str = "") -> None:
        self.chrome.write(text + "\n")
        self.chrome.flush()

    def note(self, text: str) -> None:
        self.say(self.style.dim(text))

    def problem(self, text: str) -> None:
        self.say(self.style.error(text))

    def settings_line(self) -> str:
        c = self.config
        draft = self.engine.drafter.name if self.engine.drafter is not None else "none"
        seed = "fresh" if c.sampling.seed < 0 else str(c.sampling.seed)
        return (
            f"mode {c.speculative.mode} · T {c.sampling.temperature:g} · K {c.speculative.draft_tokens} · "
            f"seed {seed} · max {c.sampling.max_tokens} tokens · draft {draft}"
        )

    # -- the loop ---------------------------------------------------------
    def run(self) -> int:
        """Chat until /quit, Ctrl-D or Ctrl-C at the prompt; returns the exit status (0)."""
        self.say(self.style.bold(f"localspec chat · {self.engine.pair_name}"))
        self.note(self.settings_line())
        self.note(self.engine.compute_line)
        self.say(self.style.legend())
        self.note("/help for commands · Ctrl-C stops a reply · Ctrl-D or /quit leaves")
        while True:
            try:
                line = self.reader.read(PROMPT)
            except (EOFError, KeyboardInterrupt):
                self.say()
                return 0
            text = line.strip()
            if not text:
                continue
            if text.startswith("//"):
                text = text[1:]
            elif text.startswith("/"):
                if not self.command(text):
                    return 0
                continue
            self.reply(text)

    # -- slash commands ---------------------------------------------------
    def command(self, text: str) -> bool:
        """Run one slash command; False means leave."""
        name, _, arg = text.partition(" ")
        name, arg = name.lower(), arg.strip()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name in ("/help", "/?", "/h"):
            self.say(help_text())
            self.note(self.settings_line())
        elif name == "/reset":
            self.conversation.clear()
            self.note("conversation cleared")
        elif name == "/system":
            self.set_system(arg)
        elif name in SETTING_COMMANDS:
            self.set_setting(name, arg)
        elif name == "/markers":
            self.style.markers = not self.style.markers
            self.note(f"status markers {'on' if self.style.markers else 'off'}")
            self.say(self.style.legend())
        elif name == "/stats":
            self.say(self.stats_table())
        elif name == "/save":
            self.save(arg)
        else:
            self.problem(f"unknown command {name}; type /help for the list (// sends a message starting with /)")
        return True

    def set_system(self, arg: str) -> None:
        if not arg:
            system = self.conversation.system_prompt(self.config)
            self.note(f"system prompt: {system!r}" if system else "system prompt: the template's default")
            return
        self.conversation.system = "" if arg.lower() == "default" else arg
        self.note("system prompt set; the next reply re-reads the whole conversation")

    def set_setting(self, name: str, arg: str) -> None:
        info = describe(SETTING_COMMANDS[name])
        section, attr = info.key.split(".")
        if not arg:
            self.note(f"{info.name}: {getattr(getattr(self.config, section), attr)}")
            return
        try:
            self.config = self.config.with_overrides({info.key: info.parse(arg, name)})
        except ConfigError as error:
            self.problem(f"error: {error}; e.g. {name} {info.default}")
            return
        self.note(self.settings_line())

    # -- one reply --------------------------------------------------------
    def reply(self, user: str) -> None:
        """Stream one reply; Ctrl-C stops it after the current step and keeps the partial text."""
        wrote, told = "", False
        try:
            with cancel_on_interrupt() as cancel:
                for event in self.conversation.reply(self.engine, self.config, user, cancel):
                    if not told:  # the turn's notes (old turns left out, the target reloaded) come first
                        told = True
                        for line in self.conversation.turns[-1].trace.notice.splitlines():
                            (self.problem if line.startswith("warning") else self.note)(line)
                    if isinstance(event, TokenEvent) and event.text:
                        self.out.write(self.style.token(event.text, event.status))
                        self.out.flush()
                        wrote += event.text
        except LocalspecError as error:  # settings or a message too long: nothing was added
            self.problem(f"error: {error}")
            return
        trace = self.conversation.turns[-1].trace
        if not wrote.endswith("\n"):
            self.out.write("\n")
        self.out.flush()
        if trace.error:
            self.problem(f"error: {trace.error}")
        elif trace.result is not None:
            if trace.result["stop_reason"] == "cancelled":
                self.note("(stopped: the partial reply is kept in the conversation)")
            t_target = self.engine.target_seconds_during(trace.steps)
            self.note(stats_line(trace.stats(), trace.result["stop_reason"], t_target))

    # -- statistics -------------------------------------------------------
    def stats_table(self) -> str:
        """Per-position acceptance over the conversation, plus totals."""
        replies = self.conversation.stats()
        if not replies:
            return "no replies yet"
        drafted: list[int] = []
        accepted: list[int] = []
        for stats in replies:
            for i, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
                if i == len(drafted):
                    drafted.append(0)
                    accepted.append(0)
                drafted[i] += d
                accepted[i] += a
        tokens = sum(stats.n_tokens for stats in replies)
        steps = sum(stats.steps for stats in replies)
        n_drafted = sum(stats.drafted for stats in replies)
        n_accepted = sum(stats.accepted for stats in replies)
        decode_s = sum(stats.decode_s for stats in replies)
        lines = [f"{len(replies)} replies · {tokens} tokens · {steps} steps"
                 + (f" · {tokens / steps:.2f} tokens/step" if steps else "")
                 + (f" · {tokens / decode_s:.1f} tok/s" if decode_s > 0 else "")]  # fmt: skip
        if not n_drafted:
            lines.append("no draft tokens yet (target-only replies)")
            return "\n".join(lines)
        lines.append(f"acceptance {n_accepted / n_drafted:.1%} ({n_accepted} of {n_drafted} draft tokens)")
        lines.append("draft position   drafted   accepted   rate")
        for i, (d, a) in enumerate(zip(drafted, accepted)):
            rate = a / d if d else 0.0
            bar = "█" * round(rate * 20)
            lines.append(f"{i + 1:>14}   {d:>7}   {a:>8}   {rate:>4.0%}  {bar}")
        return "\n".join(lines)

    # -- /save ------------------------------------------------------------
    def save(self, arg: str) -> None:
        """Write the conversation as one trace (a given folder must exist; the default one is made)."""
        if not any(t.trace is not None for t in self.conversation.turns):
            self.note("nothing to save yet")
            return
        if arg:
            path = Path(os.path.expanduser(arg))
            path = path if path.is_absolute() else Path.cwd() / path
        else:
            folder = self.config.resolve_path(self.config.trace.dir)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / time.strftime("chat-%Y%m%d-%H%M%S.jsonl")
        try:
            whole = self.conversation.save(path, self.config)
        except (LocalspecError, OSError) as error:
            self.problem(f"error: {error}")
            return
        self.note(f"saved {whole.header['turns']} turn(s), {len(whole.events) + 1} lines, to {path}")


# ----------------------------------------------------------------------
def run_chat(engine, config: Config, no_color: bool = False, show_status: bool | None = None) -> int:
    """Entry point used by the CLI: pick the rendering and the input method, then chat."""
    if not config.chat.chat_template:
        raise ConfigError(
            "localspec chat needs the model's chat template; drop --raw (raw prompts: localspec generate --raw)"
        )
    stdout_tty = sys.stdout.isatty()
    stdin_tty = sys.stdin.isatty()
    style = TokenStyle.choose(no_color, show_status, stdout_tty)
    chrome = sys.stdout if stdout_tty else sys.stderr
    if stdin_tty and stdout_tty:
        reader: LineReader = TerminalReader(history_file(), style.colour)
    else:
        reader = PlainReader(chrome, echo=not stdin_tty and chrome.isatty())
    return ChatSession(engine, config, style, reader, sys.stdout, chrome).run()
