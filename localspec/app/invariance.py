"""Measure, never assume, batch invariance (docs/design.md, Batch invariance) — and report the build it was
measured on.

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
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from localspec.app.files import write_atomically
from localspec.core.model import LanguageModel
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams

PROBE_TEXT = (
    "Speculative decoding must not change a single bit of the output. The quick brown fox jumps over the lazy dog; "
    "a draft proposes, the target verifies, and rejection sampling keeps the distribution exact. "
)
PROBE_BATCH = 5
# Verification batch sizes probed early in the context. CPU kernels switch with the number of rows:
# repacked Q4_K goes to a gemv that localspec's patch runs on up to 4 rows at once below 12 rows
# (2, 3, 5 = 4 + 1, 9 = 4 + 4 + 1) and to a gemm in groups of 4 from 12 on (13 = 12 + 1 on the
# gemv, 17 = one block of 16 + 1), Q6_K to a 1-4-row vec_dot below 8 rows and the tiled K-quant
# matmul from 8 on (9, 13, 17 = the largest batch, K = 16 drafts plus one).
PROBE_SIZES = (2, 3, 5, 9, 13, 17)
PAST = 300  # positions beyond 256: flash attention on CPU changes there (measured)


def probe_sizes(model: LanguageModel) -> tuple[int, ...]:
    """The batch sizes to probe: :data:`PROBE_SIZES`, or where the model's kernels bound invariance (its
    ``invariant_rows``, e.g. 8 on CUDA) the sizes up to that bound and the bound itself — localspec never
    verifies more rows at once there when a mode needs invariance."""
    limit = getattr(model, "invariant_rows", None)
    if limit is None:
        return PROBE_SIZES
    return tuple(size for size in PROBE_SIZES if size < limit) + (limit,)


def needs_invariance(options: GenerationOptions, params: SamplingParams) -> bool:
    """Greedy and invariant modes (and any mode at T = 0) promise target-only output token for token, which
    holds only where the target's logits do not depend on the batch they were computed in."""
    return options.mode in ("greedy", "invariant") or params.greedy


def within_invariant_rows(options: GenerationOptions, params: SamplingParams, limit: int | None) -> GenerationOptions:
    """``options`` bounded to ``limit`` rows a verification (``max_rows``; K lowered, lookup's copies too) where
    a mode needs batch invariance and the target's kernels keep it only up to ``limit`` rows (8 on CUDA), so
    that no verification batch (K drafts and one more row) leaves the kernels a single row takes."""
    if limit is None or not needs_invariance(options, params):
        return options
    k = min(options.draft_tokens, limit - 1)
    return replace(options, draft_tokens=k, min_draft_tokens=min(options.min_draft_tokens, k), max_rows=limit)


@dataclass
class InvarianceReport:
    """Outcome of comparing logits computed in batches with one-token-at-a-time logits."""

    model: str
    identical: bool  # every verification batch's rows equal the rows alone: the greedy/invariant promise holds
    max_abs_diff: float
    rows_compared: int
    details: list[str] = field(default_factory=list)
    # a prompt evaluated in one batch against the same in two (0.0: identical). Not part of the promise: a
    # speculative reply and a target-only one continue the same cache; where it differs (llama.cpp's long
    # batches on CUDA), what was cached can change a reply, with a draft or without
    prompt_split_diff: float = 0.0

    def line(self) -> str:
        """One line for the doctor and the UI: the verdict with every comparison's outcome."""
        if self.identical:
            line = (
                f"{self.model}: batched and sequential logits are bit-identical "
                f"({self.rows_compared} rows; {'; '.join(self.details)})"
            )
            if self.prompt_split_diff:
                line += (
                    "; a prompt evaluated whole or in parts differs, so what was cached can change a reply, "
                    "with a draft or without"
                )
            return line
        return (
            f"{self.model}: batched and sequential logits DIFFER (max |diff| {self.max_abs_diff:.3g}; "
            f"{'; '.join(self.details)}); greedy/invariant output may differ from target-only"
        )


