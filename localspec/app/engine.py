"""A loaded target/draft pair, ready to generate: what every front end talks to.

The engine turns config into models (checking the pair before the first
token), prompts into tokens (the model's own chat template, or raw text), and
runs the generation loop one request at a time — llama.cpp contexts are not
thread-safe, so a second caller waits on :attr:`Engine.lock`.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from localspec.app import learned
from localspec.app.catalog import resolve_pair
from localspec.app.config import Config
from localspec.app.invariance import (
    Diagnosis,
    InvarianceReport,
    build_facts,
    build_id,
    cpu_name,
    diagnose,
    load_cached,
    measure_model,
    needs_invariance,
    save_cached,
    suspects,
    within_invariant_rows,
)
from localspec.app.records import with_position_records
from localspec.app.templates import ChatTemplate, Message, build_messages
from localspec.app.usertext import clean
from localspec.core.errors import ConfigError, LocalspecError, ModelError, OutOfMemoryError
from localspec.core.events import GenerationResult, StepEvent, TokenEvent
from localspec.core.loop import SpeculativeDecoder
from localspec.core.options import GenerationOptions
from localspec.core.perf import target_alone_seconds
from localspec.drafting.drafters import HybridDrafter, ModelDrafter, NgramDrafter, PolicyDrafter
from localspec.drafting.policy import speculative_decoder
from localspec.llama.footprint import Footprint

Progress = Callable[[str, float], None]


@dataclass
class PreparedPrompt:
    """Prompt tokens plus the text they came from (kept for traces)."""

    tokens: list[int]
    text: str


class Engine:
    """Target model, optional drafter, chat template and the loop."""

    def __init__(self, config: Config, progress: Progress | None = None) -> None:
        config = resolve_pair(config)
        self.config = config
        self.settings = llama_settings(config)
        self.lock = threading.Lock()
        self.closed = False
        self.target_path = config.resolve_path(config.model.target)
        self.target = load_model(self.target_path, self.settings, "target", _stage(progress, "target"))
        self.draft_model = None
        self.draft_path = None
        try:
            self.drafter = self._make_drafter(config, progress)
        except Exception:
            self.target.close()
            raise
        self.decoder = speculative_decoder(self.target, self.target, self.drafter)
        self._learned_key = self._remembered()
        template = self.target.chat_template()
        self.template = (
            ChatTemplate(
                template,
                self.target.special_text(self.target.bos),
                self.target.special_text(self.target.eos),
                self.target.name,
            )
            if template
            else None
        )
        self._invariance: InvarianceReport | None = None
        self._target_token_s: float | None = None
        self._ngram_decoder: SpeculativeDecoder | None = None

    def _make_drafter(self, config: Config, progress: Progress | None) -> PolicyDrafter | None:
        spec = config.model.draft.strip()
        if spec.lower() == "none":
            return None
        if spec.lower() == "ngram":
            return NgramDrafter(self.target)
        path = self.draft_path = config.resolve_path(spec)
        self.draft_model = load_model(path, self.settings, "draft", _stage(progress, "draft"))
        try:
            from localspec.llama.pair import check_pair

            check_pair(self.target, self.draft_model)
        except Exception:
            self.draft_model.close()
            self.draft_model = None
            raise
        model = ModelDrafter(self.draft_model, vocab_size=max(self.target.vocab_size, self.draft_model.vocab_size))
        return HybridDrafter(model, NgramDrafter(self.target))  # lookup: per request

    # ------------------------------------------------------------------
    def pair_warning(self) -> str | None:
        """A draft model at least as large as its target cannot make anything faster: say so at load."""
        if self.draft_model is None:
            return None
        target_mb, draft_mb = self.target.size_bytes / 2**20, self.draft_model.size_bytes / 2**20
        if draft_mb < target_mb:
            return None
        return (
            f"warning: the draft {self.draft_model.name} ({draft_mb:.0f} MiB) is not smaller than the target "
            f"{self.target.name} ({target_mb:.0f} MiB), so speculation can only be slower; swap them "
            "(--target/--draft) or choose a smaller draft"
        )

    @property
    def compute_line(self) -> str:
        """Where the pair computes, for the chat's header and the UI's badge: each model's layers on the devices
        llama.cpp gave them, by name (a GPU build that left a model on the CPU shows at a glance)."""
        from localspec.llama.runtime import devices

        found = devices()
        cpu = f"the CPU ({cpu_name({'devices': found})}, {self.settings.resolved_threads()} threads)"
        models = [(role, model) for role, model in (("target", self.target), ("draft", self.draft_model)) if model]
        offloads = [(role, model.placement.offload) for role, model in models]
        if not any(offload.output_on_gpu for _, offload in offloads):
            return f"{'both models' if len(offloads) > 1 else 'the target'} on {cpu}"
        names = {device.name: device.description for device in found if device.kind != "CPU"}
        return "; ".join(
            f"{role}: " + (offload.describe(names) if offload.output_on_gpu else f"on {cpu}")
            for role, offload in offloads
        )

    @property
    def pair_name(self) -> str:
        draft = "no draft" if self.drafter is None else self.draft_model.name if self.draft_model else self.drafter.name
        return f"{self.target.name} + {draft}"

    def close(self) -> None:
        """Free both models once the request in flight ends; one that waited for the lock then ends with an error
        instead of computing on freed memory (the UI swapped pairs while another tab's reply was queued)."""
        with self.lock:
            self.closed = True
            if self.draft_model is not None:
                self.draft_model.close()
            self.target.close()

    # ------------------------------------------------------------------
    def encode_chat(self, messages: Sequence[Message]) -> PreparedPrompt:
        """Render ``messages`` with the model's chat template and tokenize (special tokens parsed)."""
        if self.template is None:
            raise ModelError(f"{self.target.name} has no chat template; use --raw (raw text prompts)")
        messages = [replace(message, content=clean(message.content)) for message in messages]
        text = self.template.render(messages, add_generation_prompt=True)
        bos_text = self.template.bos_token
        add_bos = self.target.adds_bos and not (bos_text and text.startswith(bos_text))
        return PreparedPrompt(self.target.tokenize(text, add_special=add_bos, parse_special=True), text)

    def encode_prompt(
        self, config: Config, history: Sequence[tuple[str, str]], user: str, system: str | None = None
    ) -> PreparedPrompt:
        """The prompt every front end sends: the chat template over ``history`` and ``user`` (with
        ``system``, default the config's), or ``user`` as raw text when ``chat.chat_template`` is off."""
        if not config.chat.chat_template:
            return self.encode_raw(user)
        system = config.chat.system_prompt if system is None else system
        return self.encode_chat(build_messages(system, list(history), user))

    def encode_raw(self, text: str) -> PreparedPrompt:
        """Raw text prompt: BOS as the model wants it, special-token text left as plain text."""
        text = clean(text)
        return PreparedPrompt(self.target.tokenize(text, add_special=True, parse_special=False), text)

    def options(self, config: Config | None = None, **overrides) -> GenerationOptions:
        """Generation options from ``config`` (default: the one the pair was loaded with), with keyword
        overrides (``None`` = keep). The UI and the terminal chat pass their per-reply config, so a
        setting changed there (K, adaptive K, mode, seed) reaches the loop without being listed twice."""
        cfg = config or self.config
        values = dict(
            mode=cfg.speculative.mode,
            max_tokens=cfg.sampling.max_tokens,
            draft_tokens=cfg.speculative.draft_tokens,
            seed=cfg.sampling.seed,
            detail_top=0,
            adaptive=cfg.speculative.adaptive,
            min_draft_tokens=cfg.speculative.min_draft_tokens,
            lookup=cfg.speculative.lookup,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values["seed"] is None or values["seed"] < 0:
            values["seed"] = secrets.randbits(63)
        return GenerationOptions(**values)

    def stream(
        self,
        prompt: Sequence[int],
        options: GenerationOptions,
        params=None,
        cancel: threading.Event | None = None,
        drafter: str | None = None,
    ) -> Iterator[TokenEvent | StepEvent | GenerationResult]:
        """Run one request; holds the engine lock for its whole duration.

        ``drafter``: None for the loaded pair's, or ``"ngram"`` for prompt lookup on the same target
        (the benchmark compares both in one run).
        """
        params = params if params is not None else self.config.sampling.params()
        options = within_invariant_rows(options, params, self.invariant_rows)
        self._reconnect_target()
        decoder = self.decoder if drafter is None else self._decoder_with(drafter)
        with self.lock:
            if self.closed:
                raise ModelError(f"the pair {self.pair_name} was closed while this request waited; send it again")
            yield from with_position_records(
                decoder.stream(prompt, params, options, cancel), decoder, options.detail_top
            )
            learns = options.adaptive and options.mode != "target-only"  # else no controller learnt anything
            if learns and decoder is self.decoder and self._learned_key is not None:
                learned.save(self._learned_key, decoder.policy.learned(), f"{self.pair_name}, {build_id()}")

    def _remembered(self) -> str | None:
        """Resume what adaptive drafting learnt with this pair, settings, build and machine in an earlier
        process (see :mod:`localspec.app.learned`); the key to save under, or None where nothing is kept."""
        if not self.config.speculative.remember or self.drafter is None:
            return None
        settings, _ = self._invariance_key()
        draft_buffers = list(self.draft_model.weight_buffers) if self.draft_model is not None else None
        try:
            key = learned.identity(self.target_path, self.draft_path, settings | {"draft_buffers": draft_buffers})
        except OSError:
            return None
        self.decoder.policy.resume(learned.load(key))
        return key

    def _decoder_with(self, drafter: str) -> SpeculativeDecoder:
        if drafter != "ngram":
            raise ConfigError(f"drafter {drafter!r} is unknown; use None (the pair's) or 'ngram'")
        if self._ngram_decoder is None or self._ngram_decoder.target is not self.target:
            self._ngram_decoder = speculative_decoder(self.target, self.target, NgramDrafter(self.target))
        return self._ngram_decoder

    def target_token_seconds(self, samples: int = 6, measure: bool = True) -> float | None:
        """Seconds the target takes for one token on its own: the target-only cost of the performance model.

        Measured once (the fastest of ``samples`` single-token decodes appended
        after whatever is cached, then rolled back), so speedups can be
        estimated without running a whole target-only reply. The minimum, not
        the median: a decode that another process slowed down would otherwise
        inflate every speedup shown for this pair; the minimum can only make
        them conservative. ``measure=False`` only returns a measurement already made (mid-reply the
        lock is held, so it must not measure).
        """
        if self._target_token_s is None and measure:
            import time

            with self.lock:
                keep = len(self.target.cached_tokens)
                token = self.target.bos if self.target.bos >= 0 else 0
                if keep + samples + 1 > self.target.context_size:
                    self.target.truncate(0)  # no room after the cache: measure on an empty one
                    keep = 0
                times = []
                try:
                    self.target.extend([token], 1)  # warm-up
                    for _ in range(samples):
                        started = time.perf_counter()
                        self.target.extend([token], 1)
                        times.append(time.perf_counter() - started)
                finally:
                    self.target.truncate(keep)
            self._target_token_s = min(times)
        return self._target_token_s

    def target_seconds_during(self, steps) -> float | None:
        """The target-only cost per token while ``steps`` ran (:func:`localspec.core.perf.target_alone_seconds`,
        shaped by the costs timed before the first adaptive step), else the best timing made so far. A
        reply's speedup is measured against this: the target under the same conditions."""
        best = self.best_target_seconds()
        costs = self.decoder.policy.costs
        shape = dict(costs.verify_s) if costs is not None and costs.verify_s.get(1) else {1: best} if best else {}
        return target_alone_seconds(steps, shape) or best

    def best_target_seconds(self) -> float | None:
        """The fastest the target has been timed for one token here (never measures)."""
        costs = self.decoder.policy.costs
        timings = [self._target_token_s, costs.verify_s.get(1) if costs is not None else None]
        return min((t for t in timings if t), default=None)

    # ------------------------------------------------------------------
    def _invariance_key(self) -> tuple[dict, str]:
        settings = {"flash_attention": self.settings.flash_attention, "threads": self.target.threads,
                    "n_gpu_layers": self.settings.n_gpu_layers,
                    "buffers": list(self.target.weight_buffers)}  # fmt: skip
        return settings, build_id()

    def invariance(self, measure: bool = True, refresh: bool = False) -> InvarianceReport | None:
        """Is the target batch-invariant on this build? Cached per file, setting and build
        (``refresh``: measure anew)."""
        if self._invariance is not None and not refresh:
            return self._invariance
        settings, build = self._invariance_key()
        cached = None if refresh else load_cached(self.target_path, settings, build)
        report = cached[0] if cached else None
        if report is None and measure:
            with self.lock:
                report = measure_model(self.target)
            save_cached(self.target_path, settings, build, report)
        self._invariance = report
        return report

    def diagnosis(self, refresh: bool = False) -> Diagnosis | None:
        """Why the target is not batch-invariant, found by reloading it with each suspect off (cached). Where
        memory holds one copy of the target only, each trial takes its place and the target is loaded again."""
        report = self.invariance()
        if report is None or report.identical:
            return None
        settings, build = self._invariance_key()
        cached = load_cached(self.target_path, settings, build)
        if cached and cached[1] is not None and not refresh:
            return cached[1]

        released = []

        def load(overrides: dict):
            trial = replace(self.settings, **overrides)
            try:
                return load_model(self.target_path, trial, "target")
            except OutOfMemoryError:  # no room for a second copy: the trials take the target's place, and
                if not released:  # nothing computes until it is back
                    self.lock.acquire()
                    self.target.close()
                    released.append(True)
                return load_model(self.target_path, trial, "target")

        try:
            found = diagnose(report, load, suspects(self.target, self.settings), build_facts(self.target))
        finally:
            if released:
                try:
                    self._use_target(load_model(self.target_path, self.settings, "target"), self.settings)
                finally:
                    self.lock.release()
        save_cached(self.target_path, settings, build, report, found)
        return found

    @property
    def invariant_rows(self) -> int | None:
        """The most rows the target's kernels keep batch-invariant (8 on CUDA), or None: no bound (the CPU)."""
        return getattr(self.target, "invariant_rows", None)

    def ensure_invariance(self, options: GenerationOptions, params) -> str | None:
        """Before a reply that needs batch invariance: make the target invariant, or say why it cannot be.

        Greedy and invariant modes promise target-only output token for
        token; that holds only on a batch-invariant target. When it is not,
        the doctor's experiment finds the load setting that breaks it and the
        target is reloaded without it (a one-line note says so and what it
        costs); when nothing helps, a one-line warning names the cause.
        Never silent. Returns the line to show, or ``None``.
        """
        if not needs_invariance(options, params):
            return None
        report = self.invariance()
        if report is None or report.identical:
            return None
        mode = options.mode if options.mode in ("greedy", "invariant") else "greedy"
        diagnosis = self.diagnosis()
        if diagnosis is None or diagnosis.remedy is None:
            return (
                f"warning: {self.target.name} is not batch-invariant on this build (max |diff| "
                f"{report.max_abs_diff:.3g}), so {mode} output may differ from target-only — "
                + (diagnosis.line() if diagnosis else "see `localspec doctor`")
            )
        self._reload_target(diagnosis.remedy)
        self._invariance = diagnosis.remedy_report
        return (
            f"note: {self.target.name} was not batch-invariant ({diagnosis.cause}); reloaded it with "
            f"{diagnosis.turned_off} so {mode} output equals target-only — fix: {diagnosis.fix}"
        )

    def lost_server(self) -> str | None:
        """The RPC server holding target layers that stopped answering (until the target is reloaded), or None."""
        return getattr(self.target, "lost_server", None)

    def _reconnect_target(self) -> None:
        """After an RPC server holding target layers stopped answering (the reply then ended with its name):
        say in one line that it is still down, or reload the target once every server answers again."""
        lost = self.lost_server()
        if lost is None:
            return
        from localspec.app.remote import reconnect

        with self.lock:
            reconnect(lost, self.target.close)
        self._reload_target({})

    def _reload_target(self, overrides: dict) -> None:
        """Swap in the target loaded with ``overrides``; its KV cache starts empty. Where memory cannot hold two
        copies, the old one goes first, with nothing computing meanwhile; if the new one fails alone too, the
        old one is loaded again and the failure raised, so the engine serves as it did."""
        settings = replace(self.settings, **overrides)
        try:
            target = load_model(self.target_path, settings, "target")  # the old target serves meanwhile
        except OutOfMemoryError:
            with self.lock:
                self.target.close()
                try:
                    self._use_target(load_model(self.target_path, settings, "target"), settings)
                except LocalspecError:
                    self._use_target(load_model(self.target_path, self.settings, "target"), self.settings)
                    raise
            return
        with self.lock:
            self._use_target(target, settings)

    def _use_target(self, target, settings) -> None:
        """``target``, loaded with ``settings``, in place of the current one, which is closed (the lock held)."""
        old, self.target, self.settings = self.target, target, settings
        self.drafter = _lookup_on(self.drafter, target)  # prompt lookup reads the new target's vocabulary
        self.decoder = speculative_decoder(self.target, self.target, self.drafter)
        self._target_token_s = None
        self._learned_key = self._remembered()
        old.close()


def _lookup_on(drafter: PolicyDrafter | None, target) -> PolicyDrafter | None:
    """``drafter`` with its prompt lookup reading ``target``'s vocabulary (after the target was reloaded)."""
    if isinstance(drafter, NgramDrafter):
        return NgramDrafter(target)
    if isinstance(drafter, HybridDrafter):
        return HybridDrafter(drafter.drafter, NgramDrafter(target))
    return drafter


def llama_settings(config: Config):
    """llama.cpp's load and context settings from the ``model`` section (shared with the benchmarks)."""
    from localspec.llama.model import LlamaSettings

    model = config.model
    return LlamaSettings(
        n_ctx=model.n_ctx,
        n_batch=model.n_batch,
        threads=model.threads,
        n_gpu_layers=model.n_gpu_layers,
        flash_attention=model.flash_attention,
        use_mmap=model.use_mmap,
        rpc_servers=model.rpc_servers,
        rpc_output=model.rpc_output,
    )


def pair_footprint(config: Config, gpus: tuple = ()) -> tuple[Footprint, Footprint]:
    """What the configured pair takes (on ``gpus``, on the CPU) with the config's context and batch, split over
    ``gpus`` (llama.cpp's devices) as llama.cpp will split it: the doctor's memory lines, before anything loads.
    A target on RPC servers is theirs to hold (the doctor's server lines give their free memory)."""
    from localspec.llama.footprint import footprint
    from localspec.llama.placement import model_layers, offload_plan

    settings = llama_settings(config)
    names = tuple(gpu.name for gpu in gpus)
    on_gpus = on_cpu = Footprint()
    for role, path in config.model_files().items():
        if not path.exists() or (role == "target" and settings.rpc_servers):
            continue
        offload = offload_plan(model_layers(path), settings.n_gpu_layers, names)
        gpu_part, cpu_part = footprint(path, settings.n_ctx, settings.n_batch, offload)
        on_gpus, on_cpu = on_gpus + gpu_part, on_cpu + cpu_part
    return on_gpus, on_cpu


def load_model(path, settings, role: str, on_progress: Callable[[float], None] | None = None):
    """One GGUF model with llama.cpp (imported on first use: config checks and --help never load it)."""
    from localspec.llama.model import LlamaModel

    return LlamaModel(path, settings, role, on_progress)


def hand_over_seconds(samples: int = 2000) -> float:
    """Median seconds of one round trip to llama.cpp's compute thread with nothing to compute: what each
    decode pays besides llama.cpp's own time (docs/design.md, "One compute thread")."""
    import statistics
    import time

    from localspec.llama.runtime import compute

    def nothing() -> None:
        return None

    seconds = []
    for _ in range(samples):
        began = time.perf_counter()
        compute(nothing)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def llama_cpp_default_runs() -> bool:
    """Whether llama.cpp's own tools can run in their default weight placement in this process's environment
    (see :func:`localspec.llama.placement.llama_cpp_default_runs`)."""
    from localspec.llama.placement import llama_cpp_default_runs as runs

    return runs()


def reference_generator(engine: Engine, num_pred_tokens: int = 10):
    """llama-cpp-python's own generation on the engine's target file and settings (the bench's outside reference)."""
    from localspec.llama.reference import ReferenceGenerator

    return ReferenceGenerator(engine.target_path, engine.settings, num_pred_tokens=num_pred_tokens)


def llama_cpp_sampler(temperature: float, seed: int = 0):
    """llama.cpp's own sampler chain at ``temperature`` (the bench times it beside localspec's draw)."""
    from localspec.llama.reference import LlamaCppSampler

    return LlamaCppSampler(temperature, seed)


def _stage(progress: Progress | None, stage: str) -> Callable[[float], None] | None:
    if progress is None:
        return None
    return lambda value: progress(stage, value)
