"""The model pair behind the UI, and one reply as a replayable record.

A :class:`Run` is a trace held in memory: the same header and the same
``to_dict()`` events that ``localspec generate --trace`` writes, in the order
they happened. The chat renders it live, the debugging view draws it, and
saving writes it with :class:`localspec.trace.TraceWriter` — so a trace saved
here loads in any other localspec, and one written by the CLI loads here.

:class:`Session` owns the loaded :class:`localspec.engine.Engine`. It is
shared by every browser tab; the engine's own lock (plus the Gradio queue
with a concurrency limit of one) serialises generations, and swapping the
pair builds the new engine first so a failure leaves the old one usable.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from localspec.chat import build_messages
from localspec.config import Config, SamplingConfig, absolute_path
from localspec.errors import ConfigError, LocalspecError
from localspec.events import GenerationResult, GenerationStats
from localspec.generation import GenerationOptions
from localspec.perf import predicted_speedup, slows_down, speedup_verdict
from localspec.trace import TraceWriter, read_trace

EngineFactory = Callable[[Config], Any]


@dataclass
class Settings:
    """What the settings panel controls, checked through :meth:`Config.with_overrides`.

    No defaults of its own: :meth:`from_config` fills it from the config, so the
    panel can never start from values that drifted away from config.yaml's.
    """

    mode: str
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    draft_tokens: int
    seed: int
    max_tokens: int
    system_prompt: str
    adaptive: bool

    @classmethod
    def from_config(cls, config: Config) -> "Settings":
        return cls(
            mode=config.speculative.mode,
            temperature=config.sampling.temperature,
            top_k=config.sampling.top_k,
            top_p=config.sampling.top_p,
            min_p=config.sampling.min_p,
            draft_tokens=config.speculative.draft_tokens,
            seed=config.sampling.seed,
            max_tokens=config.sampling.max_tokens,
            system_prompt=config.chat.system_prompt,
            adaptive=config.speculative.adaptive,
        )

    def apply(self, config: Config) -> Config:
        """``config`` with these values; a bad value raises :class:`ConfigError` naming the setting."""
        values = {
            "speculative.mode": self.mode,
            "sampling.temperature": _number(self.temperature, float, "temperature"),
            "sampling.top_k": _number(self.top_k, int, "top-k"),
            "sampling.top_p": _number(self.top_p, float, "top-p"),
            "sampling.min_p": _number(self.min_p, float, "min-p"),
            "speculative.draft_tokens": _number(self.draft_tokens, int, "draft tokens (K)"),
            "sampling.seed": _number(self.seed, int, "seed"),
            "sampling.max_tokens": _number(self.max_tokens, int, "max tokens"),
            "chat.system_prompt": self.system_prompt or "",
            "speculative.adaptive": bool(self.adaptive),
        }
        return config.with_overrides(values)


def _number(value: Any, kind: type, name: str) -> Any:
    if value is None or value == "":
        raise ConfigError(f"{name} is empty; enter a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} = {value!r} is not a number; enter a number") from None
    if kind is int:
        if number != int(number):
            raise ConfigError(f"{name} = {value!r} must be a whole number")
        return int(number)
    return number


@dataclass
class Run:
    """One reply: trace header plus events (``to_dict()`` form) in the order they happened."""

    header: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    notice: str = ""  # e.g. the target was reloaded so greedy output equals target-only
    source: str = "live"  # live / loaded / replay

    @property
    def tokens(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == "token"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == "step"]

    @property
    def result(self) -> dict[str, Any] | None:
        for event in reversed(self.events):
            if event.get("kind") == "result":
                return event
        return None

    @property
    def text(self) -> str:
        result = self.result
        return result["text"] if result is not None else "".join(t.get("text", "") for t in self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [t["token_id"] for t in self.tokens]

    def add(self, event: Any) -> None:
        data = event.to_dict()
        if isinstance(event, GenerationResult):
            data = {"kind": "result", **data}
        self.events.append(data)

    def stats(self) -> GenerationStats:
        """Counters of the reply so far (the result's own when finished, else summed from the steps)."""
        result = self.result
        if result is not None:
            known = set(GenerationStats.__dataclass_fields__)
            return GenerationStats(**{k: v for k, v in result["stats"].items() if k in known})
        options = self.header.get("options", {})
        stats = GenerationStats(mode=options.get("mode", ""), drafter=self.header.get("draft", ""),
                                seed=options.get("seed", 0), k=options.get("draft_tokens", 0))  # fmt: skip
        for step in self.steps:
            n_drafted = len(step.get("drafted", []))
            stats.steps += 1
            stats.drafted += n_drafted
            stats.accepted += step.get("n_accepted", 0)
            stats.examined += sum(1 for row in step.get("rows", []) if row.get("outcome") in ("accepted", "rejected"))
            stats.draft_s += step.get("draft_s", 0.0)
            stats.verify_s += step.get("verify_s", 0.0)
            stats.other_s += step.get("other_s", 0.0)
            while len(stats.drafted_by_position) < n_drafted:
                stats.drafted_by_position.append(0)
                stats.accepted_by_position.append(0)
            for i in range(n_drafted):
                stats.drafted_by_position[i] += 1
                stats.accepted_by_position[i] += i < step.get("n_accepted", 0)
        stats.n_tokens = len(self.tokens)
        return stats

    # --- traces ---------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write this run as a JSONL trace, exactly as ``localspec generate --trace`` does."""
        header = {k: v for k, v in self.header.items() if k not in ("kind", "version", "created")}
        with TraceWriter(path, header) as writer:
            for event in self.events:
                writer.write(_AsDict(event))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "Run":
        """Read a trace (checked by :func:`localspec.trace.read_trace`), keeping the event order."""
        trace = read_trace(path)  # validates header, version and every line
        events = []
        for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]:
            if line.strip():
                obj = json.loads(line)
                if obj.get("kind") in ("token", "step", "result"):
                    events.append(obj)
        return cls(header=trace.header, events=events, source="loaded")


