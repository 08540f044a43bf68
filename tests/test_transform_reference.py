"""The sampling transform pinned against an independent, literal reference (small cases, by hand).

``exact_joint`` in the proof suite uses the same ``probabilities()`` the loop
uses, so a wrong transform would be wrong on both sides and pass every
chi-square. Here the documented transform is re-written plainly — penalties
from the history, then temperature, top-k, top-p, min-p, softmax; ties at a
truncation threshold are kept — and compared with the production code on
cases chosen to tell the orders apart and to put ties on the boundaries.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from localspec.core.sampling import SamplingParams, probabilities


def reference(logits: list[float], params: SamplingParams, history: list[int] = ()) -> list[float]:
    x = [float(v) for v in logits]
    window = list(history)[-params.penalty_last_n :] if params.penalty_last_n > 0 else []
    for token, count in Counter(window).items():
        value = x[token]
        if params.repeat_penalty != 1.0:
            value = value / params.repeat_penalty if value > 0 else value * params.repeat_penalty
        x[token] = value - count * params.frequency_penalty - params.presence_penalty
    if params.temperature == 0.0:
        best = max(range(len(x)), key=lambda t: (x[t], -t))  # lowest id wins ties
        return [1.0 if t == best else 0.0 for t in range(len(x))]
    x = [v / params.temperature for v in x]
    keep = {t for t in range(len(x)) if x[t] != -math.inf}

    def softmax(kept: set[int]) -> dict[int, float]:
        top = max(x[t] for t in kept)
        e = {t: math.exp(x[t] - top) for t in kept}
        total = sum(e.values())
        return {t: v / total for t, v in e.items()}

    if params.top_k > 0 and params.top_k < len(keep):
        threshold = sorted((x[t] for t in keep), reverse=True)[params.top_k - 1]
        keep = {t for t in keep if x[t] >= threshold}  # ties at the k-th value stay
    if params.top_p < 1.0:
        probs = softmax(keep)
        mass, threshold = 0.0, None
        for t in sorted(keep, key=lambda t: -probs[t]):
            mass += probs[t]
            threshold = probs[t]
            if mass >= params.top_p:
                break
        keep = {t for t in keep if probs[t] >= threshold}  # ties with the last one kept stay
    if params.min_p > 0.0:
        probs = softmax(keep)
        best = max(probs.values())
        keep = {t for t in keep if probs[t] >= params.min_p * best}
    probs = softmax(keep)
    return [probs.get(t, 0.0) for t in range(len(x))]


LOGITS = [2.0, 1.0, 1.0, 0.5, -0.5, -1.5]  # ids 1 and 2 tie
CASES = {
    "temperature only": (LOGITS, SamplingParams(temperature=0.7), []),
    "top-k cuts inside a tie (k=2 keeps both tied ids)": (LOGITS, SamplingParams(temperature=1.0, top_k=2), []),
    "top-k before temperature would not matter; top-k=4": (LOGITS, SamplingParams(temperature=2.5, top_k=4), []),
    "top-p stops on a tie (keeps both)": (LOGITS, SamplingParams(temperature=1.0, top_p=0.6), []),
    "top-p after top-k renormalises over the top-k set": (
        LOGITS,
        SamplingParams(temperature=1.0, top_k=3, top_p=0.7),
        [],
    ),
    "temperature before top-p (T = 0.5 sharpens the head)": (LOGITS, SamplingParams(temperature=0.5, top_p=0.7), []),
    "min-p relative to the best after top-p": (LOGITS, SamplingParams(temperature=1.0, top_p=0.95, min_p=0.3), []),
    "penalties before temperature: repeat divides a positive logit, presence subtracts": (
        LOGITS,
        SamplingParams(temperature=0.6, repeat_penalty=2.0, presence_penalty=0.5),
        [0, 3],
    ),
    "repeat multiplies a negative logit; frequency counts; presence once": (
        LOGITS,
        SamplingParams(temperature=1.0, repeat_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3),
        [4, 4, 4, 1],
    ),
    "the penalty window drops old tokens": (
        LOGITS,
        SamplingParams(temperature=1.0, frequency_penalty=1.0, penalty_last_n=2),
        [0, 0, 0, 3, 5],
    ),
    "penalties turn a tie into an order, then top-k": (
        LOGITS,
        SamplingParams(temperature=1.0, presence_penalty=0.25, top_k=2),
        [2],
    ),
    "greedy: lowest id wins a tie created by penalties": (
        [1.0, 2.0, 1.5],
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        [1],
    ),
    "-inf logits stay impossible under every filter": (
        [-math.inf, 1.0, 0.0, -math.inf, 0.5],
        SamplingParams(temperature=0.9, top_k=2, top_p=0.9),
        [],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_transform_matches_the_reference(name: str) -> None:
    logits, params, history = CASES[name]
    want = np.array(reference(logits, params, history))
    got = probabilities(np.array(logits, dtype=np.float32), params, history, len(logits))
    assert np.allclose(got, want, rtol=0, atol=1e-12), f"{name}:\n got {np.round(got, 6)}\nwant {np.round(want, 6)}"


def test_the_reference_tells_the_orders_apart() -> None:
    """Negative control: the cases would catch a transform applying its steps in another order."""
    logits, params, _ = CASES["temperature before top-p (T = 0.5 sharpens the head)"]
    kept_after = sum(p > 0 for p in reference(logits, params))
    top_p_first = SamplingParams(temperature=1.0, top_p=params.top_p)  # top-p on the unsharpened row
    kept_before = sum(p > 0 for p in reference(logits, top_p_first))
    assert kept_after != kept_before
    logits, params, history = CASES["penalties before temperature: repeat divides a positive logit, presence subtracts"]
    temperature_first = reference([v / params.temperature for v in logits],
                                  SamplingParams(temperature=1.0, repeat_penalty=2.0, presence_penalty=0.5),
                                  history)  # fmt: skip
    assert not np.allclose(temperature_first, reference(logits, params, history))
