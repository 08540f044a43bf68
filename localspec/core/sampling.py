"""From raw logits to the probability vector both models are judged by.

Speculative sampling is exact only when the draft token was drawn from the very
``q`` the acceptance rule divides by, and when ``p`` and ``q`` come from the
same transform (docs/design.md, Verification rules, bugs 1 and 6). So there is exactly one transform,
:func:`log_weights`, used for the draft and the target alike, always on the
full vocabulary indexed by token id and always in float64.

Order of operations (the same for every caller): penalties from the token
history -> temperature -> top-k -> top-p -> min-p -> softmax. Truncation
steps keep *ties* at their threshold, so the kept set is a function of the
values alone and never of a sort order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.errors import SamplingError
from localspec.core.validation import setting, validate
from localspec.core.weights import HeadWeights, Weights, exp_scaled, top_indices

#: Top-p needs the sorted head of the distribution; sorting the whole
#: vocabulary (costly at 150k tokens) is only done when this head is too short.
_TOP_P_HEAD = 256


@dataclass(frozen=True)
class SamplingParams:
    """Everything that turns logits into a distribution. Identical for draft and target."""

    temperature: float = setting(0.7, "softmax temperature; 0 = greedy (argmax)", 0.0, 10.0)
    top_k: int = setting(0, "keep the k most likely tokens; 0 = off", 0, None)
    top_p: float = setting(1.0, "keep the smallest set with this much mass; 1 = off", 0.0, 1.0, lo_open=True)
    min_p: float = setting(0.0, "drop tokens below min_p x the top probability; 0 = off", 0.0, 0.999)
    repeat_penalty: float = setting(
        1.0, "divide logits of recent tokens (llama.cpp rule); 1 = off", 0.0, 10.0, lo_open=True
    )
    presence_penalty: float = setting(0.0, "subtract from logits of recent tokens; 0 = off", -10.0, 10.0)
    frequency_penalty: float = setting(0.0, "subtract count x this from logits of recent tokens; 0 = off", -10.0, 10.0)
    penalty_last_n: int = setting(64, "how many recent tokens the penalties look at", 0, 1_000_000)

    def __post_init__(self) -> None:
        validate(self, "sampling")

    @property
    def greedy(self) -> bool:
        """T = 0 means argmax with the lowest token id winning ties."""
        return self.temperature == 0.0

    @property
    def truncates(self) -> bool:
        """Whether top-k, top-p or min-p may remove tokens."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def has_penalties(self) -> bool:
        return self.penalty_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


def pad_logits(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """Return float64 logits of length ``vocab_size``; missing ids get ``-inf`` (zero probability).

    A draft whose vocabulary is a few tokens shorter than the target's simply
    never proposes the missing ids.
    """
    row = np.array(logits, dtype=np.float64)  # always a fresh, writable copy
    if row.ndim != 1:
        raise ValueError(f"expected one logits row, got shape {row.shape}")
    n = row.shape[0]
    if n == vocab_size:
        return row
    if n > vocab_size:
        raise ValueError(f"logits row has {n} entries but the vocabulary has only {vocab_size}")
    out = np.full(vocab_size, -np.inf)
    out[:n] = row
    return out


def apply_penalties(row: np.ndarray, history: Sequence[int], params: SamplingParams) -> None:
    """Penalise tokens seen in the last ``penalty_last_n`` history tokens, in place.

    Same semantics as llama.cpp: a repeated token's positive logit is divided
    by ``repeat_penalty`` and a negative one multiplied; frequency and
    presence penalties subtract ``count * f`` and ``p``.
    """
    if not params.has_penalties or len(history) == 0:
        return
    recent = np.asarray(history[-params.penalty_last_n :], dtype=np.int64)
    recent = recent[(recent >= 0) & (recent < row.shape[0])]
    if recent.size == 0:
        return
    ids, counts = np.unique(recent, return_counts=True)
    vals = row[ids]
    if params.repeat_penalty != 1.0:
        vals = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    vals = vals - counts * params.frequency_penalty - params.presence_penalty
    row[ids] = vals


def log_weights(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] = (),
    vocab_size: int | None = None,
) -> np.ndarray:
    """Unnormalised log-probabilities: ``log p + const``, ``-inf`` for removed tokens.

    This is what the Gumbel-max coupling needs (``argmax(log p + g)`` does
    not depend on the constant) and what :func:`probabilities` normalises.
    Requires ``temperature > 0``.
    """
    if params.greedy:
        raise ValueError("log_weights needs temperature > 0; use greedy_token for T = 0")
    size = vocab_size if vocab_size is not None else len(logits)
    raw = np.asarray(logits)
    if _plain(raw, params, history, size):
        # hot path: max on the input, then one fused convert-and-subtract pass into float64
        best = _checked_max(raw)
        row = np.subtract(raw, np.float64(best), dtype=np.float64)
    else:
        row = pad_logits(logits, size)
        apply_penalties(row, history, params)
        best = _checked_max(row)
        row -= best  # top logit is 0: exp never overflows, even at tiny temperatures
    scale = 1.0 / params.temperature
    if np.isfinite(scale):
        row *= scale  # a multiply is ~3x cheaper than a division over the vocabulary
    else:  # subnormal temperature
        row /= params.temperature
    if params.top_k and params.top_k < row.shape[0]:
        kth = np.partition(row, row.shape[0] - params.top_k)[row.shape[0] - params.top_k]
        row[row < kth] = -np.inf
    if params.top_p < 1.0:
        _truncate_top_p(row, params.top_p)
    if params.min_p > 0.0:
        # max of row is 0, so min_p * max_prob becomes log(min_p) in log space
        row[row < np.log(params.min_p)] = -np.inf
    return row