def probe_tokens(tokenize) -> list[int]:
    """A fixed text long enough to reach past position 256."""
    tokens: list[int] = []
    text = PROBE_TEXT
    while len(tokens) < PAST + max(PROBE_SIZES) + 2:
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


def row_count_diffs(model: LanguageModel, tokens: list[int], sizes) -> dict[int, float]:
    """Largest |difference| between a batch of each size in ``sizes`` and the same tokens one at a time,
    after 16 cached tokens (0.0: bit-identical, the token decoded after each included)."""
    model.truncate(0)
    model.extend(tokens[:16], 0)
    found = {}
    for size in sizes:
        a, b = _sequential_vs_batch(model, 16, tokens[16 : 16 + size])
        found[size] = _diff(a, b)
    return found


def measure_batch_invariance(model: LanguageModel, tokens: list[int]) -> InvarianceReport:
    """The comparisons that decide whether speculative and target-only logits can differ.

    1. verification batches of every size class vs one token at a time, early in the context;
    2. a batch past position 256 (where CPU flash attention changes);
    3. a prompt evaluated in one batch vs in two chunks (KV reuse across turns): reported, not part of the
       verdict (see :attr:`InvarianceReport.prompt_split_diff`).
    One more token is decoded after each batch, so keys/values written inside
    a batch are compared too, not only the batch's own output rows.
    """
    n = min(len(tokens) - PROBE_BATCH - 1, model.context_size - PROBE_BATCH - 2)
    probe = tokens[n : n + PROBE_BATCH]
    diffs: list[tuple[str, float, int]] = []

    for size, diff in row_count_diffs(model, tokens, probe_sizes(model)).items():
        diffs.append((f"verify batch of {size} at position 16", diff, size + 1))

    model.truncate(0)
    whole = model.extend(tokens[: n + 1], 1)
    model.truncate(n)
    a, b = _sequential_vs_batch(model, n, probe)
    diffs.append((f"verify batch of {PROBE_BATCH} at position {n}", _diff(a, b), len(a)))

    model.truncate(0)
    half = (n + 1) // 2
    model.extend(tokens[:half], 0)
    split = model.extend(tokens[half : n + 1], 1)
    split_diff = _diff(whole, split)
    model.truncate(0)

    worst = max(d for _, d, _ in diffs)
    diffs.append((f"prompt of {n + 1} in one batch vs two", split_diff, 1))
    details = [f"{label}: {'identical' if d == 0 else f'max diff {d:.3g}'}" for label, d, _ in diffs]
    rows = sum(r for *_, r in diffs)
    return InvarianceReport(getattr(model, "name", "model"), worst == 0.0, worst, rows, details, split_diff)


def measure_model(model) -> InvarianceReport:
    """:func:`measure_batch_invariance` of a loaded model on the fixed probe text, tokenized by the model itself."""
    probe = probe_tokens(lambda text: model.tokenize(text, add_special=True, parse_special=False))
    return measure_batch_invariance(model, probe)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    if np.array_equal(a, b):
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


@dataclass
class Diagnosis:
    """Why a target is not batch-invariant, what fixes it, and the load settings under which it is invariant.

    Found by experiment, never guessed: the target is reloaded with each
    suspect turned off (llama.cpp's extra buffer types, whose repacked
    kernels run one row through a gemv and a batch through a gemm; flash
    attention) and measured again. ``remedy`` holds the settings that made
    it invariant (``None`` when nothing localspec can change did).
    """

    cause: str
    fix: str
    remedy: dict[str, bool] | None = None
    remedy_report: InvarianceReport | None = None

    def line(self) -> str:
        return f"cause: {self.cause}; fix: {self.fix}"

    @property
    def turned_off(self) -> str:
        """The remedy in words, e.g. ``extra buffers off and flash attention off``."""
        return " and ".join(f"{name.replace('_', ' ')} off" for name in self.remedy or {})


