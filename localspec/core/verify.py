"""Accept or correct drafted tokens: every rule of docs/design.md (Verification rules) as a pure function.

Each function receives the drafted tokens, the target's rows (``K + 1`` of
them: one per drafted position plus the bonus position) and, where the rule
is random, the RNG. Rows are anything indexable by position, so callers may
pass lazy sequences that compute a row only when the rule looks at it (greedy
needs no softmax at all; rejection never looks past the first rejection).

Rows may be dense probability arrays or :class:`~localspec.core.weights.Weights`
(unnormalised, the hot path): a rule compares single probabilities with its
uniforms, from bounds of the row's total where they settle the comparison (the
exact comparison's answer, without the float64 pass over the row: docs/design.md,
"Decisions without the total"); after a rejection, the token is drawn from ``p``
and kept with the residual's share of it (:func:`draw_from_residual`), and only
where a few draws keep nothing is the residual computed: for the rejection rule
another unnormalised row, slice by slice, for the one-hot rule a full normalised row.

Every function returns a :class:`Verdict` with the number of accepted draft
tokens, the one token the target emits after them (correction or bonus), and
one :class:`DraftCheck` per examined draft token for traces and the UI (its
``p`` is NaN where the bounds decided).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.core.weights import Weights, dense_of, prob_exceeds, prob_of, residual_of, sample_index

#: Draws from ``p`` a rejection tries before it computes its residual (see :func:`draw_from_residual`).
RESIDUAL_DRAWS = 4


@dataclass
class DraftCheck:
    """The evidence behind one draft token's fate."""

    token: int
    p: float  # target probability of the draft token (nan where the rule needs none or bounds decided)
    q: float  # draft probability it was sampled with (1.0 for a deterministic drafter)
    accept_prob: float  # probability this rule accepted it with
    uniform: float | None  # the uniform that decided it (None: decided without one)
    accepted: bool
    target_token: int | None = None  # the token the target picked here (greedy/invariant/token-match)


def finite(value: float) -> float | None:
    """A check's probability as shown to people: None where it is NaN (the rule did not use it)."""
    return None if value != value else value


@dataclass
class Verdict:
    """Outcome of verifying one draft."""

    n_accepted: int
    token: int  # emitted after the accepted drafts: a correction, or a bonus when all were accepted
    bonus: bool
    checks: list[DraftCheck] = field(default_factory=list)
    residual_mass: float | None = None  # 1 - sum(min(p, q)) at the rejected row, when known


