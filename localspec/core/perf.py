"""The performance model (docs/design.md, "performance model"), shared by the UI, adaptive K and the benchmark.

A speculative step drafts ``k`` tokens (``k * t_draft`` seconds), verifies
``k + 1`` rows in one target batch (``t_verify(k + 1)``) and spends some time
outside llama.cpp (``t_other``). With per-token acceptance probability
``alpha`` it emits on average ``(1 - alpha**(k+1)) / (1 - alpha)`` tokens.
Target-only decoding emits one token per ``t_target``. Everything here is a
pure function of those measured numbers, so what the UI and the benchmark
predict is the same prediction.

It lives in ``core``, not with the policy in ``localspec.drafting``: both the
policy (which ranks K by it) and the reporting (app, UI, benchmark) read it, and
``core`` is the one layer below both, while the front ends may not import the
policy. It holds no state and decides nothing, so it adds nothing the loop's
exactness depends on.
"""

from __future__ import annotations

import statistics

from localspec.core.events import step_field


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens emitted by one step of ``k`` drafts: ``sum_{i=0..k} alpha**i``."""
    if k <= 0:
        return 1.0
    alpha = min(max(alpha, 0.0), 1.0)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def steps_by_k(stats) -> dict[int, int]:
    """How many steps of a :class:`GenerationStats` drafted exactly ``k`` tokens.

    ``drafted_by_position[i]`` counts the steps that drafted at least ``i + 1``
    tokens, so the differences of neighbours are the histogram of ``k``.
    """
    at_least = list(stats.drafted_by_position) + [0]
    counts = {0: stats.steps - (at_least[0] if stats.drafted_by_position else 0)}
    for k in range(1, len(at_least)):
        counts[k] = at_least[k - 1] - at_least[k]
    return {k: n for k, n in counts.items() if n > 0}


def expected_tokens(stats) -> float:
    """Sum over a reply's steps of ``E[tokens](alpha, k_step)`` at the reply's measured alpha."""
    return sum(n * expected_tokens_per_step(stats.alpha, k) for k, n in steps_by_k(stats).items())


def predicted_speedup(stats, t_target: float) -> float | None:
    """The performance model for a finished reply: ``sum_steps E[tokens](alpha, k_step) * t_target / decode seconds``.

    The decode seconds are the reply's own ``sum_steps (k t_draft + t_verify(k + 1) + t_other)``,
    and each step counts with its own ``k``, so this holds for adaptive K too. The UI
    calls it; the benchmark uses its two halves, :func:`expected_tokens` when a run ends and
    :func:`model_speedup` once the target-only run of the same prompt is known.
    """
    return model_speedup(expected_tokens(stats), t_target, stats.decode_s) if stats.steps else None


def model_speedup(expected: float, t_target: float, decode_s: float) -> float | None:
    """``expected`` tokens in ``decode_s`` seconds, over target-only at ``t_target`` seconds per token."""
    if decode_s <= 0 or not t_target:
        return None
    return expected * t_target / decode_s


def best_draft_length(alpha: float, t_draft: float, t_verify: dict[int, float], t_target: float) -> tuple[int, float]:
    """The K that the model predicts fastest, and its speedup over target-only, from measured costs:
    ``E[tokens](alpha, K) * t_target / (K * t_draft + t_verify[K + 1])`` over every ``K + 1`` in ``t_verify``
    (seconds per decode of that many rows; K = 0, the target alone, is always a candidate)."""
    best = (0, 1.0)
    for rows, seconds in sorted(t_verify.items()):
        k = rows - 1
        if k >= 1:
            speedup = expected_tokens_per_step(alpha, k) * t_target / (k * t_draft + seconds)
            best = max(best, (k, speedup), key=lambda pair: pair[1])
    return best


MIN_TOKENS_TO_JUDGE = 32  # below this a reply's speed is mostly start-up and adaptive K's prior
FASTER_FROM = 1.05  # a measured speedup from here on is "faster" ...
SLOWER_BELOW = 0.95  # ... and below this "slowing things down"; in between, break-even
LOADED_FROM = 1.25  # the target running this much slower than its best timing is "slowed down by something else"
MIN_STEPS_TO_TIME = 3  # steps needed to time the target under a reply's own conditions


def rows_seconds(shape: dict[int, float], rows: int) -> float | None:
    """The cost of a ``rows``-row target batch read off measured costs per batch size: a measured size's
    own, else the straight line between the measured sizes around it, else (beyond the largest) the
    largest's cost per row times ``rows``."""
    if rows in shape:
        return shape[rows]
    below = max((n for n in shape if n < rows), default=None)
    above = min((n for n in shape if n > rows), default=None)
    if below is None:
        return None
    if above is None:
        return shape[below] * rows / below
    return shape[below] + (shape[above] - shape[below]) * (rows - below) / (above - below)


