"""`localspec doctor`: the build, the machine, the pair, and measured batch invariance, as report lines.

The measuring is :mod:`localspec.app.invariance`'s (the engine uses it before
greedy and invariant replies); this module only runs it on the configured
pair and words the result.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import psutil

from localspec import __version__
from localspec.app.config import Config
from localspec.app.engine import Engine, Footprint, llama_settings, pair_footprint
from localspec.app.invariance import cpu_name, llama_build, measure_model
from localspec.app.remote import server_lines
from localspec.core.errors import LocalspecError


def run_doctor(config: Config) -> list[str]:
    """Human-readable report lines: build, backend, memory, the pair, and measured batch invariance."""
    lines = [f"localspec {__version__}"]
    try:
        build = llama_build()
    except LocalspecError as error:
        return lines + [f"llama.cpp: NOT AVAILABLE — {error}"]
    return lines + build_lines(build) + machine_lines(config, build) + pair_lines(config)


def build_lines(build: dict) -> list[str]:
    """The installed llama.cpp: version, features, the two flags batch invariance depends on, the wheel."""
    info = build["system_info"]
    llamafile = "LLAMAFILE = 1" in info
    lines = [
        f"llama-cpp-python {build['version']}",
        f"system info: {info}",
        "build flags: llamafile sgemm "
        + (
            "ON — batched F32/F16 logits are not bit-identical; rebuild with `make install`"
            if llamafile
            else "off (GGML_LLAMAFILE=OFF, as intended)"
        ),
        "tiled K-quant matmul: " + _tiled_line(build),
    ]
    lines.append("localspec patches in the library: " + (" ".join(build["patches"]) or "none (a stock build)"))
    stamp = build["stamp"]
    if stamp:
        lines.append(
            f"installed wheel: {stamp.get('wheel', '?')} built with CMAKE_ARGS={stamp.get('cmake_args', '?')!r}"
        )
    else:
        lines.append("installed wheel: no build record (not installed by `make install`)")
    return lines


def _tiled_line(build: dict) -> str:
    if not build["tiled_matmul"]:
        return "off (GGML_CPU_TILED_MM=0, so every batch size computes like one row)"
    if build["tiled_invariant"]:
        return (
            "on for Q4_K, Q5_K and Q6_K, whose single rows localspec's patch rounds like it "
            "(cheaper batches of 8+ rows)"
        )
    return "ON (GGML_CPU_TILED_MM) — batches of 8+ rows round differently from single rows; unset it"


def machine_lines(config: Config, build: dict) -> list[str]:
    """Backend and devices, threads, and whether the memory the models load into holds them."""
    gpus = build["gpus"] if config.model.n_gpu_layers != 0 else ()
    on_gpus, on_cpu = pair_footprint(config, gpus)
    return [
        *server_lines(config.model.rpc_servers),
        backend_line(build, gpus, config.model.n_gpu_layers, () if build["gpu_offload"] else nvidia_gpus()),
        f"threads: {llama_settings(config).resolved_threads()} (of {os.cpu_count()} logical CPUs); "
        f"flash attention {'on' if config.model.flash_attention else 'off'}; n_ctx {config.model.n_ctx}",
        *memory_lines(
            on_gpus,
            on_cpu,
            gpus,
            config.model.n_ctx,
            "the draft (the target is on RPC servers)" if config.model.rpc_servers else "the pair",
        ),
    ]


def backend_line(build: dict, gpus: tuple, n_gpu_layers: int, unused_gpus: tuple[str, ...] = ()) -> str:
    """Where the models compute: the GPUs llama.cpp offloads to (named, with their memory), or the CPU and why
    (``unused_gpus``: NVIDIA GPUs the machine has that a build without CUDA leaves idle)."""
    if gpus:
        layers = "all layers" if n_gpu_layers < 0 else f"up to {n_gpu_layers} layers (model.n_gpu_layers)"
        return f"backend: {gpus[0].backend} — {', '.join(gpu.line() for gpu in gpus)}; {layers} offloaded"
    where = f" ({cpu_name(build)})"
    if not build["gpu_offload"] and unused_gpus:
        return (
            f"backend: CPU{where}; this build has no GPU backend, but this machine has {', '.join(unused_gpus)}: "
            "it was built without a CUDA compiler (nvcc). Install the CUDA toolkit, then run `make install`, which "
            "finds nvcc on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin and builds with CUDA"
        )
    if not build["gpu_offload"]:
        return f"backend: CPU{where}; this build has no GPU backend"
    if n_gpu_layers == 0:
        return f"backend: CPU{where}; GPU offload off (model.n_gpu_layers: 0)"
    return f"backend: CPU{where}; this build can offload to a GPU but llama.cpp found none"


def nvidia_gpus() -> tuple[str, ...]:
    """The NVIDIA GPUs ``nvidia-smi -L`` lists by name ("NVIDIA GeForce RTX 4090"); none where it is absent."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID:.*)?$", listed, re.MULTILINE))


