"""Measure, never assume, batch invariance (DESIGN §5) — and report the build it was measured on.

Greedy speculative output equals target-only output only if the target's
logits for a position are bit-identical whether computed one token at a time
or inside a verification batch. That depends on the build flags, the
backend, flash attention and the weight type, so the doctor measures it on
the configured model and remembers the answer per model file and setting;
``generate`` warns when greedy or invariant mode runs on a pair found
non-invariant.
"""

from __future__ import annotations

import hashlib
import sys
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .model import LanguageModel

PROBE_TEXT = (
    "Speculative decoding must not change a single bit of the output. The quick brown fox jumps over the lazy dog; "
    "a draft proposes, the target verifies, and rejection sampling keeps the distribution exact. "
)
PROBE_BATCH = 5
PAST = 300  # positions beyond 256: flash attention on CPU changes there (measured)


@dataclass
class InvarianceReport:
    """Outcome of comparing logits computed in batches with one-token-at-a-time logits."""

    model: str
    identical: bool
    max_abs_diff: float
    rows_compared: int
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.identical:
            return f"{self.model}: batched and sequential logits are bit-identical ({self.rows_compared} rows; {'; '.join(self.details)})"
        return (
            f"{self.model}: batched and sequential logits DIFFER (max |diff| {self.max_abs_diff:.3g}; "
            f"{'; '.join(self.details)}); greedy/invariant output may differ from target-only"
        )


def probe_tokens(tokenize) -> list[int]:
    """A fixed text long enough to reach past position 256."""
    tokens: list[int] = []
    text = PROBE_TEXT
    while len(tokens) < PAST + PROBE_BATCH + 2:
        tokens = tokenize(text)
        text += PROBE_TEXT
    return tokens