def target_alone_seconds(steps, shape: dict[int, float]) -> float | None:
    """What one target-only token cost while ``steps`` ran: each step's verification time scaled to
    one row by the shape of ``shape`` (seconds per batch size, timed before; ``shape[1]`` needed), the
    median over the steps. None with fewer than ``MIN_STEPS_TO_TIME`` usable steps.

    A speedup is only honest against the target under the same conditions: a browser drawing the
    page, another program or heat slows every mode alike, and a target-only cost timed in a quiet
    moment would blame all of that on the draft. ``shape`` contributes only the ratio between batch
    sizes; the level comes from the steps themselves."""
    if not shape or shape.get(1, 0.0) <= 0:
        return None
    per_row = []
    for step in steps:
        get = step_field(step)
        rows = len(get("drafted", []) or []) + 1
        cost = rows_seconds(shape, rows)
        if cost and get("verify_s", 0.0) > 0:
            per_row.append(get("verify_s") * shape[1] / cost)
    if len(per_row) < MIN_STEPS_TO_TIME:
        return None
    return statistics.median(per_row)


def too_short_to_judge(tokens: int | None) -> bool:
    """Whether a reply of ``tokens`` tokens says too little to call the draft slow (None: a benchmark)."""
    return tokens is not None and tokens < MIN_TOKENS_TO_JUDGE


def slows_down(measured: float, tokens: int | None = None) -> bool:
    """Whether the draft measurably slows decoding down: below break-even, over a reply long enough to judge."""
    return measured < SLOWER_BELOW and not too_short_to_judge(tokens)


def speedup_verdict(
    measured: float,
    predicted: float | None = None,
    acceptance: float | None = None,
    tokens: int | None = None,
    load: float | None = None,
) -> str:
    """A plain-language line about whether the draft is paying for itself, and why not when it is not.

    ``measured`` compares with the target alone under the same conditions. ``load`` is how much
    slower the target itself ran than its best timing: from ``LOADED_FROM`` on, the line names that as
    the cause of the slowness, since the draft cannot help it. ``tokens`` is the reply's length when
    the verdict is about one reply (the UI): a handful of tokens right after loading is timed with
    cold caches and before adaptive K has measured anything, so a slow figure there is not blamed on
    the draft."""
    if too_short_to_judge(tokens) and measured < FASTER_FROM:
        return (
            f"{measured:.2f}x over {tokens} tokens is too short to judge the draft: short replies are "
            "mostly start-up, and adaptive K is still learning the pair — a longer reply, or "
            "`localspec bench`, shows the real speed"
        )
    if measured >= FASTER_FROM:
        text = f"the draft makes this {measured:.2f}x faster than the target alone"
    elif not slows_down(measured):
        text = f"the draft breaks even ({measured:.2f}x): drafting costs about what it saves"
    elif acceptance is not None and acceptance >= 0.8:
        text = (
            f"the draft is SLOWING things down ({measured:.2f}x) although {acceptance:.0%} of its tokens are accepted: "
            "it costs too much per token next to the target — use a smaller draft model or --draft none"
        )
    else:
        text = (
            f"the draft is SLOWING things down ({measured:.2f}x): acceptance is too low for its cost — "
            "try fewer draft tokens (K), a closer draft model, or --draft none"
        )
    if predicted:
        text += f"; the cost model predicts {predicted:.2f}x"
    if load is not None and load >= LOADED_FROM:
        text += (
            f". The target itself ran {load:.1f}x slower than its best timing: something else is using the "
            "processor (another program, the browser drawing this page, heat), and that slows every mode alike"
        )
    return text