Loader = Callable[[dict], LanguageModel]  # settings overrides -> a freshly loaded target (closed by the caller)


def diagnose(report: InvarianceReport, load: Loader, suspects: dict[str, bool], facts: dict[str, str]) -> Diagnosis:
    """Find which suspect breaks invariance by turning it off and measuring again.

    ``suspects`` maps a setting to whether it is on now: ``extra_buffers``
    (the weights sit in repacked buffers) and ``flash_attention``. ``facts``
    carries what the messages quote: the weight type, the buffers, whether
    the installed build carries localspec's Q4_K patch, whether llamafile's
    sgemm is compiled in, the devices it computes on and whether RPC servers
    compute some of its layers.
    """
    on = [name for name, active in suspects.items() if active]
    trials = [{name: False} for name in on] + ([{name: False for name in on}] if len(on) > 1 else [])
    for overrides in trials:
        model = load(overrides)
        try:
            trial = measure_model(model)
        finally:
            model.close()
        if trial.identical:
            cause, fix = _explain(overrides, facts)
            return Diagnosis(cause, fix, overrides, trial)
    return _unexplained(report.model, on, facts)


def _unexplained(model: str, on: list[str], facts: dict[str, str]) -> Diagnosis:
    """Where no setting restores invariance: the build's known cause, or what holds on this device until then."""
    weight = facts.get("weight_type", "?")
    if facts.get("tiled") == "on":
        return Diagnosis(
            "llama.cpp's tiled K-quant matmul is on (GGML_CPU_TILED_MM is set): batches of 8 or more rows are "
            "computed by another kernel than single rows",
            "run `make install` (its build makes single rows round like the tiled kernel), or unset "
            "GGML_CPU_TILED_MM (localspec turns it off on a build without that patch) or set it to 0",
        )
    if facts.get("llamafile") == "on":
        return Diagnosis(
            "llamafile's sgemm is compiled into this llama-cpp-python (LLAMAFILE = 1): it computes a batch with "
            "different kernels than a single row",
            "rebuild with `make install` (it builds with -DGGML_LLAMAFILE=OFF)",
        )
    turned_off = " or ".join(name.replace("_", " ") for name in on)
    tried = f"turning {turned_off} off did not make" if on else "no setting made"
    device = facts.get("device", "the CPU")
    until = (
        "greedy and invariant output may differ from target-only where two tokens nearly tie, and rejection mode "
        "(the default) stays exact by its rule"
    )
    if facts.get("int8_matmul") == "on" and device == "the CPU" and facts.get("rpc") != "yes":
        return Diagnosis(
            f"not found: {tried} {model} invariant on this ARM build; with int8 matrix multiplies "
            "(MATMUL_INT8 = 1) llama.cpp's dot products take two rows at a time wherever a batch has an even number "
            "of rows, and those round differently from a row alone",
            'rebuild without them: `make install CMAKE_FLAGS="-DGGML_LLAMAFILE=OFF -DGGML_RPC=ON -DGGML_NATIVE=OFF '
            '-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16"` (batches cost more; greedy and invariant modes then load '
            f"the target without extra buffers by themselves); until then {until}",
        )
    if facts.get("rpc") == "yes":
        return Diagnosis(
            f"not found: {tried} {model} invariant on {device}; each RPC server computes its "
            "layers with its own llama.cpp build and device",
            "run every server from this machine's build (`make install`, then `localspec rpc-server`) on its CPU, "
            f"where a batch computes each row as one row does; until then {until}",
        )
    if device != "the CPU":
        if facts.get("int8_matmul") != "on":  # an ARM CPU with int8 matrix multiplies is not invariant either
            until += "; model.n_gpu_layers: 0 keeps the target on the CPU, where it is invariant"
        if facts.get("cuda_patch") == "yes":
            return Diagnosis(
                f"not found: {tried} {model} invariant on {device}, although this build keeps batches of up "
                "to 8 rows in the kernels of one row (localspec's CUDA patch): a kernel the patch does not cover "
                "computes part of a row",
                f"none known; {until}",
            )
        if "CUDA" not in device:  # Metal, Vulkan, ...: localspec's patch is CUDA's alone
            return Diagnosis(
                f"not found: {tried} {model} invariant on {device}; llama.cpp's kernels there compute a "
                "batch of rows otherwise than one row, and localspec's patches cover NVIDIA's CUDA kernels only",
                f"none known for this backend; {until}",
            )
        return Diagnosis(
            f"not found: {tried} {model} invariant on {device}; llama.cpp's GPU kernels for a "
            "batch of rows are not those for one row (in its CUDA source: quantized matmuls change their reduction "
            "at 5 rows and their kernel above 8, and F16 attention products take the one-row kernel for one row only)",
            "run `make install` on this machine: its CUDA build carries localspec's patch that keeps batches of up "
            f"to 8 rows in the kernels of one row; until then {until}",
        )
    return Diagnosis(
        f"not found: {tried} {model} ({weight}) invariant on this build",
        "none known; greedy and invariant output may differ from target-only with this model — "
        "a Q4_0/Q8_0/F32 or (with localspec's patched build) Q4_K_M copy is invariant on x86 CPUs",
    )