def _sequential_vs_batch(model: LanguageModel, start: int, probe: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """With ``start`` tokens cached: the probe one by one, then as one batch (plus one token after each)."""
    sequential = [model.extend([t], 1)[0] for t in probe]
    sequential.append(model.extend([probe[0]], 1)[0])
    model.truncate(start)
    batched = list(model.extend(probe, len(probe)))
    batched.append(model.extend([probe[0]], 1)[0])
    model.truncate(start)
    return np.stack(sequential), np.stack(batched)


def measure_batch_invariance(model: LanguageModel, tokens: list[int]) -> InvarianceReport:
    """Three comparisons that decide whether speculative and target-only logits can differ.

    1. a verification batch vs one token at a time, early in the context;
    2. the same past position 256 (where CPU flash attention changes);
    3. a prompt evaluated in one batch vs in two chunks (KV reuse across turns).
    One more token is decoded after each batch, so keys/values written inside
    a batch are compared too, not only the batch's own output rows.
    """
    n = min(len(tokens) - PROBE_BATCH - 1, model.context_size - PROBE_BATCH - 2)
    probe = tokens[n : n + PROBE_BATCH]
    diffs: list[tuple[str, float, int]] = []

    model.truncate(0)
    model.extend(tokens[:16], 0)
    a, b = _sequential_vs_batch(model, 16, tokens[16 : 16 + PROBE_BATCH])
    diffs.append(("verify batch at position 16", _diff(a, b), len(a)))

    model.truncate(0)
    whole = model.extend(tokens[: n + 1], 1)
    model.truncate(n)
    a, b = _sequential_vs_batch(model, n, probe)
    diffs.append((f"verify batch at position {n}", _diff(a, b), len(a)))

    model.truncate(0)
    half = (n + 1) // 2
    model.extend(tokens[:half], 0)
    split = model.extend(tokens[half : n + 1], 1)
    diffs.append((f"prompt of {n + 1} in one batch vs two", _diff(whole, split), 1))
    model.truncate(0)

    worst = max(d for _, d, _ in diffs)
    details = [f"{label}: {'identical' if d == 0 else f'max diff {d:.3g}'}" for label, d, _ in diffs]
    return InvarianceReport(getattr(model, "name", "model"), worst == 0.0, worst, sum(r for *_, r in diffs), details)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    if np.array_equal(a, b):
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def cache_dir() -> Path:
    root = os.environ.get("LOCALSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "localspec")
    return Path(root)


def _key(path: Path, settings: dict, build: str) -> str:
    stat = path.stat()
    raw = json.dumps([str(path.resolve()), stat.st_size, int(stat.st_mtime), settings, build], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def load_cached(path: Path, settings: dict, build: str) -> InvarianceReport | None:
    """A previous measurement for this exact file, setting and build, if any."""
    store = cache_dir() / "invariance.json"
    try:
        data = json.loads(store.read_text())
        entry = data.get(_key(path, settings, build))
        return InvarianceReport(**entry) if entry else None
    except (OSError, ValueError, TypeError):
        return None


def save_cached(path: Path, settings: dict, build: str, report: InvarianceReport) -> None:
    store = cache_dir() / "invariance.json"
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(store.read_text()) if store.exists() else {}
        data[_key(path, settings, build)] = asdict(report)
        tmp = store.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(store)
    except (OSError, ValueError):
        pass  # a cache, not a record: never fail a generation over it


def build_stamp() -> dict | None:
    """What `make install` recorded about the llama-cpp-python wheel it installed."""
    stamp = Path(sys.prefix) / "localspec-llama-build.json"
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


def run_doctor(config) -> list[str]:
    """Human-readable report lines: build, backend, memory, the pair, and measured batch invariance."""
    import psutil

    from . import __version__
    from .errors import LocalspecError

    lines = [f"localspec {__version__}"]
    try:
        from . import llama_backend as backend
    except LocalspecError as error:
        return lines + [f"llama.cpp: NOT AVAILABLE — {error}"]
    info = backend.system_info()
    lines.append(f"llama-cpp-python {backend.llama_cpp_version()}")
    lines.append(f"system info: {info}")
    llamafile = "LLAMAFILE = 1" in info
    lines.append(
        "build flags: llamafile sgemm "
        + ("ON — batched F32/F16 logits are not bit-identical; rebuild with `make install`" if llamafile else "off (GGML_LLAMAFILE=OFF, as intended)")
    )
    stamp = build_stamp()
    if stamp:
        lines.append(f"installed wheel: {stamp.get('wheel', '?')} built with CMAKE_ARGS={stamp.get('cmake_args', '?')!r}")
    else:
        lines.append("installed wheel: no build record (not installed by `make install`)")
    backend_name = "CUDA" if "CUDA" in info else "Metal" if "METAL" in info.upper() else "CPU"
    lines.append(f"backend: {backend_name}; GPU offload {'supported' if backend.gpu_offload_supported() else 'not available'}")
    settings = backend.LlamaSettings(threads=config.model.threads)
    lines.append(
        f"threads: {settings.resolved_threads()} (of {os.cpu_count()} logical CPUs); "
        f"flash attention {'on' if config.model.flash_attention else 'off'}; n_ctx {config.model.n_ctx}"
    )
    memory = psutil.virtual_memory()
    sizes = []
    for spec in (config.model.target, config.model.draft):
        if spec.lower() in ("none", "ngram"):
            continue
        path = config.resolve_path(spec)
        if path.exists():
            sizes.append(path.stat().st_size)
    need = sum(sizes)
    verdict = "enough" if memory.available > need * 1.2 else "NOT enough — expect swapping or a failed load"
    lines.append(f"memory: {memory.available / 2**30:.1f} GiB free of {memory.total / 2**30:.1f} GiB; models need {need / 2**30:.2f} GiB: {verdict}")

    from .engine import Engine

    try:
        engine = Engine(config)
    except LocalspecError as error:
        return lines + [f"pair: {error}"]
    try:
        lines.append(f"pair: {engine.pair_name} — compatible")
        for model in (engine.target, engine.draft_model):
            if model is not None:
                rows = "one row per decode" if model.rows_per_decode == 1 else f"up to {model.rows_per_decode} rows per decode"
                lines.append(
                    f"weights ({model.role}): {' + '.join(model.weight_buffers) or '?'} buffers, {rows} — {model.placement.reason}"
                )
        target_settings = {"flash_attention": engine.settings.flash_attention, "threads": engine.target.threads,
                           "n_gpu_layers": engine.settings.n_gpu_layers}  # fmt: skip
        probe = probe_tokens(lambda text: engine.target.tokenize(text, add_special=True, parse_special=False))
        report = measure_batch_invariance(engine.target, probe)
        save_cached(engine.target_path, target_settings, f"{backend.llama_cpp_version()} {info}", report)
        lines.append("batch invariance (target): " + report.line())
        if engine.draft_model is not None:
            draft_report = measure_batch_invariance(engine.draft_model, probe)
            lines.append("batch invariance (draft, informational): " + draft_report.line())
        lines.append(
            "verdict: greedy and invariant modes reproduce target-only output exactly"
            if report.identical
            else "verdict: greedy/invariant output may differ from target-only on this build; "
            "try flash_attention: false and a GGML_LLAMAFILE=OFF build (`make install`)"
        )
    finally:
        engine.close()
    return lines
