"""Goodness-of-fit helpers and exact accepted-length distributions for the proof suite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.stats import chi2

SIGNIFICANCE = 1e-6  # DESIGN §3: a correct sampler fails a test with probability 1e-6


@dataclass
class ChiSquare:
    """Pearson's statistic with cells of expected count < 5 pooled into one."""

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
    o = np.append(obs[big], obs[~big & ~impossible].sum())
    e = np.append(exp[big], exp[~big & ~impossible].sum())
    keep = e > 0
    o, e = o[keep], e[keep]
    stat = float(((o - e) ** 2 / e).sum())
    dof = max(int(keep.sum()) - 1, 1)
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