def _explain(overrides: dict[str, bool], facts: dict[str, str]) -> tuple[str, str]:
    weight = facts.get("weight_type", "?")
    causes, fixes = [], []
    if "extra_buffers" in overrides:
        causes.append(
            f"llama.cpp's repacked CPU kernels ({facts.get('buffers', 'CPU_REPACK')} buffers, weights {weight}): "
            "one row goes through a gemv kernel, the rows of a verification batch through a gemm kernel, "
            "and the two round differently"
        )
        if facts.get("patched") == "yes":
            fixes.append(
                "the installed build's patch makes only the x86 Q4_K kernels invariant and this model uses "
                "another repacked kernel; greedy and invariant modes load the target without extra buffers "
                "by themselves (slower), or set LOCALSPEC_EXTRA_BUFFERS=0"
            )
        else:
            fixes.append(
                "run `make install`: it builds llama-cpp-python with localspec's patch (patches/) that makes the "
                "Q4_K kernels invariant at no cost in speed; until then greedy and invariant modes load the "
                "target without extra buffers by themselves (slower), or set LOCALSPEC_EXTRA_BUFFERS=0"
            )
    if "flash_attention" in overrides:
        device = facts.get("device", "the CPU")
        causes.append("flash attention (on CPU it changes batched logits past position 256)" if device == "the CPU"
                      else f"flash attention (its kernels on {device} change with the number of rows)")  # fmt: skip
        fixes.append("set model.flash_attention: false (greedy and invariant modes turn it off by themselves)")
    return " together with ".join(causes), "; ".join(fixes)


