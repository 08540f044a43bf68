"""``python -m localspec.bench gpu``: what localspec does on the device it runs on, measured, as one report.

Made for a lent GPU (``gpu/check.sh`` runs it there), and it runs the same on a CPU. For each model given
(random weights of real shapes from ``gpu/randgguf.py``, or real files): where its weights went, the cost of
a decode of 1 to 32 rows, and whether a batch of each size from 2 to 17 computes its rows bit for bit as one
row at a time. From those costs, the speedup the performance model (docs/design.md) predicts for drafting
with the draft model and with prompt lookup at the real pair's measured acceptance. Then end to end through
the engine on each pair given: target-only against the default and greedy speculation (tokens per second,
the loop's own share of the time, measured over predicted), where the loop's own time goes (one reply of
each under cProfile), and greedy output against target-only token for token at fixed K. Given llama.cpp's
``llama-bench`` from the same build, its decode rate on each model.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from localspec.app.config import Config
from localspec.app.engine import Engine, hand_over_seconds, llama_settings, load_model
from localspec.app.invariance import (
    cpu_name,
    llama_build,
    measure_model,
    probe_tokens,
    row_count_diffs,
    within_invariant_rows,
)
from localspec.core.events import StepEvent
from localspec.core.options import GenerationOptions
from localspec.core.perf import best_draft_length
from localspec.core.sampling import SamplingParams

COST_ROWS = tuple(range(1, 18)) + (32,)  # every verification batch of K = 0..16, and one large batch
# decoded again and again at one size: llama.cpp reuses its compute graph only for a decode with the row count
# of the one before (llama-graph.cpp, can_reuse), which the interleaved sweep over COST_ROWS never has
STEADY_ROWS = (1, 5, 9)
INVARIANCE_ROWS = tuple(range(2, 18))
# Mean sum min(p, q) of the real pair (Qwen2.5-Coder 1.5B target, 0.5B Q4_0 draft) on the target's own
# replies to the bench's prompts at T = 0.7, per prompt (docs/performance.md, "The draft proposes from its head").
REAL_PAIR_ACCEPTANCE = {"chat": 0.657, "essay": 0.634, "code": 0.886, "summarise": 0.822, "edit": 0.983}
CONTEXT_TEXT = "def quicksort(items):\n    if len(items) < 2:\n        return items\n    pivot = items[0]\n" * 12


def model_facts(label: str, path: str, settings, repeats: int) -> dict[str, Any]:
    """One model: load time, buffers, the GPU split, decode costs by row count (medians, interleaved), and the
    largest difference between a batch and the same rows one at a time, by batch size."""
    started = time.perf_counter()
    model = load_model(path, settings, "draft" if label.startswith("draft") else "target")
    load_s = time.perf_counter() - started
    try:
        context = model.tokenize(CONTEXT_TEXT)  # the depth every decode below follows
        model.extend(context, 1)
        keep = len(model.cached_tokens)

        def decode_seconds(rows: int) -> float:
            """One decode of ``rows`` rows after the context, which is then restored."""
            began = time.perf_counter()
            model.extend(context[:rows], rows)
            seconds = time.perf_counter() - began
            model.truncate(keep)
            return seconds

        times: dict[int, list[float]] = {rows: [] for rows in COST_ROWS}
        for repeat in range(repeats + 1):  # the first round warms up every size and is not kept
            for rows in COST_ROWS:
                seconds = decode_seconds(rows)
                if repeat:
                    times[rows].append(seconds)
        # the first of each size builds the graph the others reuse
        steady = {rows: [decode_seconds(rows) for _ in range(4 * repeats + 1)][1:] for rows in STEADY_ROWS}
        tokens = probe_tokens(lambda text: model.tokenize(text, add_special=True, parse_special=False))
        diffs = row_count_diffs(model, tokens, INVARIANCE_ROWS)
        probe = measure_model(model)
        return {
            "label": label,
            "path": str(path),
            "description": model.description,
            "size_mib": model.size_bytes / 2**20,
            "load_s": load_s,
            "buffers": model.weight_buffer_mib,
            "placement": model.placement.reason,
            "ms": {rows: statistics.median(values) * 1000 for rows, values in times.items()},
            "ms_steady": {rows: statistics.median(values) * 1000 for rows, values in steady.items()},
            "depth": len(context),
            "batch_diff": diffs,
            "probe": probe.line(),
            "probe_identical": probe.identical,
        }
    finally:
        model.close()


def predictions(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: the best K and its predicted speedup for the draft model (its one-row cost per drafted
    token) and for lookup (drafting free) at each prompt's acceptance, from the measured costs alone. The
    target alone and the draft decode one row after another, so their graph is reused (the steady one-row
    costs; a draft on CUDA reads its catch-ups one row at a time for that); a verification follows a decode of
    another size (its costs after one)."""
    drafts = [m for m in models if m["label"].startswith("draft")]
    rows = []
    for target in (m for m in models if m["label"].startswith("target")):
        verify = {n: ms / 1000 for n, ms in target["ms"].items() if n <= 17}
        t_target = verify[1] = target["ms_steady"][1] / 1000
        for drafter, t_draft in [(d["label"], d["ms_steady"][1] / 1000) for d in drafts] + [("lookup", 0.0)]:
            cells = {
                name: best_draft_length(alpha, t_draft, verify, t_target)
                for name, alpha in REAL_PAIR_ACCEPTANCE.items()
            }
            rows.append(
                {"target": target["label"], "drafter": drafter, "cost_ratio": t_draft / t_target, "best": cells}
            )
    return rows


