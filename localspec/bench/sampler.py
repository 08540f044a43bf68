"""Microbenchmark of one verification step, without any model.

For each vocabulary size, K and mode it times ``mode.verify`` on synthetic
logits shaped like a real pair's (target rows plus a draft that agrees with
it most of the time), i.e. everything the orchestrator does between the
target's ``llama_decode`` and the next draft: the transform of the target
rows it needs, the acceptance tests, and the correction or bonus draw.
Drafting costs (the q rows) are measured separately, per drafted token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.core.modes import Draft, make_mode
from localspec.core.sampling import SamplingParams, draft_weights
from localspec.core.weights import Weights

VOCABS = (49_152, 151_936, 262_144)
KS = (4, 8)
MODES = ("rejection", "greedy", "invariant", "token-match")


@dataclass
class Row:
    vocab: int
    k: int
    mode: str
    verify_us: float
    draft_pick_us: float
    accepted: float


def synthetic_rows(vocab: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Target and draft logits (float32) with a realistic shape: a peaked head and a long tail."""
    base = rng.standard_normal((k + 1, vocab)).astype(np.float32) * 2.5
    heads = rng.integers(0, vocab, size=(k + 1, 8))
    for i in range(k + 1):
        base[i, heads[i]] += np.linspace(14, 6, 8, dtype=np.float32)
    draft = base[:k] + rng.standard_normal((k, vocab)).astype(np.float32) * 0.3
    return base, draft


def measure(vocab: int, k: int, mode_name: str, repeats: int, temperature: float = 0.7) -> Row:
    rng = np.random.default_rng(vocab + k)
    target_logits, draft_logits = synthetic_rows(vocab, k, rng)
    params = SamplingParams(temperature=0.0 if mode_name == "greedy" else temperature)
    context = list(rng.integers(0, vocab, size=64))
    verify_times, pick_times, accepted = [], [], []
    for r in range(repeats):
        mode = make_mode(mode_name, params, np.random.default_rng(r), vocab, seed=r)
        draft = Draft(tokens=[], q_rows=[])
        t0 = time.perf_counter()
        for i in range(k):
            token, q = mode.pick_draft(draft_logits[i], [], len(context) + i)
            draft.tokens.append(token)
            if q is None:
                draft.q_rows = None
            elif draft.q_rows is not None:
                draft.q_rows.append(q)
        t1 = time.perf_counter()
        verdict = mode.verify(draft, target_logits, context)
        t2 = time.perf_counter()
        pick_times.append((t1 - t0) / k)
        verify_times.append(t2 - t1)
        accepted.append(verdict.n_accepted)
    return Row(vocab, k, mode_name, statistics.median(verify_times) * 1e6,
               statistics.median(pick_times) * 1e6, float(np.mean(accepted)))  # fmt: skip


def run(vocabs=VOCABS, ks=KS, modes=MODES, repeats: int = 30) -> list[Row]:
    return [measure(v, k, m, repeats) for v in vocabs for k in ks for m in modes]


def table(rows: list[Row]) -> str:
    lines = [
        "| V | K | mode | verify step (µs, median) | draft pick per token (µs) | mean accepted |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.vocab:,} | {r.k} | {r.mode} | {r.verify_us:,.0f} | {r.draft_pick_us:,.0f} | {r.accepted:.2f} |"
        )
    return "\n".join(lines)


def _load_target(path: str):
    """``path`` loaded as a target with the config's settings (a :class:`~localspec.llama.model.LlamaModel`)."""
    from localspec.app.config import load_config
    from localspec.app.engine import llama_settings, load_model

    return load_model(path, llama_settings(load_config()), "target")


def _greedy_reply_rows(model, n_rows: int) -> Iterator[np.ndarray]:
    """The ``(1, V)`` output row of each of the first ``n_rows`` steps of ``model``'s greedy reply to the GPU
    bench's context: llama.cpp's own output buffer (borrowed), valid until the next row is asked for."""
    from localspec.bench.gpu import CONTEXT_TEXT

    rows = model.extend(model.tokenize(CONTEXT_TEXT), 1, borrow=True)
    for _ in range(n_rows):
        yield rows
        rows = model.extend([int(np.argmax(rows[0]))], 1, borrow=True)