FIT_MARGIN = 1.1  # free memory must exceed the estimate by this much: the estimate is of llama.cpp's buffers alone


def memory_lines(on_gpus: Footprint, on_cpu: Footprint, gpus: tuple, n_ctx: int, what: str = "the pair") -> list[str]:
    """Whether ``what`` fits: what its GPUs hold in their free memory, and what stays on the CPU (everything,
    without a GPU; blocks left there, with fewer layers offloaded) in free RAM."""

    def need(part: Footprint) -> str:
        return (f"{what} needs about {part.total / 2**30:.2f} GiB (weights {part.weights / 2**30:.2f}, KV cache of "
                f"{n_ctx:,} tokens {part.kv_cache / 2**30:.2f}, compute {part.compute / 2**30:.2f})")  # fmt: skip

    lines = []
    if gpus:
        free = sum(gpu.free_bytes for gpu in gpus)
        fits = free > on_gpus.total * FIT_MARGIN
        verdict = (
            "enough" if fits else "NOT enough — lower model.n_gpu_layers to keep layers on the CPU, or model.n_ctx"
        )
        names = " + ".join(gpu.name for gpu in gpus)
        lines.append(f"GPU memory: {free / 2**30:.1f} GiB free on {names}; {need(on_gpus)} there: {verdict}")
    if not gpus or on_cpu.kv_cache or on_cpu.compute:  # blocks, with their cache, or the output stay on the CPU
        memory = psutil.virtual_memory()
        fits = memory.available > on_cpu.total * FIT_MARGIN
        verdict = "enough" if fits else "NOT enough — expect swapping or a failed load"
        where = "; on the CPU " if gpus else "; "
        lines.append(f"memory: {memory.available / 2**30:.1f} GiB free of {memory.total / 2**30:.1f} GiB{where}"
                     f"{need(on_cpu)}: {verdict}")  # fmt: skip
    return lines


def weights_line(model) -> str:
    """Where one model's weights went: each buffer with its size, rows per decode, and why."""
    rows = "one row per decode" if model.rows_per_decode == 1 else f"up to {model.rows_per_decode} rows per decode"
    if getattr(model, "one_row_up_to", 0):
        rows += f" (up to {model.one_row_up_to} tokens one row at a time: one graph for every decode)"
    buffers = " + ".join(f"{name} {mib:,.0f} MiB" for name, mib in model.weight_buffer_mib.items()) or "?"
    split = getattr(model, "layers_by_device", {})
    layers = f"; layers {' + '.join(f'{device} {n}' for device, n in split.items())}" if len(split) > 1 else ""
    return f"weights ({model.role}): {buffers}{layers}, {rows} — {model.placement.reason}"


def context_line(model) -> str:
    """Where one model's context went, as llama.cpp allocated it: its KV cache and compute buffers by device."""
    parts = [
        f"{'KV cache' if kind == 'KV' else kind} " + " + ".join(f"{name} {mib:,.0f} MiB" for name, mib in sizes.items())
        for kind, sizes in model.context_buffer_mib.items()
    ]
    return f"context ({model.role}): {', '.join(parts) or '?'} ({model.context_size:,} tokens)"


def pair_lines(config: Config) -> list[str]:
    """Load the pair; where each model's weights went; batch invariance, measured now, with its cause and fix."""
    try:
        engine = Engine(config)
    except LocalspecError as error:
        return [f"pair: {error}"]
    try:
        lines = [f"pair: {engine.pair_name} — compatible"]
        for model in (engine.target, engine.draft_model):
            lines += [weights_line(model), context_line(model)] if model is not None else []
        report = engine.invariance(refresh=True)  # the doctor measures, never quotes an old measurement
        where = engine.target.placement.offload.computed_on
        lines.append("batch invariance (target): " + report.line())
        if engine.draft_model is not None:
            lines.append("batch invariance (draft, informational): " + measure_model(engine.draft_model).line())
        if report.identical:
            exact = "verdict: greedy and invariant modes reproduce target-only output exactly"
            return lines + [f"{exact} (measured on {where})"]
        diagnosis = engine.diagnosis(refresh=True)
        verdict = (
            f"verdict: greedy and invariant modes reload the target with {diagnosis.turned_off} "
            "and then reproduce target-only output exactly"
            if diagnosis.remedy
            else "verdict: greedy/invariant output may differ from target-only with this model and build (measured "
            f"on {where}); rejection mode stays exact by its rule"
        )
        return lines + [f"cause: {diagnosis.cause}", f"fix: {diagnosis.fix}", verdict]
    finally:
        engine.close()
