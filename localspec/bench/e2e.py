"""``localspec bench``: end-to-end tokens per second of every speculative variant on the configured pair.

Why it is built this way:

* **Same run, same machine state.** Speedups are ratios to the target-only
  variant measured *in the same run*, per prompt and repeat, at the same
  temperature (sampling from 151,936 probabilities costs the target alone
  too: a T = 0.7 variant is compared with the target sampling at T = 0.7,
  not with its argmax), and the variants
  are interleaved (A B C … A B C …) so a background process or thermal drift
  hits all of them alike. Medians with min–max, never means.
* **Decode only.** Prompt evaluation is identical for every variant (and
  cached across runs), so rates count generated tokens over the loop's
  draft + verify + other seconds.
* **The performance model (docs/design.md) next to the measurement.** For every run the
  predicted speedup is ``sum_steps E[tokens](alpha, k_step) * t_target /
  decode seconds`` from that run's own acceptance and costs; measured /
  predicted near 1 says the time went where the model says it goes.
* **An outside reference.** ``--reference`` also times llama-cpp-python's own
  high-level generation, alone and with its prompt-lookup ``draft_model``,
  on the same target and prompts.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from localspec.app.config import SpeculativeConfig
from localspec.app.engine import llama_cpp_default_runs, reference_generator
from localspec.app.invariance import cpu_name, llama_build
from localspec.app.remote import server_lines
from localspec.bench.llamacpp import server_configs, start_servers
from localspec.core.errors import ConfigError
from localspec.core.events import GenerationResult, GenerationStats, StepEvent
from localspec.core.options import MAX_DRAFT_TOKENS, GenerationOptions
from localspec.core.perf import expected_tokens, model_speedup, speedup_verdict

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
REFERENCE_TARGET = "llama-cpp-python"
REFERENCE_LOOKUP = "llama-cpp-python-lookup"
SAMPLED_BASELINE = "target-only-sampled"  # the baseline of the variants that sample (T > 0)


@dataclass(frozen=True)
class Variant:
    """One way of generating that the benchmark times."""

    name: str
    label: str
    mode: str
    temperature: float
    drafter: str  # "model", "ngram", "none", "reference" (llama-cpp-python) or "llama.cpp" (llama-server)
    adaptive: bool = False
    lookup: bool = False  # the model drafter also copies from the context where that pays (the hybrid)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("target-only", "target only (T=0)", "target-only", 0.0, "none"),
        Variant(SAMPLED_BASELINE, "target only (T=0.7)", "target-only", 0.7, "none"),
        Variant("greedy", "speculative greedy (T=0)", "greedy", 0.0, "model"),
        Variant("rejection", "rejection T=0.7", "rejection", 0.7, "model"),
        Variant("invariant", "invariant T=0.7", "invariant", 0.7, "model"),
        Variant("token-match", "token-match T=0.7", "token-match", 0.7, "model"),
        Variant("prompt-lookup", "prompt lookup, no draft model (T=0)", "greedy", 0.0, "ngram"),
        Variant("adaptive", "rejection T=0.7, adaptive K", "rejection", 0.7, "model", adaptive=True),
        Variant(
            "hybrid",
            "rejection T=0.7, adaptive model + lookup (default)",
            "rejection",
            0.7,
            "model",
            adaptive=True,
            lookup=True,
        ),
        Variant("hybrid-greedy", "greedy, adaptive model + lookup", "greedy", 0.0, "model", adaptive=True, lookup=True),
    )
}
REFERENCE_VARIANTS = {
    REFERENCE_TARGET: Variant(REFERENCE_TARGET, "llama-cpp-python, target only (T=0)", "target-only", 0.0, "reference"),
    REFERENCE_LOOKUP: Variant(REFERENCE_LOOKUP, "llama-cpp-python prompt lookup (T=0)", "greedy", 0.0, "reference"),
}
_SPECULATIVE_DEFAULTS = SpeculativeConfig()  # the adaptive variants' K range, as config declares it


@dataclass
class BenchSettings:
    """What ``localspec bench`` runs."""

    variants: Sequence[str] = tuple(VARIANTS)
    prompts: Sequence[str] | None = None  # names from prompts.yaml; None = all
    repeats: int = 3
    max_tokens: int = 128
    draft_tokens: int = 4  # K of the fixed-K variants
    # the adaptive variants' range: config's (one declaration; a script's default used to be 1, not 0)
    max_draft_tokens: int = _SPECULATIVE_DEFAULTS.draft_tokens
    min_draft_tokens: int = _SPECULATIVE_DEFAULTS.min_draft_tokens
    temperature: float | None = None  # overrides the T of the sampling variants
    reference: bool = False
    llama_cpp: str | None = None  # bin folder of llama.cpp's own llama-server: time it too
    warmup_tokens: int = 16
    seed: int = 1234

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"unknown bench variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
        if self.repeats < 1:
            raise ConfigError(f"--repeats = {self.repeats} is out of range; allowed: 1 or more")
        if self.max_tokens < 2:
            raise ConfigError(f"--max-tokens = {self.max_tokens} is out of range; allowed: 2 or more")
        for name, value in (("--draft-tokens", self.draft_tokens), ("--max-k", self.max_draft_tokens)):
            if not 1 <= value <= MAX_DRAFT_TOKENS:
                raise ConfigError(f"{name} = {value} is out of range; allowed: 1 to {MAX_DRAFT_TOKENS}")
        if not 0 <= self.min_draft_tokens <= self.max_draft_tokens:
            raise ConfigError(
                f"min_draft_tokens = {self.min_draft_tokens} is out of range; "
                f"allowed: 0 to --max-k ({self.max_draft_tokens})"
            )

    def all_variants(self) -> list[Variant]:
        chosen = [VARIANTS[v] for v in self.variants]
        if self.reference:
            chosen += list(REFERENCE_VARIANTS.values())
        if self.llama_cpp:
            sampled_t = VARIANTS[SAMPLED_BASELINE].temperature
            chosen += [Variant(c.name, f"{c.label} (T={sampled_t:g})", "rejection", sampled_t, "llama.cpp") if c.sampled
                       else Variant(c.name, c.label, "greedy", 0.0, "llama.cpp") for c in server_configs()]  # fmt: skip
        if not any(v.name == "target-only" for v in chosen):
            chosen.insert(0, VARIANTS["target-only"])  # every speedup needs its baseline
        samples = any(v.temperature > 0 and v.drafter != "none" for v in chosen)
        if samples and not any(v.name == SAMPLED_BASELINE for v in chosen):
            chosen.insert(1, VARIANTS[SAMPLED_BASELINE])  # ... at its own temperature
        if self.temperature is not None:
            chosen = [replace(v, temperature=self.temperature, label=v.label.replace(f"T={v.temperature:g}",
                                                                                     f"T={self.temperature:g}"))
                      if v.temperature > 0 else v for v in chosen]  # fmt: skip
        return chosen


def load_prompts(names: Sequence[str] | None = None, path: Path = PROMPTS_FILE) -> list[dict[str, str]]:
    """The fixed prompt set (``name`` and ``prompt``), optionally a subset by name."""
    prompts = yaml.safe_load(path.read_text(encoding="utf-8"))
    if names:
        known = {p["name"] for p in prompts}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"unknown bench prompt {unknown[0]!r}; choose from {', '.join(sorted(known))}")
        prompts = [p for p in prompts if p["name"] in names]
    return prompts


# ----------------------------------------------------------------------
@dataclass
class Measurement:
    """One timed generation: the reply's own counters, plus what the benchmark derives from them."""

    variant: str
    prompt: str
    repeat: int
    stats: GenerationStats
    stop_reason: str = ""
    mean_k: float = 0.0
    expected_tokens: float = 0.0  # sum over steps of E[tokens](alpha, k_step), docs/design.md, Performance model
    speedup: float | None = None
    predicted_speedup: float | None = None
    ceiling_speedup: float | None = None  # the same steps and costs with every draft accepted (acceptance 1)
    reference_speedup: float | None = None  # llama-cpp-python lookup over llama-cpp-python alone

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "stats"}
        return out | self.stats.to_dict()