def against_llama_cpp(path: str, repeats: int, temperatures: tuple[float, ...] = (0.0, 0.7),
                      n_rows: int = 1) -> dict[tuple[str, str], list[float]]:  # fmt: skip
    """A target-only token's draw on real output rows: localspec's (the mode's verification of no draft) against
    llama.cpp's own sampler chain (what llama-server runs per token), at each temperature (above 0 over the whole
    distribution). The rows are those of the model's own greedy reply to the GPU bench's context, ``n_rows`` of
    them: how peaked a row is decides what a draw costs. Interleaved on each row; the median µs of each row, by
    (temperature, whose)."""
    from localspec.app.engine import llama_cpp_sampler

    model = _load_target(path)
    samplers = {t: llama_cpp_sampler(t) for t in temperatures}
    try:
        per_row: dict[tuple[str, str], list[float]] = {}
        for rows in _greedy_reply_rows(model, n_rows):  # llama.cpp's output row, which its sampler reads too
            draws = {}
            for t, sampler in samplers.items():
                params = SamplingParams(temperature=t)
                mode = make_mode("target-only", params, np.random.default_rng(0), model.vocab_size)
                no_draft = Draft(tokens=[], q_rows=[])
                draws[(f"T = {t:g}", "localspec")] = lambda mode=mode, rows=rows: mode.verify(no_draft, rows, [0])
                draws[(f"T = {t:g}", "llama.cpp")] = lambda sampler=sampler: sampler.sample(model)
            times: dict[tuple[str, str], list[float]] = {key: [] for key in draws}
            for _ in range(repeats + 1):  # the first round warms up and is not kept
                for key, draw in draws.items():
                    began = time.perf_counter()
                    draw()
                    times[key].append(time.perf_counter() - began)
            for key, values in times.items():
                per_row.setdefault(key, []).append(statistics.median(values[1:]) * 1e6)
        return per_row
    finally:
        for sampler in samplers.values():
            sampler.close()
        model.close()


def against_llama_cpp_table(found: dict[tuple[str, str], list[float]], vocab_note: str) -> str:
    n_rows = len(next(iter(found.values())))
    if n_rows == 1:
        lines = [f"| a target-only token's draw ({vocab_note}) | localspec (µs) | llama.cpp's sampler (µs) | ratio |",
                 "|---|---:|---:|---:|"]  # fmt: skip
    else:
        lines = [f"| a target-only token's draw ({vocab_note}, {n_rows} rows of a reply) | localspec (µs): median / "
                 "90th percentile / mean | llama.cpp's sampler (µs): median / mean | ratio of the means |",
                 "|---|---:|---:|---:|"]  # fmt: skip
    for temperature in dict.fromkeys(t for t, _ in found):
        ours, theirs = np.array(found[(temperature, "localspec")]), np.array(found[(temperature, "llama.cpp")])
        if n_rows == 1:
            lines.append(f"| {temperature} | {ours[0]:,.0f} | {theirs[0]:,.0f} | {theirs[0] / ours[0]:.1f}× |")
        else:
            lines.append(f"| {temperature} | {np.median(ours):,.0f} / {np.percentile(ours, 90):,.0f} / "
                         f"{ours.mean():,.0f} | {np.median(theirs):,.0f} / {theirs.mean():,.0f} | "
                         f"{theirs.mean() / ours.mean():.1f}× |")  # fmt: skip
    return "\n".join(lines)


def real_rows(path: str, n_rows: int) -> np.ndarray:
    """``n_rows`` output rows of a model's greedy reply to the GPU bench's context (copies, float32)."""
    model = _load_target(path)
    try:
        return np.concatenate([rows.copy() for rows in _greedy_reply_rows(model, n_rows)])  # before the next decode
    finally:
        model.close()