def cache_dir() -> Path:
    root = os.environ.get("LOCALSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "localspec")
    return Path(root)


def _key(path: Path, settings: dict, build: str) -> str:
    stat = path.stat()
    raw = json.dumps([str(path.resolve()), stat.st_size, int(stat.st_mtime), settings, build], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def load_cached(path: Path, settings: dict, build: str) -> tuple[InvarianceReport, Diagnosis | None] | None:
    """A previous measurement (and diagnosis, if one was made) for this exact file, setting and build."""
    store = cache_dir() / "invariance.json"
    try:
        entry = json.loads(store.read_text()).get(_key(path, settings, build))
        if not entry:
            return None
        diagnosis = entry.get("diagnosis")
        if diagnosis is not None:
            remedy_report = diagnosis.pop("remedy_report", None)
            diagnosis = Diagnosis(
                **diagnosis, remedy_report=InvarianceReport(**remedy_report) if remedy_report else None
            )
        return InvarianceReport(**entry["report"]), diagnosis
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save_cached(
    path: Path, settings: dict, build: str, report: InvarianceReport, diagnosis: Diagnosis | None = None
) -> None:
    store = cache_dir() / "invariance.json"
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(store.read_text()) if store.exists() else {}
        data[_key(path, settings, build)] = {
            "report": asdict(report),
            "diagnosis": asdict(diagnosis) if diagnosis else None,
        }
        write_atomically(store, json.dumps(data, indent=1))
    except (OSError, ValueError):
        pass  # a cache, not a record: never fail a generation over it


def llama_build() -> dict[str, Any]:
    """The installed llama.cpp: version, feature line, tiled matmul, GPU offload and devices, wheel record (what the
    doctor prints)."""
    from localspec.llama import runtime

    return {
        "version": runtime.llama_cpp_version(),
        "system_info": runtime.system_info(),
        "tiled_matmul": runtime.tiled_matmul_enabled(),
        "gpu_offload": runtime.gpu_offload_supported(),
        "devices": runtime.devices(),  # every device llama.cpp sees (the CPU included)
        "gpus": runtime.offload_devices(),  # those it offloads layers to
        "tiled_invariant": runtime.tiled_matmul_invariant(),
        "patches": runtime.build_patches(),  # localspec's patches, as the library announces them
        "stamp": runtime.build_stamp() or {},  # what `make install` recorded about the wheel
    }


def cpu_name(build: dict[str, Any] | None = None) -> str:
    """The CPU's model name as llama.cpp's CPU device gives it (read from the system's own record on Linux,
    macOS and Windows alike), else Python's guess: the one name the doctor, the bench and the GPU report show."""
    found = (build or llama_build())["devices"]
    cpu = next((device for device in found if device.kind == "CPU" and device.description not in ("", "?")), None)
    return cpu.description if cpu else platform.processor() or platform.machine()


def build_id() -> str:
    """What a measurement depends on besides the model: library version, features, flags and patches."""
    build = llama_build()
    stamp = build["stamp"]
    tiled = "tiled" if build["tiled_matmul"] else "untiled"
    return f"{build['version']} {build['system_info']} {stamp.get('wheel', '')} {stamp.get('patch_hash', '')} {tiled}"


def build_facts(model) -> dict[str, str]:
    """What :func:`diagnose` quotes about a loaded target and the installed build."""
    from localspec.llama import runtime

    build = llama_build()
    offload = model.placement.offload
    return {
        "device": offload.computed_on,  # where the target computes
        "rpc": "yes" if model.rpc_servers else "no",  # some of its layers are computed by RPC servers
        "weight_type": model.description,
        "buffers": " + ".join(model.weight_buffers) or "?",
        "patched": "yes" if "q4k_gemv_batch_invariant" in build["patches"] else "no",
        "cuda_patch": "yes" if runtime.CUDA_PATCH in build["patches"] else "no",
        "llamafile": "on" if "LLAMAFILE = 1" in build["system_info"] else "off",
        "int8_matmul": "on" if "MATMUL_INT8 = 1" in build["system_info"] else "off",  # ARM's i8mm: rows in pairs
        "tiled": ("patched" if build["tiled_invariant"] else "on") if build["tiled_matmul"] else "off",
    }


def suspects(model, settings) -> dict[str, bool]:
    """Load settings that can break invariance and whether each is in effect for ``model``."""
    from localspec.llama.runtime import cpu_extra_buffer_types

    repacked = any(kind in cpu_extra_buffer_types() for kind in model.weight_buffers)  # AMX, CPU_REPACK; not a GPU's
    return {
        "extra_buffers": bool(model.placement.extra_buffers and repacked),
        "flash_attention": bool(settings.flash_attention),
    }