def _plain(raw: np.ndarray, params: SamplingParams, history: Sequence[int], size: int) -> bool:
    """Whether the raw logits row is the row to transform: full length and no penalty to apply."""
    return raw.ndim == 1 and raw.shape[0] == size and not (params.has_penalties and len(history))


def is_plain_softmax(raw: np.ndarray, params: SamplingParams, history: Sequence[int], size: int) -> bool:
    """Whether the distribution is ``softmax(raw / T)`` itself (no penalty, no filter, a finite 1/T): the
    hot paths then work on the raw logits, with no full-vocabulary transform first."""
    return _plain(raw, params, history, size) and not params.truncates and bool(np.isfinite(1.0 / params.temperature))


def _checked_max(row: np.ndarray) -> float:
    """The row's largest logit, refusing a row with NaN (max propagates it, so one pass checks both) or
    with nothing but -inf."""
    best = row.max()
    if best != best:
        raise SamplingError("logits contain NaN; the model produced an invalid output row")
    if best == -np.inf:
        raise SamplingError("every token has -inf logit; nothing can be sampled")
    return best


def _truncate_top_p(row: np.ndarray, top_p: float) -> None:
    """Keep the smallest head of the distribution whose mass reaches ``top_p`` (ties kept)."""
    weights = np.exp(row)
    total = weights.sum()
    need = top_p * total
    n = weights.shape[0]
    head = min(_TOP_P_HEAD, n)
    if head < n:
        head_w = weights[top_indices(weights, head)]  # largest first
        if head_w.sum() < need:
            head_w = np.sort(weights)[::-1]
    else:
        head_w = np.sort(weights)[::-1]
    cum = np.cumsum(head_w)
    m = int(np.searchsorted(cum, need, side="left"))
    threshold = head_w[min(m, head_w.shape[0] - 1)]
    row[weights < threshold] = -np.inf


def probabilities(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] = (),
    vocab_size: int | None = None,
) -> np.ndarray:
    """The probability vector (float64, sums to 1) that sampling and verification use.

    At ``temperature == 0`` this is the exact one-hot of :func:`greedy_token`.
    The normalised form of :func:`weights`: one transform, so dense rows and the
    hot path's unnormalised rows can never disagree.
    """
    return weights(logits, params, history, vocab_size).dense()


def greedy_token(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] = (),
    vocab_size: int | None = None,
) -> int:
    """Argmax after penalties; the lowest token id wins ties. Needs no softmax."""
    if params.has_penalties and len(history):
        row = pad_logits(logits, vocab_size if vocab_size is not None else len(logits))
        apply_penalties(row, history, params)
    else:
        row = np.asarray(logits)
    token = int(np.argmax(row))  # a NaN anywhere would be returned as the argmax
    if row[token] != row[token]:
        raise SamplingError("logits contain NaN; the model produced an invalid output row")
    if row[token] == -np.inf:
        raise SamplingError("every token has -inf logit; nothing can be sampled")
    return token


def weights(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] = (),
    vocab_size: int | None = None,
) -> Weights:
    """:func:`probabilities` without the normalising pass: same transform, same numbers."""
    size = vocab_size if vocab_size is not None else len(logits)
    if params.greedy:
        out = np.zeros(size)
        out[greedy_token(logits, params, history, size)] = 1.0
        return Weights(out)
    raw = np.asarray(logits)
    if is_plain_softmax(raw, params, history, size):
        return Weights.of_logits(raw, _checked_max(raw), 1.0 / params.temperature)
    row = log_weights(logits, params, history, size)
    np.exp(row, out=row)
    return Weights(row)


#: A model draft proposes only tokens with at least this share of its top token's weight (see
#: :func:`draft_weights`). Teacher-forced on the real pair's replies to the five bench prompts (T = 0.7,
#: 595 positions), the mean acceptance sum(min(p, q)) was 0.7960 with the full q and 0.7964 with this
#: floor, which kept a median of 3 tokens (at most 303) of the 151,936.
DRAFT_FLOOR = 1e-3


def draft_weights(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] = (),
    vocab_size: int | None = None,
    floor: float = DRAFT_FLOOR,
) -> Weights:
    """The distribution a model draft samples its token from: the draft's own (the transform ``p`` gets)
    without the tokens below ``floor`` x its top token's weight, renormalised.

    Rejection sampling is exact for any proposal, provided the token is drawn from the very ``q`` the
    rule divides by and the residual subtracts (docs/design.md, Verification rules), and this one is: a
    :class:`HeadWeights` that draws, and answers ``q(d)``, from the same few weights. What it saves is the
    draft's full-vocabulary pass, normalising ``q`` over 151,936 tokens in float64 and drawing from it
    (docs/performance.md, "The draft proposes from its head"); the kept head costs one comparison over
    the row. What the cut tokens would have won, the renormalised
    head wins back: acceptance did not drop (see :data:`DRAFT_FLOOR`). ``floor = 0`` keeps the full
    distribution."""
    if floor <= 0.0 or params.greedy:
        return weights(logits, params, history, vocab_size)
    size = vocab_size if vocab_size is not None else len(logits)
    raw = np.asarray(logits)
    if is_plain_softmax(raw, params, history, size):  # on the raw row: no full-vocabulary transform
        best = _checked_max(raw)
        scale = 1.0 / params.temperature
        ids = np.flatnonzero(raw >= raw.dtype.type(best + np.log(floor) / scale))
        vals = exp_scaled(raw[ids], np.float64(best), scale, np.empty(ids.shape[0]))
    else:
        row = log_weights(logits, params, history, size)  # top weight exp(0) = 1
        ids = np.flatnonzero(row >= np.log(floor))
        vals = np.exp(row[ids])
    return HeadWeights(ids, vals, size)
