"""The performance model of DESIGN §7, shared by the stats lines, the UI, adaptive K and the benchmark.

A speculative step drafts ``k`` tokens (``k * t_draft`` seconds), verifies
``k + 1`` rows in one target batch (``t_verify(k)``) and spends some time
outside llama.cpp (``t_other``). With per-token acceptance probability
``alpha`` it emits on average ``(1 - alpha**(k+1)) / (1 - alpha)`` tokens.
Target-only decoding emits one token per ``t_target``. Everything here is a
pure function of those measured numbers, so what the terminal, the UI and the
benchmark predict is the same prediction.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens emitted by one step of ``k`` drafts: ``sum_{i=0..k} alpha**i``."""
    if k <= 0:
        return 1.0
    alpha = min(max(alpha, 0.0), 1.0)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class StepCosts:
    """Measured seconds: one draft token, one verification step of ``k + 1`` rows, and the rest of a step."""

    t_draft: float  # per drafted token
    t_verify: float  # per verification batch (at the k it was measured with)
    t_other: float = 0.0  # per step, outside llama_decode (sampling, bookkeeping, detokenization)

    def step_seconds(self, k: int) -> float:
        return k * self.t_draft + self.t_verify + self.t_other


def predicted_tokens_per_second(alpha: float, k: int, costs: StepCosts) -> float:
    """Expected throughput of speculative decoding with ``k`` drafts per step."""
    seconds = costs.step_seconds(k)
    return expected_tokens_per_step(alpha, k) / seconds if seconds > 0 else 0.0


def predicted_speedup(alpha: float, k: int, costs: StepCosts, t_target: float) -> float:
    """DESIGN §7: ``E[tokens] * t_target / (k * t_draft + t_verify(k + 1) + t_other)``."""
    return predicted_tokens_per_second(alpha, k, costs) * t_target


def costs_from_stats(stats) -> StepCosts | None:
    """Per-token draft cost and per-step verify/other costs from a :class:`GenerationStats`."""
    if not stats.steps:
        return None
    t_draft = stats.draft_s / stats.drafted if stats.drafted else 0.0
    return StepCosts(t_draft, stats.verify_s / stats.steps, stats.other_s / stats.steps)


def speedup_verdict(measured: float, predicted: float | None = None, alpha: float | None = None) -> str:
    """A plain-language line about whether the draft is paying for itself, and why not when it is not."""
    if measured >= 1.05:
        text = f"the draft makes this {measured:.2f}x faster than the target alone"
    elif measured >= 0.95:
        text = f"the draft breaks even ({measured:.2f}x): drafting costs about what it saves"
    elif alpha is not None and alpha >= 0.8:
        text = (
            f"the draft is SLOWING things down ({measured:.2f}x) although it is accepted {alpha:.0%} of the time: "
            "it costs too much per token next to the target — use a smaller draft model or --draft none"
        )
    else:
        text = (
            f"the draft is SLOWING things down ({measured:.2f}x): acceptance is too low for its cost — "
            "try fewer draft tokens (K), a closer draft model, or --draft none"
        )
    if predicted:
        text += f"; the model of DESIGN §7 predicts {predicted:.2f}x"
    return text