class _AsDict:
    """Lets :meth:`TraceWriter.write` write an event that is already a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return self._data


@dataclass
class Speed:
    """The live stats panel's numbers (DESIGN §7)."""

    tokens: int
    tokens_per_second: float
    acceptance: float | None
    tokens_per_step: float
    measured_speedup: float | None
    predicted_speedup: float | None
    verdict: str
    target_token_s: float | None = None  # the target-only cost the speedups are measured against
    slow: bool = False  # the draft measurably slows this reply down (a reply long enough to judge)


def speed_of(run: Run, target_token_s: float | None) -> Speed:
    """tok/s, acceptance, tokens per step and measured vs predicted speedup of one run."""
    stats = run.stats()
    drafting = stats.drafted > 0
    measured = predicted = None
    verdict = ""
    if target_token_s and stats.tokens_per_second > 0 and drafting:
        measured = stats.tokens_per_second * target_token_s
        predicted = predicted_speedup(stats, target_token_s)
        verdict = speedup_verdict(measured, predicted, stats.alpha, stats.n_tokens)
    elif not drafting and stats.n_tokens:
        verdict = "no draft tokens in this reply: every token came from the target alone"
    return Speed(
        tokens=stats.n_tokens,
        tokens_per_second=stats.tokens_per_second,
        acceptance=stats.acceptance_rate if drafting else None,
        tokens_per_step=stats.tokens_per_step,
        measured_speedup=measured,
        predicted_speedup=predicted,
        verdict=verdict,
        target_token_s=target_token_s if measured is not None else None,
        slow=measured is not None and slows_down(measured, stats.n_tokens),
    )


@dataclass
class ReplayReport:
    """Outcome of regenerating an invariant-mode reply with no draft."""

    identical: bool
    first_difference: int | None  # token index of the first difference
    original: Run
    replay: Run
    explanation: str