def verify_rejection(
    draft: Sequence[int],
    q_rows: Sequence[np.ndarray],
    p_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``. At the
    first rejection emit a draw from ``normalize(max(0, p_i - q_i))``; when all
    are accepted emit a draw from ``p_K``. ``q_rows[i]`` must be the
    distribution ``d_i`` was actually sampled from.
    """
    checks: list[DraftCheck] = []
    for i, token in enumerate(draft):
        p_row = p_rows[i]
        q_row = q_rows[i]
        q_tok = prob_of(q_row, token)
        if q_tok <= 0.0:
            raise ValueError(f"draft token {token} has q = 0 at draft position {i}: it cannot have been sampled from q")
        u = float(rng.random())
        accepted = prob_exceeds(p_row, token, u * q_tok)  # u < p / q, where bounds of p's total settle it
        if accepted is None:
            p_tok = prob_of(p_row, token)
            accept_prob = min(1.0, p_tok / q_tok)
            accepted = u < accept_prob
        else:
            p_tok = accept_prob = float("nan")
        checks.append(DraftCheck(token, p_tok, q_tok, accept_prob, u, accepted))
        if not accepted:
            token, mass = draw_from_residual(p_row, lambda t: prob_of(q_row, t), rng, lambda: residual_of(p_row, q_row))
            return Verdict(i, token, False, checks, residual_mass=mass)
    return Verdict(len(draft), sample_index(p_rows[len(draft)], rng), True, checks)


def verify_onehot(
    draft: Sequence[int],
    p_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Rejection sampling for a deterministic drafter (prompt lookup, n-gram).

    ``q_i`` is one-hot on ``d_i``, so accept with probability ``p_i(d_i)``
    and on rejection sample ``p_i`` with ``d_i`` removed and renormalised —
    the same residual rule, specialised.
    """
    checks: list[DraftCheck] = []
    for i, token in enumerate(draft):
        p_row = p_rows[i]
        u = float(rng.random())
        accepted = prob_exceeds(p_row, token, u)  # u < p, where bounds of p's total settle it
        if accepted is None:
            p_tok = prob_of(p_row, token)
            accepted = u < p_tok
        else:
            p_tok = float("nan")
        checks.append(DraftCheck(token, p_tok, 1.0, p_tok, u, accepted))
        if not accepted:
            drafted = token
            token, _ = draw_from_residual(p_row, lambda t: float(t == drafted), rng, lambda: _without(p_row, drafted))
            return Verdict(i, token, False, checks, residual_mass=finite(1.0 - p_tok))
    return Verdict(len(draft), sample_index(p_rows[len(draft)], rng), True, checks)


def draw_from_residual(
    p_row: np.ndarray | Weights,
    q_prob: Callable[[int], float],
    rng: np.random.Generator,
    residual: Callable[[], Weights],
) -> tuple[int, float | None]:
    """A draw from ``normalize(max(0, p - q))`` after a rejection, and that residual's mass where it was
    computed (None where it was not).

    A token ``x`` drawn from ``p`` is kept with probability ``max(0, p(x) - q(x)) / p(x)``, so each
    draw keeps ``x`` with probability ``max(0, p(x) - q(x))``: a kept draw has the residual's law
    exactly. The residual's mass is the chance a draw is kept, and a rejection is most likely where
    it is large, so most rejections keep one of their first two or three draws, each a draw from
    ``p`` and two probabilities; computing the residual passes over both rows of every token.
    After :data:`RESIDUAL_DRAWS` draws kept nothing (a residual of little
    mass) the residual is computed and drawn from; either way the token has the residual's law.
    """
    for _ in range(RESIDUAL_DRAWS):
        x = sample_index(p_row, rng)
        r, q_x = rng.random(), q_prob(x)
        kept = prob_exceeds(p_row, x, q_x / (1.0 - r))  # r * p < p - q, where bounds of p's total settle it
        if kept is None:
            p_x = prob_of(p_row, x)
            kept = r * p_x < p_x - q_x
        if kept:
            return x, None
    row = residual()
    return sample_index(row, rng), row.total


def _without(p_row, token: int) -> Weights:
    """The one-hot rule's residual: ``p`` with the drafted ``token`` removed (unnormalised)."""
    row = np.array(dense_of(p_row), dtype=np.float64)  # a copy: rows may be shared
    row[token] = 0.0
    return Weights(row)


def verify_picks(draft: Sequence[int], target_picks: Sequence[int]) -> Verdict:
    """Accept while ``d_i`` equals the target's own pick; at the first mismatch emit that pick.

    Greedy decoding (T = 0) passes ``argmax p_i``. The drafter-invariant mode
    (Gumbel coupling, Daliri, Musco & Suresh 2024) passes ``argmax(log p_i +
    g_i)`` with noise shared with the draft. Either way the committed text is
    the target's picks — up to and including the first mismatch, or all of
    them plus the bonus — so it depends on the seed alone, never on the draft.
    No uniforms and no residual. (Mixing the Gumbel noise with the rejection
    rule would be biased; never do it.)
    """
    checks: list[DraftCheck] = []
    for i, token in enumerate(draft):
        pick = int(target_picks[i])
        accepted = token == pick
        checks.append(DraftCheck(token, float("nan"), float("nan"), float(accepted), None, accepted, pick))
        if not accepted:
            return Verdict(i, pick, False, checks)
    return Verdict(len(draft), int(target_picks[len(draft)]), True, checks)


def verify_token_match(
    draft: Sequence[int],
    p_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Comparison baseline: the target samples its own token; a draft token survives only if equal.

    Lossless, but accepts with ``sum(p * q)`` instead of ``sum(min(p, q))``.
    """
    checks: list[DraftCheck] = []
    for i, token in enumerate(draft):
        p_row = p_rows[i]
        pick = sample_index(p_row, rng)
        accepted = pick == token
        p_tok = prob_of(p_row, token)
        checks.append(DraftCheck(token, p_tok, float("nan"), p_tok, None, accepted, pick))
        if not accepted:
            return Verdict(i, pick, False, checks)
    return Verdict(len(draft), sample_index(p_rows[len(draft)], rng), True, checks)


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """Expected acceptance of rejection sampling at one position: ``sum(min(p, q))``."""
    return float(np.minimum(p, q).sum())
