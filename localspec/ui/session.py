"""The model pair behind the UI, the panel's settings, speed figures and the replay check.

A reply is a :class:`localspec.app.trace.Trace`: the chat renders it live,
the debugging view draws it, and saving writes the same JSONL file that
``localspec generate --trace`` writes. Each tab's chat is a
:class:`localspec.app.conversation.Conversation`, as in the terminal.

:class:`Session` owns the loaded :class:`localspec.app.engine.Engine`. It is
shared by every browser tab; the engine's own lock (plus the Gradio queue
with a concurrency limit of one) serialises generations, and swapping the
pair builds the new engine first so a failure leaves the old one usable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.app.config import Config, SamplingConfig, absolute_path, describe
from localspec.app.trace import Trace
from localspec.core.errors import ConfigError, LocalspecError, OutOfMemoryError
from localspec.core.options import GenerationOptions
from localspec.core.perf import predicted_speedup, slows_down, speedup_verdict

EngineFactory = Callable[[Config], Any]


# The settings panel, in the order of its controls: config key -> the label the user sees. Each
# control's kind, range, choices and help text come from the setting's declaration.
PANEL: dict[str, str] = {
    "speculative.mode": "mode",
    "sampling.temperature": "temperature",
    "sampling.top_k": "top-k",
    "sampling.top_p": "top-p",
    "sampling.min_p": "min-p",
    "speculative.draft_tokens": "draft tokens K",
    "sampling.seed": "seed",
    "sampling.max_tokens": "max tokens",
    "chat.system_prompt": "system prompt",
    "speculative.adaptive": "adaptive K",
}


@dataclass
class Settings:
    """The panel's values by config key, checked through :meth:`Config.with_overrides` when applied.

    No defaults of its own: :meth:`from_config` fills it from the config, so the
    panel can never start from values that drifted away from config.yaml's.
    """

    values: dict[str, Any]

    @classmethod
    def from_config(cls, config: Config) -> Settings:
        return cls({key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in PANEL})

    @classmethod
    def from_panel(cls, *values: Any) -> Settings:
        """The controls' values, in :data:`PANEL` order (as Gradio passes them)."""
        return cls(dict(zip(PANEL, values, strict=True)))

    def replace(self, **by_name: Any) -> Settings:
        """A copy with settings replaced by their short name (``temperature=0``, ``max_tokens=16``)."""
        keys = {key.split(".")[1]: key for key in PANEL}
        return Settings(self.values | {keys[name]: value for name, value in by_name.items()})

    def apply(self, config: Config) -> Config:
        """``config`` with these values; a bad value raises :class:`ConfigError` naming the control."""
        return config.with_overrides(
            {key: describe(key).parse(value, PANEL[key]) for key, value in self.values.items()}
        )


@dataclass
class Speed:
    """The live stats panel's numbers (the performance model of docs/design.md)."""

    tokens: int
    tokens_per_second: float
    acceptance: float | None
    tokens_per_step: float
    measured_speedup: float | None
    predicted_speedup: float | None
    verdict: str
    target_token_s: float | None = None  # the target-only cost the speedups are measured against
    slow: bool = False  # the draft measurably slows this reply down (a reply long enough to judge)
    sources: str = ""  # which drafter each step used (e.g. "lookup 37 · model 8 · none 15 steps")
    load: float | None = None  # how much slower the target ran than its best timing (None: not known)


def speed_of(run: Trace, target_token_s: float | None, best_token_s: float | None = None) -> Speed:
    """tok/s, acceptance, tokens per step and measured vs predicted speedup of one run.

    ``target_token_s`` is the target-only cost under the reply's own conditions (see
    :meth:`localspec.app.engine.Engine.target_seconds_during`) and ``best_token_s`` the fastest timing
    of the target: their ratio tells a target slowed down by something else from a draft that costs
    too much."""
    stats = run.stats()
    drafting = stats.drafted > 0
    measured = predicted = None
    verdict = ""
    load = target_token_s / best_token_s if target_token_s and best_token_s else None
    if target_token_s and stats.tokens_per_second > 0 and drafting:
        measured = stats.tokens_per_second * target_token_s
        predicted = predicted_speedup(stats, target_token_s)
        # the verdict quotes the panel's own acceptance (accepted / drafted): one number, one definition
        verdict = speedup_verdict(measured, predicted, stats.acceptance_rate, stats.n_tokens, load)
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
        sources=stats.steps_by_source(),
        load=load if measured is not None else None,
    )


@dataclass
class ReplayReport:
    """Outcome of regenerating an invariant-mode reply with no draft."""

    identical: bool
    first_difference: int | None  # token index of the first difference
    original: Trace
    replay: Trace
    explanation: str


class Session:
    """The loaded pair, shared by all tabs, plus the things only one tab at a time may do."""

    def __init__(self, config: Config, engine_factory: EngineFactory | None = None) -> None:
        if engine_factory is None:
            from localspec.app.engine import Engine

            engine_factory = Engine
        self.config = config
        self._factory = engine_factory
        self._engine = None
        self._swap = threading.Lock()  # one load/swap at a time

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
        """Build an engine for a new pair; on failure raise and keep the old one, unless memory could not hold
        both pairs: then the old one is released first, and loaded again on next use if the new one fails
        alone too. Returns the pair name."""
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
            old = self._engine
            try:
                engine = self._factory(config)  # the old pair serves meanwhile; a failure leaves it in place
            except OutOfMemoryError:
                if old is None:
                    raise
                self._engine = None  # no room for both: the old goes first; the old config stays for the next use
                old.close()
                engine = self._factory(config)
            self._engine, self.config = engine, config
        if old is not None:
            old.close()  # idempotent: released already where both did not fit
        return engine.pair_name

    def close(self) -> None:
        with self._swap:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def speed(self, run: Trace) -> Speed:
        """The stats panel's numbers for ``run``, against the target under the reply's own conditions.
        Never measures: mid-reply the engine lock is held."""
        engine = self._engine
        if engine is None:
            return speed_of(run, None)
        return speed_of(run, engine.target_seconds_during(run.steps), engine.best_target_seconds())

    def replay_without_draft(self, run: Trace) -> ReplayReport:
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
        params = SamplingConfig(
            **{k: v for k, v in sampling.items() if k in SamplingConfig.__dataclass_fields__}
        ).params()
        header = dict(run.header)
        header["options"] = {**options, "max_tokens": gen_options.max_tokens}
        replay = Trace(
            header={k: v for k, v in header.items() if k not in ("kind", "version", "created")}, source="replay"
        )
        try:
            for event in engine.stream(run.header["prompt_tokens"], gen_options, params):
                replay.add(event)
        except LocalspecError as error:
            replay.error = str(error)
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
                f"token at a time (batch invariance; `localspec doctor` measures it). Measured here: {backend}"
            )
        return ReplayReport(identical, first, run, replay, explanation)


def timestamped_trace_path(folder: str | Path) -> Path:
    """Where a trace saved from the UI goes: ``<trace.dir>/ui-YYYYmmdd-HHMMSS.jsonl``."""
    return Path(folder) / time.strftime("ui-%Y%m%d-%H%M%S.jsonl")
