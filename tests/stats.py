"""Goodness-of-fit helpers and exact accepted-length distributions for the proof suite."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2

SIGNIFICANCE = 1e-6  # docs/design.md, Proving exactness: a correct sampler fails a test with probability 1e-6


@dataclass
class ChiSquare:
    """Pearson's statistic; cells expecting fewer than 5 counts are pooled, and a pooled bin that still
    expects fewer than 5 is merged into the smallest cell, so every cell tested expects at least 5 and the
    chi-square approximation behind the stated significance holds."""

    statistic: float
    dof: int
    critical: float
    n: int

    @property
    def passed(self) -> bool:
        return self.statistic <= self.critical

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "REJECT"
        return f"chi2={self.statistic:.1f} (dof {self.dof}, critical {self.critical:.1f}, n={self.n}) {verdict}"


def chi_square(observed: np.ndarray, probs: np.ndarray, alpha: float = SIGNIFICANCE) -> ChiSquare:
    """Pearson chi-square of counts against exact probabilities (any shape, flattened)."""
    obs = np.asarray(observed, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    n = obs.sum()
    assert abs(p.sum() - 1.0) < 1e-9, f"expected probabilities sum to {p.sum()}"
    impossible = p <= 0.0
    if obs[impossible].sum() > 0:  # a zero-probability outcome happened: infinitely unlikely
        return ChiSquare(float("inf"), 1, chi2.isf(alpha, 1), int(n))
    exp = p * n
    big = exp >= 5.0
    o, e = obs[big], exp[big]
    small = ~big & ~impossible
    pooled_o, pooled_e = obs[small].sum(), exp[small].sum()
    if pooled_e >= 5.0:
        o, e = np.append(o, pooled_o), np.append(e, pooled_e)
    elif pooled_e > 0 and len(e):
        # a pooled bin still expecting fewer than 5 makes the statistic's tail heavier than chi-square's
        # (an outside review put the real level near 2e-5 instead of 1e-6); merge it into the smallest cell
        smallest = int(np.argmin(e))
        o[smallest] += pooled_o
        e[smallest] += pooled_e
    assert len(e) < 2 or (e >= 5.0).all(), "every cell of the test expects at least 5 counts"
    stat = float(((o - e) ** 2 / e).sum())
    dof = max(len(e) - 1, 1)
    return ChiSquare(stat, dof, float(chi2.isf(alpha, dof)), int(n))


Row = Callable[[Sequence[int]], np.ndarray]


def accepted_length_distribution(
    p_of: Row, q_of: Row, prefix: Sequence[int], k: int, accept: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """Exact distribution of the number of accepted drafts in one step of ``k`` drafts.

    ``accept(p, q)[x]`` is the probability that the draft proposes ``x`` at a
    position *and* the rule accepts it; it differs by rule:
    rejection ``min(p, q)``, one-hot drafter ``p * onehot``, token-match
    ``p * q``, Gumbel coupling ``1 / sum_y max(p_y / p_x, q_y / q_x)``.
    """
    if k == 0:
        return np.ones(1)
    p, q = p_of(prefix), q_of(prefix)
    m = accept(p, q)
    out = np.zeros(k + 1)
    out[0] = 1.0 - m.sum()
    for x in np.flatnonzero(m > 0):
        out[1:] += m[x] * accepted_length_distribution(p_of, q_of, [*prefix, int(x)], k - 1, accept)
    return out


def accept_rejection(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.minimum(p, q)


def accept_token_match(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return p * q


def accept_onehot(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``q`` is the one-hot of the deterministic proposal."""
    return p * q


def accept_gumbel(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """P(argmax(log q + g) = argmax(log p + g) = x) for shared Gumbel noise g.

    Both pick ``x`` iff ``E_y > E_x * max(p_y/p_x, q_y/q_x)`` for all y (the
    exponential race), which integrates to ``1 / sum_y max(p_y/p_x, q_y/q_x)``.
    """
    out = np.zeros_like(p)
    for x in np.flatnonzero((p > 0) & (q > 0)):
        out[x] = 1.0 / np.maximum(p / p[x], q / q[x]).sum()
    return out
