"""`localspec doctor`: the build, the machine, the pair, and measured batch invariance, as report lines.

The measuring is :mod:`localspec.app.invariance`'s (the engine uses it before
greedy and invariant replies); this module only runs it on the configured
pair and words the result.
"""

from __future__ import annotations

import os

import psutil

from localspec import __version__
from localspec.app.config import Config
from localspec.app.engine import Engine, llama_settings
from localspec.app.invariance import build_stamp, llama_build, measure_model
from localspec.core.errors import LocalspecError


def run_doctor(config: Config) -> list[str]:
    """Human-readable report lines: build, backend, memory, the pair, and measured batch invariance."""
    lines = [f"localspec {__version__}"]
    try:
        build = llama_build()
    except LocalspecError as error:
        return lines + [f"llama.cpp: NOT AVAILABLE — {error}"]
    info = build["system_info"]
    lines.append(f"llama-cpp-python {build['version']}")
    lines.append(f"system info: {info}")
    llamafile = "LLAMAFILE = 1" in info
    lines.append(
        "build flags: llamafile sgemm "
        + ("ON — batched F32/F16 logits are not bit-identical; rebuild with `make install`" if llamafile else "off (GGML_LLAMAFILE=OFF, as intended)")
    )
    lines.append(
        "tiled K-quant matmul: "
        + ("ON (GGML_CPU_TILED_MM) — batches of 8+ rows round differently from single rows; unset it"
           if build["tiled_matmul"] else "off (GGML_CPU_TILED_MM=0, so every batch size computes like one row)")
    )
    stamp = build_stamp()
    if stamp:
        patches = stamp.get("patches") or "none"
        lines.append(f"installed wheel: {stamp.get('wheel', '?')} built with CMAKE_ARGS={stamp.get('cmake_args', '?')!r}, patches: {patches}")
    else:
        lines.append("installed wheel: no build record (not installed by `make install`)")
    backend_name = "CUDA" if "CUDA" in info else "Metal" if "METAL" in info.upper() else "CPU"
    lines.append(f"backend: {backend_name}; GPU offload {'supported' if build['gpu_offload'] else 'not available'}")
    lines.append(
        f"threads: {llama_settings(config).resolved_threads()} (of {os.cpu_count()} logical CPUs); "
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
        report = engine.invariance(refresh=True)  # the doctor measures, never quotes an old measurement
        lines.append("batch invariance (target): " + report.line())
        if engine.draft_model is not None:
            draft_report = measure_model(engine.draft_model)
            lines.append("batch invariance (draft, informational): " + draft_report.line())
        if report.identical:
            lines.append("verdict: greedy and invariant modes reproduce target-only output exactly")
        else:
            diagnosis = engine.diagnosis(refresh=True)
            lines.append(f"cause: {diagnosis.cause}")
            lines.append(f"fix: {diagnosis.fix}")
            lines.append(
                f"verdict: greedy and invariant modes reload the target with {diagnosis.turned_off} "
                "and then reproduce target-only output exactly"
                if diagnosis.remedy
                else "verdict: greedy/invariant output may differ from target-only with this model and build"
            )
    finally:
        engine.close()
    return lines