class Session:
    """The loaded pair, shared by all tabs, plus the things only one tab at a time may do."""

    def __init__(self, config: Config, engine_factory: EngineFactory | None = None) -> None:
        if engine_factory is None:
            from localspec.engine import Engine

            engine_factory = Engine
        self.config = config
        self._factory = engine_factory
        self._engine = None
        self._swap = threading.Lock()  # one load/swap at a time
        self._t_target: float | None = None  # target-only seconds per token of the loaded target

    # --- the pair -------------------------------------------------------
    @property
    def engine(self):
        """The engine, loaded on first use (raises :class:`LocalspecError` when the pair cannot load)."""
        with self._swap:
            if self._engine is None:
                self._engine = self._factory(self.config)
            return self._engine

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def pair_name(self) -> str:
        if self._engine is not None:
            return self._engine.pair_name
        return f"{Path(self.config.model.target).name} + {Path(self.config.model.draft).name} (not loaded)"

    def load_pair(self, target: str, draft: str) -> str:
        """Build an engine for a new pair; on failure raise and keep the old one. Returns the pair name."""
        target, draft = (target or "").strip(), (draft or "").strip()
        if not target:
            raise ConfigError("the target model path is empty; choose a .gguf file")
        if not draft:
            raise ConfigError("the draft model is empty; choose a .gguf file, 'ngram' or 'none'")
        config = self.config.with_overrides({
            "model.target": absolute_path(target, Path.cwd()),
            "model.draft": absolute_path(draft, Path.cwd()),
        })  # fmt: skip
        with self._swap:
            engine = self._factory(config)  # raises: the old engine stays
            old, self._engine, self.config = self._engine, engine, config
            self._t_target = None
        if old is not None:
            old.close()
        return engine.pair_name

    def close(self) -> None:
        with self._swap:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def target_token_seconds(self, measure: bool = True) -> float | None:
        """Target-only cost per token (DESIGN §7); ``measure=False`` only returns a cached value.

        Measuring takes the engine lock, so it must never run while a reply holds it.
        """
        if self._t_target is None and measure and self._engine is not None:
            try:
                self._t_target = self._engine.target_token_seconds()
            except LocalspecError:
                return None
        return self._t_target

    # --- generation -----------------------------------------------------
    def reply(
        self,
        history: Sequence[tuple[str, str]],
        user: str,
        settings: Settings,
        cancel: threading.Event | None = None,
    ) -> Iterator[Run]:
        """Stream one chat reply: yields the same growing :class:`Run` after every event.

        ``history`` is plain text (never display markup). Raises
        :class:`LocalspecError` before the first yield for bad settings or prompts.
        """
        from localspec.cli import trace_header

        config = settings.apply(self.config)
        engine = self.engine
        if config.chat.chat_template:
            prepared = engine.encode_chat(build_messages(config.chat.system_prompt, list(history), user))
        else:
            prepared = engine.encode_raw(user)
        options = engine.options(config, detail_top=config.trace.top_n)
        params = config.sampling.params()
        if options.mode != "target-only" and engine.drafter is not None:
            self.target_token_seconds()  # measured once per pair, before the reply takes the lock
        notice = engine.ensure_invariance(options, params) or ""
        run = Run(header=trace_header(config, engine, prepared, options), notice=notice)
        yield from self._stream(engine, run, prepared.tokens, options, params, cancel)

    def _stream(self, engine, run: Run, prompt, options, params, cancel) -> Iterator[Run]:
        events = engine.stream(prompt, options, params, cancel)
        try:
            for event in events:
                run.add(event)
                yield run
        except LocalspecError as error:
            run.error = str(error)
            yield run
        finally:
            events.close()  # releases the engine lock even when the caller stops iterating

    def replay_without_draft(self, run: Run) -> ReplayReport:
        """Regenerate an invariant-mode run with the same seed and no draft; compare byte for byte."""
        options = dict(run.header.get("options", {}))
        if options.get("mode") != "invariant":
            raise ConfigError(
                f"replay without draft needs an invariant-mode reply (this one is {options.get('mode', '?')!r}); "
                "set mode to invariant and generate again"
            )
        engine = self.engine
        if run.header.get("target") != engine.target.name:
            raise ConfigError(
                f"this reply was made with target {run.header.get('target')!r} but {engine.target.name!r} is "
                "loaded; load that target to replay it"
            )
        original_ids = run.token_ids
        result = run.result or {}
        if result.get("stop_reason") == "cancelled":
            options["max_tokens"] = max(1, len(original_ids))  # compare what was generated
        options["draft_tokens"] = 0
        options["adaptive"] = False  # no draft: nothing to adapt (and adaptive K needs min_draft_tokens <= K)
        known = set(GenerationOptions.__dataclass_fields__)
        gen_options = GenerationOptions(**{k: v for k, v in options.items() if k in known})
        sampling = run.header.get("config", {}).get("sampling", {})
        params = SamplingConfig(**{k: v for k, v in sampling.items() if k in SamplingConfig.__dataclass_fields__}).params()
        header = dict(run.header)
        header["options"] = {**options, "max_tokens": gen_options.max_tokens}
        replay = Run(header={k: v for k, v in header.items() if k not in ("kind", "version", "created")}, source="replay")
        for _ in self._stream(engine, replay, run.header["prompt_tokens"], gen_options, params, None):
            pass
        if replay.error:
            raise ConfigError(f"the replay failed: {replay.error}")
        replay_ids = replay.token_ids
        identical = original_ids == replay_ids and run.text.encode() == replay.text.encode()
        first = None
        if not identical:
            first = next((i for i, (a, b) in enumerate(zip(original_ids, replay_ids)) if a != b),
                         min(len(original_ids), len(replay_ids)))  # fmt: skip
        if identical:
            explanation = (
                f"byte-identical: {len(replay_ids)} tokens, same seed {options.get('seed')}, no draft. "
                "In invariant mode the shared Gumbel noise decides every token, so the draft only changes speed."
            )
        else:
            report = engine.invariance()
            backend = report.line() if report is not None else "batch invariance was not measured"
            explanation = (
                f"the texts differ from token #{first + 1}. Invariant mode guarantees the same text only when the "
                "target's logits for a prefix are bit-identical whether computed in a verification batch or one "
                f"token at a time (batch invariance, DESIGN §5). Measured here: {backend}"
            )
        return ReplayReport(identical, first, run, replay, explanation)


def timestamped_trace_path(folder: str | Path) -> Path:
    """Where a trace saved from the UI goes: ``<trace.dir>/ui-YYYYmmdd-HHMMSS.jsonl``."""
    return Path(folder) / time.strftime("ui-%Y%m%d-%H%M%S.jsonl")