def llama_bench(binary: str, path: str, n_gpu_layers: int, depth: int) -> dict[str, Any]:
    """llama.cpp's own decode rate on ``path`` (``llama-bench -p 0 -n 128``, three repetitions), same build,
    after ``depth`` cached tokens: attention's cost grows with them, so it is compared at localspec's depth."""
    command = [
        binary,
        "-m",
        path,
        "-p",
        "0",
        "-n",
        "128",
        "-d",
        str(depth),
        "-r",
        "3",
        "-ngl",
        str(999 if n_gpu_layers < 0 else n_gpu_layers),
        "-fa",
        "0",
        "-o",
        "json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    result = json.loads(done.stdout)[0]
    return {
        "tokens_per_second": result["avg_ts"],
        "stddev": result["stddev_ts"],
        "backends": result.get("backends", ""),
    }


def identity(engine: Engine, prompts: list[dict], max_tokens: int) -> list[dict[str, Any]]:
    """Greedy speculation at fixed K (batches of 5 and 9 rows, or as many as the target keeps invariant:
    8 on CUDA) against target-only, token for token."""
    greedy = SamplingParams(temperature=0.0)
    found = []
    for prompt in prompts:
        tokens = engine.encode_prompt(engine.config, [], prompt["prompt"]).tokens
        alone = _reply(engine, tokens, greedy, engine.options(mode="target-only", max_tokens=max_tokens))
        for asked in (4, 8):
            options = engine.options(
                mode="greedy", max_tokens=max_tokens, draft_tokens=asked, adaptive=False, lookup=False
            )
            k = within_invariant_rows(options, greedy, engine.invariant_rows).draft_tokens  # what the reply runs
            reply = _reply(engine, tokens, greedy, options)
            same = next((i for i, (a, b) in enumerate(zip(alone, reply)) if a != b), None)
            found.append(
                {
                    "prompt": prompt["name"],
                    "k": k,
                    "tokens": len(alone),
                    "identical": reply == alone,
                    "first_difference": same,
                }
            )
    return found


def _reply(engine: Engine, tokens: list[int], params: SamplingParams, options: GenerationOptions) -> list[int]:
    return list(list(engine.stream(tokens, options, params))[-1].token_ids)


def loop_profile(engine: Engine, prompt: dict, max_tokens: int, top: int = 12) -> list[dict[str, Any]]:
    """Where the loop's own time goes: one reply of the target alone and one of the default, both at
    T = 0.7, under cProfile after a short warm-up reply; the functions with the most time of their own, in
    ms a step. Waiting for the compute thread (a lock's acquire) is llama.cpp's time and left out.
    cProfile slows Python down about twofold, and charges the hand-over of the GIL to whatever runs: the
    ranking is the finding, not the level. So a reply without the profiler comes first, its steps' own
    split in ms a step (``split``: plan, draft, llama_decode until the device is done, the rest); the target
    alone's entry also has it at T = 0 (``split_greedy``: no sampler). The default's entry also lists
    what it spends a step beyond the target alone, function by function (``extra``)."""
    tokens = engine.encode_prompt(engine.config, [], prompt["prompt"]).tokens
    params = SamplingParams(temperature=0.7)
    found = []
    by_function: list[dict[str, float]] = []  # ms a step of each function, per variant
    for variant, overrides in (("target-only", {"mode": "target-only"}), ("default", {})):
        for _ in engine.stream(tokens, engine.options(max_tokens=8, **overrides), params):
            pass  # warm: a first reply's one-offs (imports, the costs timed before the first adaptive step)
        split = _step_split(engine.stream(tokens, engine.options(max_tokens=max_tokens, **overrides), params))
        greedy = SamplingParams(temperature=0.0)
        split_greedy = (_step_split(engine.stream(tokens, engine.options(max_tokens=max_tokens, **overrides), greedy))
                        if variant == "target-only" else None)  # fmt: skip
        profile, steps = cProfile.Profile(), 0
        profile.enable()
        for event in engine.stream(tokens, engine.options(max_tokens=max_tokens, **overrides), params):
            steps += isinstance(event, StepEvent)
        profile.disable()
        own = [(row[2], f"{Path(where[0]).name}:{where[1]} {where[2]}")
               for where, row in pstats.Stats(profile).stats.items() if "acquire" not in where[2]]  # fmt: skip
        per_step = 1000 / max(1, steps)
        found.append({"variant": variant, "prompt": prompt["name"], "steps": steps, "split": split,
                      "split_greedy": split_greedy,
                      "ms_per_step": sum(t for t, _ in own) * per_step,
                      "functions": [(name, t * per_step) for t, name in sorted(own, reverse=True)[:top]]})  # fmt: skip
        by_function.append({name: t * per_step for t, name in own})
    alone, default = by_function
    extra = {name: ms - alone.get(name, 0.0) for name, ms in default.items()}
    found[1]["extra"] = sorted(extra.items(), key=lambda item: -item[1])[:top]
    return found


def _step_split(events) -> dict[str, float]:
    """A reply's steps, mean ms a step: all of it, the plan, the draft model, llama_decode, and the rest
    (the wait for the logits, sampling, the loop's Python)."""
    steps = [event for event in events if isinstance(event, StepEvent)]
    n = max(1, len(steps))
    parts = {
        "plan": sum(step.plan_s for step in steps),
        "draft": sum(step.draft_s for step in steps),
        "verify": sum(step.verify_s for step in steps),
        "other": sum(step.other_s - step.plan_s for step in steps),
    }
    return {"step": sum(parts.values()) * 1000 / n} | {name: s * 1000 / n for name, s in parts.items()}


def end_to_end(config: Config, repeats: int, max_tokens: int, prompt_names: list[str],
               llama_cpp: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The bench's variants (target-only, default, greedy, lookup, and a fixed K: every verification one size, so
    llama.cpp reuses its graph, against the default's K that changes) and the identity check on one pair; with
    ``llama_cpp`` (a bin folder) llama-server's target alone at T = 0 and 0.7 and its speculative modes too."""
    from localspec.bench.e2e import BenchSettings, load_prompts, render_table, run_bench

    engine = Engine(config)
    try:
        settings = BenchSettings(
            variants=("target-only", "hybrid", "rejection", "hybrid-greedy", "prompt-lookup"),
            prompts=prompt_names,
            repeats=repeats,
            max_tokens=max_tokens,
            draft_tokens=config.speculative.draft_tokens,
            llama_cpp=llama_cpp,
        )
        report = run_bench(engine, settings)
        return {
            "pair": engine.pair_name,
            "table": render_table(report),
            "report": report,
            "learned": _learned(engine),
            "identity": identity(engine, load_prompts(prompt_names), max_tokens),
            "profile": loop_profile(engine, load_prompts(prompt_names)[0], max_tokens),
        }
    finally:
        engine.close()


def _learned(engine: Engine) -> list[dict[str, Any]]:
    """What each adaptive controller learnt over the bench (ms): a change of batch size, the verification
    sizes decode after decode, a drafted token."""
    out = []
    for (mode, temperature, *_), learned in engine.decoder.policy.learned().items():
        costs = learned.costs
        out.append({
            "mode": f"{mode}, T = {temperature:g}",
            "switch_ms": costs.switch_s * 1e3 if costs.switch_s is not None else None,
            "verify_ms": {rows: seconds * 1e3 for rows, seconds in sorted(costs.verify_s.items()) if rows <= 9},
            "draft_ms": costs.draft_token_s * 1e3 if costs.draft_token_s is not None else None,
        })  # fmt: skip
    return out


def render(result: dict[str, Any]) -> str:
    """The markdown report: one section per stage, in the order they are measured."""
    lines = _header(result) + _placement(result["models"]) + _costs(result["models"])
    lines += _invariance(result["models"]) + _against_llama_bench(result) + _predictions(result["predictions"])
    for e2e in result.get("end_to_end", []):
        lines += _end_to_end(e2e)
    for note in result.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _header(result: dict[str, Any]) -> list[str]:
    build = result["build"]
    stamp = build["stamp"] or {}
    return [
        f"# localspec on {result['device']}",
        "",
        f"Measured {result['date']} by `{result['command']}` (`gpu/check.sh`).",
        "",
        f"- device: {result['device']}; host CPU: {result['cpu']}",
        f"- a round trip to llama.cpp's compute thread (each decode pays one): {result['hand_over_us']:.0f} µs",
        f"- llama-cpp-python {build['version']}, CMAKE_ARGS {stamp.get('cmake_args', '?')!r}, "
        f"patches {stamp.get('patch_hash', '?')}",
        f"- llama.cpp: {build['system_info']}",
    ]


def _placement(models: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Where the weights went",
        "",
        "| model | file | load | buffers | placement |",
        "|---|---|---:|---|---|",
    ]
    for m in models:
        buffers = " + ".join(f"{name} {mib:,.0f} MiB" for name, mib in m["buffers"].items())
        file = f"{m['description']}, {m['size_mib']:,.0f} MiB"
        lines.append(f"| {m['label']} | {file} | {m['load_s']:.1f} s | {buffers} | {m['placement']} |")
    return lines


def _costs(models: list[dict[str, Any]]) -> list[str]:
    """Each size after a decode of another size, then a few sizes decode after decode (the graph reused)."""
    shown = (1, 2, 4, 5, 8, 9, 16, 17, 32)
    lines = [
        "",
        "## A decode of n rows (ms, median)",
        "",
        "| model | " + " | ".join(str(n) for n in shown) + " | 9 rows / 1 row |",
        "|---|" + "---:|" * (len(shown) + 1),
    ]
    for m in models:
        ms = m["ms"]
        lines.append(f"| {m['label']} | " + " | ".join(f"{ms[n]:.2f}" for n in shown) + f" | {ms[9] / ms[1]:.2f} |")
    lines += [
        "",
        "Each size above follows a decode of another size. The same size decode after decode, where llama.cpp "
        "reuses its compute graph (ms, median):",
        "",
        "| model | " + " | ".join(f"{n} row{'s' * (n > 1)}: steady / after another size" for n in STEADY_ROWS) + " |",
        "|---|" + "---:|" * len(STEADY_ROWS),
    ]
    for m in models:
        cells = [f"{m['ms_steady'][n]:.2f} / {m['ms'][n]:.2f}" for n in STEADY_ROWS]
        lines.append(f"| {m['label']} | " + " | ".join(cells) + " |")
    return lines


def _invariance(models: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Batch invariance: a batch of n rows against the same rows one at a time",
        "",
        "`=` bit-identical, else the largest |difference| of a logit.",
        "",
        "| model | " + " | ".join(str(n) for n in INVARIANCE_ROWS) + " |",
        "|---|" + "---:|" * len(INVARIANCE_ROWS),
    ]
    for m in models:
        cells = ["=" if diff == 0 else f"{diff:.2g}" for diff in m["batch_diff"].values()]
        lines.append(f"| {m['label']} | " + " | ".join(cells) + " |")
    return lines + [""] + [f"- doctor's probe, {m['label']}: {m['probe']}" for m in models]


def _against_llama_bench(result: dict[str, Any]) -> list[str]:
    """localspec's one row decode after decode against llama-bench's tg128 at the same depth."""
    if not result.get("llama_bench"):
        return []
    lines = [
        "",
        "## Target alone against llama.cpp's own decoding (llama-bench from the same build)",
        "",
        "Both after the same cached tokens (the depth); localspec's is one row decoded again and again.",
        "",
        "| model | depth | llama-bench tg128 (tok/s) | localspec, one row at a time (tok/s) | localspec / llama |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in result["models"]:
        theirs = result["llama_bench"].get(m["label"], {})
        mine = 1000 / m["ms_steady"][1]
        depth = m.get("depth", "?")
        if "tokens_per_second" in theirs:
            rate = theirs["tokens_per_second"]
            lines.append(f"| {m['label']} | {depth} | {rate:.1f} | {mine:.1f} | {mine / rate:.2f} |")
        else:
            lines.append(f"| {m['label']} | {depth} | {theirs.get('error', '–')} | {mine:.1f} | – |")
    return lines


def _predictions(predicted: list[dict[str, Any]]) -> list[str]:
    names = list(REAL_PAIR_ACCEPTANCE)
    lines = [
        "",
        "## Predicted speedup over the target alone (best K), from these costs",
        "",
        "At the real pair's acceptance per bench prompt ("
        + ", ".join(f"{n} {a}" for n, a in REAL_PAIR_ACCEPTANCE.items())
        + "); lookup drafts for free, at the same acceptance. Cost ratio: a drafted token over a target token.",
        "",
        "| target | drafter | cost ratio | " + " | ".join(names) + " |",
        "|---|---|---:|" + "---:|" * len(names),
    ]
    for row in predicted:
        cells = [f"{speedup:.2f}× (K {k})" for k, speedup in (row["best"][n] for n in names)]
        lines.append(f"| {row['target']} | {row['drafter']} | {row['cost_ratio']:.2f} | " + " | ".join(cells) + " |")
    return lines


def _end_to_end(e2e: dict[str, Any]) -> list[str]:
    """One pair's bench table, greedy against target-only, what the controller learnt and the loop's own time."""
    lines = ["", f"## End to end: {e2e['pair']}", "", e2e["table"], "", "Greedy at fixed K against target-only:", ""]
    for check in e2e["identity"]:
        verdict = "identical" if check["identical"] else f"DIFFERS from token {check['first_difference']}"
        lines.append(f"- {check['prompt']}, K = {check['k']}: {check['tokens']} tokens, {verdict}")
    if e2e.get("learned"):
        lines += ["", "What adaptive drafting learnt (ms): a change of batch size, each size in a row:", ""]
    for learned in e2e.get("learned", []):
        sizes = ", ".join(f"{rows} {ms:.2f}" for rows, ms in learned["verify_ms"].items())
        switch = f"{learned['switch_ms']:.2f}" if learned["switch_ms"] is not None else "not measured"
        draft = f"{learned['draft_ms']:.2f}" if learned["draft_ms"] is not None else "not timed"
        lines.append(f"- {learned['mode']}: a change {switch}; rows {sizes}; a drafted token {draft}")
    for run in e2e.get("profile", []):
        lines += _loop_time(run)
    return lines


def _loop_time(run: dict[str, Any]) -> list[str]:
    """A reply's step split without the profiler (T = 0 and 0.7), then where cProfile finds the loop's own time."""
    lines = []
    for key, temperature in (("split_greedy", "0"), ("split", "0.7")):
        split = run.get(key)
        if split:
            lines += [
                "",
                f"A reply of the {run['variant']} without the profiler ({run['prompt']}, T = {temperature}): "
                f"{split['step']:.3f} ms a step — plan {split['plan']:.3f}, draft model "
                f"{split['draft']:.3f}, llama_decode until the device is done {split['verify']:.3f}, the "
                f"rest {split['other']:.3f} (copying the logits, sampling, the loop's Python)",
            ]
    lines += [
        "",
        f"The loop's own time, {run['variant']} ({run['prompt']}, T = 0.7, {run['steps']} steps, cProfile: "
        f"about twice Python's real time): {run['ms_per_step']:.3f} ms a step, most of it in",
        "",
        "| function | ms a step |",
        "|---|---:|",
    ]
    lines += [f"| `{name}` | {ms:.3f} |" for name, ms in run["functions"]]
    if run.get("extra"):
        lines += ["", "What the default spends a step beyond the target alone:", "",
                  "| function | ms a step more |", "|---|---:|"]  # fmt: skip
        lines += [f"| `{name}` | {ms:.3f} |" for name, ms in run["extra"]]
    return lines


def _device(build: dict) -> str:
    gpus = build["gpus"]
    return ", ".join(gpu.line() for gpu in gpus) if gpus else "the CPU (no GPU found)"


def main(argv: list[str] | None = None) -> int:
    from localspec.app.config import load_config

    parser = argparse.ArgumentParser(prog="python -m localspec.bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a model to measure; labels start with 'draft' or 'target' (repeatable)",
    )
    parser.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="TARGET:DRAFT",
        help="paths (or a catalog pair's name) to run end to end (repeatable)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="decodes of each row count per model")
    parser.add_argument("--e2e-tokens", type=int, default=96, help="tokens per end-to-end reply")
    parser.add_argument("--prompts", default="chat,code,edit", help="bench prompts for the end-to-end runs")
    parser.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench from the same build")
    parser.add_argument("--llama-cpp", default=None, help="the bin folder of llama-server from the same build")
    parser.add_argument("--note", action="append", default=[], help="a line for the report (repeatable)")
    parser.add_argument("--out", default="gpu-report.md", help="the markdown report")
    args = parser.parse_args(argv)
    config = load_config()
    settings = llama_settings(config)
    build = llama_build()
    result: dict[str, Any] = {
        "device": _device(build),
        "cpu": cpu_name(build),
        "hand_over_us": hand_over_seconds() * 1e6,
        "build": build,
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m localspec.bench gpu " + " ".join(argv or []),
        "notes": args.note,
        "models": [],
        "predictions": [],
        "end_to_end": [],
    }

    def save() -> None:
        """The report so far: a run cut short by a time limit (the device's) still leaves what it measured."""
        Path(args.out).write_text(render(result))
        Path(args.out).with_suffix(".json").write_text(json.dumps(_jsonable(result), indent=1, default=str))

    models = result["models"]
    for spec in args.model:
        label, _, path = spec.partition("=")
        models.append(model_facts(label, path, settings, args.repeats))
        result["predictions"] = predictions(models)
        save()
        print(f"measured {label}", flush=True)
    if args.llama_bench:
        result["llama_bench"] = {}
        for m in models:
            result["llama_bench"][m["label"]] = llama_bench(
                args.llama_bench, m["path"], settings.n_gpu_layers, m["depth"]
            )
            save()
    prompts = [name.strip() for name in args.prompts.split(",") if name.strip()]
    for pair in args.pair:
        target, _, draft = pair.partition(":")
        overrides = (
            {"model.pair": target, "model.target": "", "model.draft": ""}
            if not draft
            else {"model.target": target, "model.draft": draft}
        )
        result["end_to_end"].append(
            end_to_end(config.with_overrides(overrides), 1, args.e2e_tokens, prompts, args.llama_cpp)
        )
        save()
        print(f"ran {pair} end to end", flush=True)
    save()
    print(f"report: {args.out}")
    return 0


def _jsonable(result: dict[str, Any]) -> dict[str, Any]:
    out = dict(result)
    out["build"] = {
        **result["build"],
        "devices": [d.line() for d in result["build"]["devices"]],
        "gpus": [d.line() for d in result["build"]["gpus"]],
    }
    out["end_to_end"] = [{k: v for k, v in e.items() if k != "table"} for e in result.get("end_to_end", [])]
    return out