class Bench:
    """Owns the decoders of every variant on one loaded :class:`~localspec.app.engine.Engine`."""

    def __init__(self, engine, settings: BenchSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.variants = settings.all_variants()
        if any(v.drafter == "model" for v in self.variants) and engine.draft_model is None:
            raise ConfigError(
                f"the draft-model variants need a draft model, but model.draft is {engine.config.model.draft!r}; "
                "pass --draft PATH.gguf or choose --variants target-only,prompt-lookup"
            )
        self.reference = reference_generator(engine, num_pred_tokens=10) if settings.reference else None
        self.base_params = engine.config.sampling.params()
        self.servers = {}
        self.llama_cpp_placement: str | None = None  # where llama-server's weights were, for the report
        if settings.llama_cpp:
            draft = engine.config.resolve_path(engine.config.model.draft) if engine.draft_model is not None else None
            default_runs = llama_cpp_default_runs()
            self.llama_cpp_placement = ("weights in its default placement (extra buffers)" if default_runs
                                        else "weights in plain memory (--no-repack)")  # fmt: skip
            self.servers = start_servers(settings.llama_cpp, server_configs(), engine.target_path, draft,
                                         engine.target.threads, engine.target.context_size, engine.settings.use_mmap,
                                         default_runs, engine.settings.n_gpu_layers)  # fmt: skip
            self.variants = [v for v in self.variants if v.drafter != "llama.cpp" or v.name in self.servers]

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()
        for server in self.servers.values():
            server.close()

    def prompt_tokens(self, text: str) -> list[int]:
        return self.engine.encode_prompt(self.engine.config, [], text).tokens

    def run_one(self, variant: Variant, prompt: str, tokens: list[int], repeat: int, max_tokens: int) -> Measurement:
        """Generate once with ``variant`` and return its counters and timings."""
        if variant.drafter == "reference":
            n, seconds = self.reference.generate(tokens, max_tokens, prompt_lookup=variant.name == REFERENCE_LOOKUP)
            return Measurement(variant.name, prompt, repeat,
                               GenerationStats(mode="reference", n_tokens=n, other_s=seconds),
                               stop_reason="reference")  # fmt: skip
        if variant.drafter == "llama.cpp":
            done = self.servers[variant.name].complete(tokens, max_tokens, self.settings.seed + repeat,
                                                       variant.temperature)  # fmt: skip
            stats = GenerationStats(mode="llama.cpp", drafter=variant.name, n_tokens=done.n_tokens,
                                    other_s=done.decode_s, drafted=done.drafted, accepted=done.accepted)  # fmt: skip
            return Measurement(variant.name, prompt, repeat, stats, stop_reason="llama.cpp")
        s = self.settings
        options = GenerationOptions(
            mode=variant.mode,
            max_tokens=max_tokens,
            draft_tokens=s.max_draft_tokens if variant.adaptive else s.draft_tokens,
            seed=s.seed + repeat,
            adaptive=variant.adaptive,
            min_draft_tokens=s.min_draft_tokens,
            lookup=variant.lookup,
        )
        params = replace(self.base_params, temperature=variant.temperature)
        drafter = "ngram" if variant.drafter == "ngram" else None
        ks: list[int] = []
        result: GenerationResult | None = None
        for event in self.engine.stream(tokens, options, params, drafter=drafter):
            if isinstance(event, StepEvent):
                ks.append(len(event.drafted))
            elif isinstance(event, GenerationResult):
                result = event
        assert result is not None
        mean_k = statistics.fmean(ks) if ks else 0.0
        return Measurement(
            variant.name, prompt, repeat, result.stats, result.stop_reason, mean_k, expected_tokens(result.stats)
        )


def run_bench(
    engine, settings: BenchSettings, progress: Callable[[str, int, int], None] | None = None
) -> dict[str, Any]:
    """Warm up, run every (repeat, prompt, variant) interleaved, and summarise. Returns the JSON report."""
    bench = Bench(engine, settings)
    try:
        prompts = load_prompts(settings.prompts)
        tokens = {p["name"]: bench.prompt_tokens(p["prompt"]) for p in prompts}
        variants = bench.variants
        total = len(variants) + settings.repeats * len(prompts) * len(variants)
        done = 0
        started = time.perf_counter()
        first = prompts[0]["name"]
        for variant in variants:  # warm-up: caches, thread pools, page faults
            if progress:
                progress(f"warm-up {variant.name}", done, total)
            bench.run_one(variant, first, tokens[first], -1, min(settings.warmup_tokens, settings.max_tokens))
            done += 1
        runs: list[Measurement] = []
        for repeat in range(settings.repeats):
            for prompt in prompts:
                name = prompt["name"]
                for variant in variants:
                    if progress:
                        progress(f"{variant.name} · {name} · {repeat + 1}/{settings.repeats}", done, total)
                    runs.append(bench.run_one(variant, name, tokens[name], repeat, settings.max_tokens))
                    done += 1
        if progress:
            progress("done", total, total)
        _attach_speedups(runs, variants)
        return _report(engine, settings, variants, prompts, tokens, runs, time.perf_counter() - started,
                       bench.llama_cpp_placement)  # fmt: skip
    finally:
        bench.close()


def run_from_cli(engine, options: dict[str, Any], progress: Callable[[str, int, int], None] | None = None
                 ) -> tuple[dict[str, Any], str]:  # fmt: skip
    """``localspec bench``: the command line's options in, (JSON report with its plot path, table) out."""
    config = engine.config
    max_k = options["max_k"]
    settings = BenchSettings(
        variants=_names(options["variants"]) or tuple(VARIANTS),
        prompts=_names(options["prompts"]) or None,
        repeats=options["repeats"],
        max_tokens=options["max_tokens"],
        draft_tokens=options["draft_tokens"]
        if options["draft_tokens"] is not None
        else max(1, config.speculative.draft_tokens),
        max_draft_tokens=max_k,
        min_draft_tokens=min(config.speculative.min_draft_tokens, max_k),
        temperature=options["temperature"],
        reference=options["reference"],
        llama_cpp=options.get("llama_cpp"),
    )
    report = run_bench(engine, settings, progress)
    report["plot"] = str(write_plot(report, options["plot_path"]))
    return report, render_table(report)


def _names(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def _attach_speedups(runs: list[Measurement], variants: Sequence[Variant]) -> None:
    """Speedup of every run over the target-only run of the same prompt, repeat and temperature (the T = 0
    one where no target-only run sampled), and its prediction."""
    temperature = {v.name: v.temperature for v in variants}
    baselines = {v.name for v in variants if v.mode == "target-only" and v.drafter == "none"}
    base = {(r.prompt, r.repeat, temperature[r.variant]): r for r in runs if r.variant in baselines}
    ref_base = {(r.prompt, r.repeat): r for r in runs if r.variant == REFERENCE_TARGET}
    for run in runs:
        key = (run.prompt, run.repeat)
        baseline = base.get((*key, temperature.get(run.variant, 0.0)), base.get((*key, 0.0)))
        if baseline is None or baseline.stats.tokens_per_second <= 0:
            continue
        run.speedup = run.stats.tokens_per_second / baseline.stats.tokens_per_second
        t_target = baseline.stats.decode_s / baseline.stats.n_tokens
        if run.stats.steps and run.stats.decode_s > 0:
            run.predicted_speedup = model_speedup(run.expected_tokens, t_target, run.stats.decode_s)
            # at acceptance 1 each step would emit all its k drafts plus one: steps + drafted tokens
            run.ceiling_speedup = model_speedup(run.stats.steps + run.stats.drafted, t_target, run.stats.decode_s)
        elif run.variant == REFERENCE_LOOKUP and (run.prompt, run.repeat) in ref_base:
            ref = ref_base[(run.prompt, run.repeat)]
            run.reference_speedup = (
                run.stats.tokens_per_second / ref.stats.tokens_per_second if ref.stats.tokens_per_second else None
            )


def machine(engine) -> dict[str, Any]:
    """The GPU and CPU the numbers come from and what decides them (the layers offloaded; AMX, AVX-512,
    repacked weights): the same bench differs by 1.5x between CPUs with and without AMX."""
    flags: set[str] = set()
    try:  # Linux lists the CPU's features here; elsewhere the header names the CPU alone
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    models = {"target": engine.target, "draft": engine.draft_model}
    build = llama_build()
    return {
        "gpus": [gpu.line() for gpu in build["gpus"]] if engine.settings.n_gpu_layers != 0 else [],
        "offload": {role: m.placement.offload.describe() for role, m in models.items() if m is not None},
        "cpu": cpu_name(build),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "flags": [f for f in wanted if f in flags],
        "weight_buffers": list(engine.target.weight_buffers),
        "draft_weight_buffers": list(engine.draft_model.weight_buffers) if engine.draft_model is not None else [],
        "draft_rows_per_decode": engine.draft_model.rows_per_decode if engine.draft_model is not None else None,
        "rpc": server_lines(engine.settings.rpc_servers),  # the servers holding target layers, if any
        "target_layers": dict(getattr(engine.target, "layers_by_device", {})),
    }


def _sources(runs: list[Measurement]) -> dict[str, list[int]]:
    """Steps, drafts and accepted drafts per draft source over ``runs`` (which drafter a hybrid used)."""
    total: dict[str, list[int]] = {}
    for run in runs:
        for source, counts in run.stats.by_source.items():
            total[source] = [a + b for a, b in zip(total.get(source, [0, 0, 0]), counts)]
    return total


def _stat(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _variant_row(variant, mine: list[Measurement], settings, prompts) -> dict[str, Any]:
    """One variant's line of the report: its runs' medians and spreads, time split, sources and verdict."""
    decode = sum(r.stats.decode_s for r in mine)
    ratios = [r.speedup / r.predicted_speedup for r in mine if r.speedup and r.predicted_speedup]
    row = {
        "name": variant.name,
        "label": variant.label,
        "mode": variant.mode,
        "temperature": variant.temperature,
        "drafter": variant.drafter,
        "adaptive": variant.adaptive,
        "k": (settings.max_draft_tokens if variant.adaptive else settings.draft_tokens)
        if variant.drafter in ("model", "ngram")
        else 0,
        "runs": len(mine),
        "tokens": sum(r.stats.n_tokens for r in mine),
        "tokens_per_second": _stat([r.stats.tokens_per_second for r in mine]),
        "speedup": _stat([r.speedup for r in mine]),
        "acceptance_rate": _stat([r.stats.acceptance_rate for r in mine if r.stats.drafted]),
        "alpha": _stat([r.stats.alpha for r in mine if r.stats.drafted]),
        "tokens_per_step": _stat([r.stats.tokens_per_step for r in mine if r.stats.steps]),
        "mean_k": _stat([r.mean_k for r in mine if r.stats.steps]),
        "time_split": {
            "draft": sum(r.stats.draft_s for r in mine) / decode if decode else 0.0,
            "verify": sum(r.stats.verify_s for r in mine) / decode if decode else 0.0,
            "other": sum(r.stats.other_s for r in mine) / decode if decode else 0.0,
        }
        if variant.drafter not in ("reference", "llama.cpp")
        else None,
        "predicted_speedup": _stat([r.predicted_speedup for r in mine]),
        "ceiling_speedup": _stat([r.ceiling_speedup for r in mine]),
        "measured_over_predicted": _stat(ratios),
        "by_prompt": {p["name"]: _stat([r.speedup for r in mine if r.prompt == p["name"]]) for p in prompts},
        "by_source": _sources(mine),
    }
    if variant.name == REFERENCE_LOOKUP:
        row["speedup_over_own_target_only"] = _stat([r.reference_speedup for r in mine])
    if row["speedup"]:
        row["verdict"] = speedup_verdict(row["speedup"]["median"], (row["predicted_speedup"] or {}).get("median"))
    return row


def _report(engine, settings, variants, prompts, tokens, runs: list[Measurement], seconds: float,
            llama_cpp_placement: str | None = None) -> dict[str, Any]:  # fmt: skip
    rows = [_variant_row(variant, [r for r in runs if r.variant == variant.name], settings, prompts)
            for variant in variants]  # fmt: skip
    target, draft = engine.target, engine.draft_model
    return {
        "pair": {
            "target": target.name,
            "draft": draft.name if draft is not None else engine.config.model.draft,
            "threads": target.threads,
            "n_ctx": target.context_size,
            "flash_attention": engine.settings.flash_attention,
        },
        "build": {"llama_cpp_python": llama_build()["version"], "system": llama_build()["system_info"]},
        "machine": machine(engine),
        "settings": {
            "repeats": settings.repeats,
            "max_tokens": settings.max_tokens,
            "draft_tokens": settings.draft_tokens,
            "adaptive_range": [settings.min_draft_tokens, settings.max_draft_tokens],
            "prompts": [{"name": p["name"], "tokens": len(tokens[p["name"]])} for p in prompts],
            "order": "interleaved: for each repeat, for each prompt, every variant in turn",
            "llama_cpp_placement": llama_cpp_placement,
        },
        "variants": rows,
        "runs": [r.to_dict() for r in runs],
        "seconds": seconds,
    }


def hardware_line(report: dict[str, Any]) -> str:
    """The table's first line: the GPU (and where each model's layers are), the CPU, the weight buffers."""
    machine_info = report.get("machine", {})
    offload = machine_info.get("offload", {})
    parts = []
    if machine_info.get("rpc"):
        split = " + ".join(f"{device} {n}" for device, n in machine_info.get("target_layers", {}).items())
        parts.append(f"target layers over RPC ({split}): {'; '.join(machine_info['rpc'])} — on one machine the "
                     "servers and the draft share the cores, which a second machine would not")  # fmt: skip
    if machine_info.get("gpus"):
        where = f"target {offload.get('target', '?')}" + (f", draft {offload['draft']}" if "draft" in offload else "")
        parts.append(f"GPU: {', '.join(machine_info['gpus'])}; {where}")
    parts.append(
        f"CPU: {machine_info.get('cpu', '?')}, {machine_info.get('cores', '?')} cores visible, "
        f"{' '.join(machine_info.get('flags', [])) or 'no AVX2/AVX-512/AMX'}"
    )
    buffers = f"target weights in {', '.join(machine_info.get('weight_buffers', [])) or '?'}"
    if machine_info.get("draft_weight_buffers"):
        buffers += f"; draft weights in {', '.join(machine_info['draft_weight_buffers'])}"
        buffers += ", one row per decode" if machine_info.get("draft_rows_per_decode") == 1 else ""
    parts.append(buffers)
    if placement := report["settings"].get("llama_cpp_placement"):
        parts.append(f"llama-server {placement}")
    return "; ".join(parts)


# ----------------------------------------------------------------------
def render_table(report: dict[str, Any]) -> str:
    """The README table (markdown): medians with min–max."""

    def rng(stat, fmt="{:.2f}", suffix=""):
        if not stat:
            return "–"
        return f"{fmt.format(stat['median'])}{suffix} ({fmt.format(stat['min'])}–{fmt.format(stat['max'])})"

    lines = [
        hardware_line(report),
        "",
        "| variant | tok/s | speedup | acceptance | tokens/step | mean K | draft / verify / other | predicted "
        "| at acceptance 1 | measured/predicted |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row in report["variants"]:
        split = row["time_split"]
        split_text = f"{split['draft']:.0%} / {split['verify']:.0%} / {split['other']:.1%}" if split else "–"
        lines.append(
            f"| {row['label']} | {rng(row['tokens_per_second'], '{:.1f}')} | {rng(row['speedup'], '{:.2f}', '×')} | "
            f"{rng(row['acceptance_rate'])} | {rng(row['tokens_per_step'])} | "
            f"{(row['mean_k'] or {}).get('median', 0):.1f} | {split_text} | "
            f"{rng(row['predicted_speedup'], '{:.2f}', '×')} | {rng(row['ceiling_speedup'], '{:.2f}', '×')} | "
            f"{rng(row['measured_over_predicted'], '{:.0%}')} |"
        )
    names = [p["name"] for p in report["settings"]["prompts"]]
    lines += ["", "| speedup by prompt (median) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for row in report["variants"]:
        cells = [f"{s['median']:.2f}×" if (s := row.get("by_prompt", {}).get(n)) else "–" for n in names]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    pair = report["pair"]
    settings = report["settings"]
    lines.append("")
    lines.append(
        f"{pair['target']} + {pair['draft']}, {pair['threads']} threads, {settings['max_tokens']} tokens × "
        f"{len(settings['prompts'])} prompts × {settings['repeats']} repeats, K = {settings['draft_tokens']} "
        f"(adaptive {settings['adaptive_range'][0]}–{settings['adaptive_range'][1]}); "
        f"speedup = tok/s over target-only of the same prompt, repeat and temperature."
    )
    return "\n".join(lines)


def write_plot(report: dict[str, Any], path: str | Path) -> Path:
    """A PNG: speedup per variant (median, min–max bars) and the draft / verify / other split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["variants"] if r["speedup"]]
    labels = [r["name"] for r in rows]
    med = [r["speedup"]["median"] for r in rows]
    lo = [r["speedup"]["median"] - r["speedup"]["min"] for r in rows]
    hi = [r["speedup"]["max"] - r["speedup"]["median"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = ["#888888" if r["drafter"] in ("none", "reference", "llama.cpp") else "#2e7d32" for r in rows]
    ax1.bar(labels, med, yerr=[lo, hi], color=colors, capsize=4)
    pred = [(r["predicted_speedup"] or {}).get("median") for r in rows]
    xs = [i for i, p in enumerate(pred) if p]
    ax1.scatter(xs, [pred[i] for i in xs], marker="_", s=400, color="#1565c0", zorder=3, label="predicted (cost model)")
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("speedup over target-only (median, min–max)")
    ax1.set_title("tokens/s relative to the target alone")
    ax1.legend(loc="lower right", fontsize=8)
    ax1.tick_params(axis="x", rotation=35)
    split_rows = [r for r in rows if r["time_split"]]
    names = [r["name"] for r in split_rows]
    bottom = [0.0] * len(split_rows)
    for key, color in (("draft", "#2e7d32"), ("verify", "#1565c0"), ("other", "#ef6c00")):
        values = [r["time_split"][key] for r in split_rows]
        ax2.bar(names, values, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax2.set_ylabel("share of decode time")
    ax2.set_title("where the time goes (draft decode / target verify / everything else)")
    ax2.legend(fontsize=8)
    ax2.tick_params(axis="x", rotation=35)
    pair = report["pair"]
    fig.suptitle(
        f"{pair['target']} + {pair['draft']} · {pair['threads']} threads · {report['settings']['max_tokens']} tokens"
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out.resolve()
