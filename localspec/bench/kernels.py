"""``python -m localspec.bench kernels``: what a batch of rows costs, per weight placement, and whether it is invariant.

The speed of speculative decoding is set by two numbers per model — one
token, and a verification batch of K + 1 rows — and exactness by one fact:
the rows of a batch equal the same rows computed alone. Both depend on
where llama.cpp puts the weights (its "extra" buffers, AMX or repacked, or plain
memory), so this loads the model once per placement and, in one run,
interleaves single-token and batch decodes across them (medians, so a
background process hits every placement alike), then measures batch
invariance of each with the doctor's probe.

On the real pair this shows the point of localspec's kernel patches: the
default placement's kernels (repacked, or on AMX builds the AMX buffer with
streamed rows) are both invariant and faster than plain memory, the other
way to invariance.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

ROW_COUNTS = (1, 5, 9)
PLACEMENTS = {"default": None, "plain memory": False}


def measure(path: str, settings, repeats: int, rows: tuple[int, ...]) -> dict[str, dict]:
    """Median seconds per decode of each row count, per placement, interleaved; plus invariance."""
    from localspec.app.engine import load_model
    from localspec.app.invariance import measure_model

    models = {
        name: load_model(path, replace(settings, extra_buffers=extra), "target") for name, extra in PLACEMENTS.items()
    }
    try:
        first = next(iter(models.values()))
        context = first.tokenize("def quicksort(items):\n    if len(items) < 2:\n        return items\n" * 6)
        times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in rows} for name in models}
        for model in models.values():
            model.extend(context, 1)  # the same cached prefix for every placement
        for _ in range(repeats):
            for name, model in models.items():
                for n in rows:
                    keep = len(model.cached_tokens)
                    started = time.perf_counter()
                    model.extend(context[:n], n)
                    times[name][n].append(time.perf_counter() - started)
                    model.truncate(keep)
        report = {}
        for name, model in models.items():
            invariance = measure_model(model)
            report[name] = {
                "buffers": " + ".join(model.weight_buffers),
                "ms": {n: statistics.median(v) * 1000 for n, v in times[name].items()},
                "invariant": invariance.identical,
                "max_abs_diff": invariance.max_abs_diff,
            }
        return report
    finally:
        for model in models.values():
            model.close()


def render(path: str, report: dict[str, dict], rows: tuple[int, ...]) -> str:
    header = (
        "| placement | buffers | "
        + " | ".join(f"{n} row{'s' if n > 1 else ''} (ms)" for n in rows)
        + " | batch-invariant |"
    )
    lines = [f"{path}", "", header, "|" + "---|" * (len(rows) + 3)]
    base = next(iter(report.values()))["ms"]
    for name, entry in report.items():
        cells = [f"{entry['ms'][n]:.1f} ({entry['ms'][n] / base[n]:.2f}×)" for n in rows]
        verdict = "yes" if entry["invariant"] else f"NO (max diff {entry['max_abs_diff']:.3g})"
        lines.append(f"| {name} | {entry['buffers']} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from localspec.app.catalog import resolve_pair, select_pair
    from localspec.app.config import load_config
    from localspec.app.engine import llama_settings

    parser = argparse.ArgumentParser(prog="python -m localspec.bench kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=12, help="decodes per row count and placement")
    parser.add_argument("--model", choices=("target", "draft"), action="append", help="which model(s) of the pair")
    parser.add_argument("--pair", type=str, default=None, help="catalog pair (default: config.yaml's)")
    args = parser.parse_args(argv)
    config = load_config()
    if args.pair:
        config = select_pair(config, args.pair)
    config = resolve_pair(config)
    settings = llama_settings(config)
    for role in args.model or ["target", "draft"]:
        spec = getattr(config.model, role)
        if spec.strip().lower() in ("none", "ngram"):
            continue
        path = str(config.resolve_path(spec))
        print(render(path, measure(path, settings, args.repeats, ROW_COUNTS), ROW_COUNTS), end="\n\n", flush=True)
    return 0