def verify_with_and_without_bounds(rows: np.ndarray, k: int, draft: str, seeds: int = 5,
                                   temperature: float = 0.7) -> dict[str, tuple[float, float]]:  # fmt: skip
    """The rejection mode's verification of ``k`` drafts on windows of real rows: a lookup draft (each row's
    argmax, the one-hot rule) or a model draft (drawn from the rows with noise added, the rejection rule),
    decided from bounds of each row's total (as shipped) and with every total computed (the bounds turned
    off), in turn on each window and seed. Median and mean µs of each, and the mean accepted."""
    params = SamplingParams(temperature=temperature)
    exact, shipped = (lambda self, token, level: None), Weights.prob_exceeds
    times: dict[str, list[float]] = {"with every total": [], "with bounds": []}
    accepted = []
    for start in range(0, rows.shape[0] - k, max(1, k)):
        target = rows[start : start + k + 1]
        if draft == "lookup":
            proposal = Draft(tokens=[int(np.argmax(row)) for row in target[:k]], q_rows=None)
        else:
            noise = np.random.default_rng(start).standard_normal(target[:k].shape).astype(np.float32)
            q_rows = [draft_weights(row, params) for row in target[:k] + noise * np.float32(0.5)]
            tokens = [q.sample(np.random.default_rng(start + i)) for i, q in enumerate(q_rows)]
            proposal = Draft(tokens=tokens, q_rows=q_rows)
        for seed in range(seeds):
            for name, decide in (("with every total", exact), ("with bounds", shipped)):
                Weights.prob_exceeds = decide
                try:
                    mode = make_mode("rejection", params, np.random.default_rng(seed), target.shape[1])
                    began = time.perf_counter()
                    verdict = mode.verify(proposal, target, [0])
                    times[name].append(time.perf_counter() - began)
                finally:
                    Weights.prob_exceeds = shipped
            accepted.append(verdict.n_accepted)
    out = {name: (statistics.median(t) * 1e6, statistics.fmean(t) * 1e6) for name, t in times.items()}
    out["accepted"] = (float(np.mean(accepted)), 0.0)
    return out


def verify_table(found: dict[tuple[str, int], dict[str, tuple[float, float]]], note: str) -> str:
    lines = [f"| a verification step on real rows ({note}) | K | mean accepted | every total computed: median / "
             "mean (µs) | from bounds: median / mean (µs) |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for (draft, k), cell in found.items():
        (a_med, a_mean), (b_med, b_mean) = cell["with every total"], cell["with bounds"]
        lines.append(f"| {draft} | {k} | {cell['accepted'][0]:.2f} | {a_med:,.0f} / {a_mean:,.0f} | "
                     f"{b_med:,.0f} / {b_mean:,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench sampler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed verification steps per cell")
    parser.add_argument("--vocab", type=int, action="append", help="vocabulary size (repeatable)")
    parser.add_argument("-k", type=int, action="append", help="draft tokens (repeatable)")
    parser.add_argument("--mode", action="append", choices=MODES, help="mode (repeatable)")
    parser.add_argument("--against-llama-cpp", metavar="GGUF", default=None,
                        help="instead: a target-only draw on this model's real output row, localspec's against "
                             "llama.cpp's own sampler chain")  # fmt: skip
    parser.add_argument("--rows", type=int, default=1,
                        help="with --against-llama-cpp: this many rows of the model's greedy reply")  # fmt: skip
    parser.add_argument("-t", "--temperature", type=float, action="append",
                        help="with --against-llama-cpp: a temperature (repeatable; default 0 and 0.7)")  # fmt: skip
    parser.add_argument("--verify-rows", metavar="GGUF", default=None,
                        help="instead: the rejection mode's verification on this model's real rows (--rows of "
                             "them), decided from bounds of each row's total against every total computed")  # fmt: skip
    args = parser.parse_args(argv)
    if args.verify_rows:
        rows = real_rows(args.verify_rows, max(args.rows, 16))
        found = {(draft, k): verify_with_and_without_bounds(rows, k, draft)
                 for draft in ("lookup", "model") for k in tuple(args.k or KS)}  # fmt: skip
        print(verify_table(found, f"{Path(args.verify_rows).name}, {rows.shape[0]} rows, T = 0.7"))
        return 0
    if args.against_llama_cpp:
        temperatures = tuple(args.temperature or (0.0, 0.7))
        found = against_llama_cpp(args.against_llama_cpp, args.repeats, temperatures, args.rows)
        print(against_llama_cpp_table(found, Path(args.against_llama_cpp).name))
        return 0
    rows = run(tuple(args.vocab or VOCABS), tuple(args.k or KS), tuple(args.mode or MODES), args.repeats)
    print(table(rows))
    target = next((r for r in rows if r.vocab == 49_152 and r.k == 4 and r.mode == "rejection"), None)
    if target is not None:
        verdict = "meets" if target.verify_us <= 1000 else "MISSES"
        print(
            f"\nrejection, V=49,152, K=4: {target.verify_us:,.0f} µs per verification step — {verdict} the 1 ms target"
        )
    return 0
