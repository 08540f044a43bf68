"""Counter-based Gumbel-max sampling for the drafter-invariant mode.

The token at a position is a pure function of ``(seed, request_key,
position)`` and that position's logits: Gumbel noise keyed by token id,
``g = -log(-log(u))`` with ``u`` a SplitMix64 hash of the key and the token
id. Nothing depends on how many random numbers were drawn before, so the
draft (any draft, or none) and the target see exactly the same noise at each
position, which is what makes the output independent of the drafter.

Only the *head* of a row needs noise. Tokens more than :data:`HEAD_NATS`
below the best form the *tail*; the largest ``z + g`` over a set ``S`` is
distributed as ``logsumexp(z_S) + Gumbel``, so the tail gets ONE Gumbel
variate, and if it wins, a token is drawn from the tail in proportion to
``exp(z)``. That is the Gumbel-max trick over the alphabet ``head ∪ {tail}``
followed by an exact draw inside the tail: still an exact sample of
``softmax(z)``. The tail almost never wins (its mass is below ``V·e^-20``),
and a cheap upper bound on ``logsumexp(z_S)`` usually proves it without an
``exp`` over the tail. The head is a few percent of the vocabulary, so a
pick costs a fraction of drawing noise for every token (docs/performance.md,
"The loop's own costs").
"""

from __future__ import annotations

import math

import numpy as np

from localspec.core.errors import SamplingError

HEAD_NATS = 20.0  #: tokens within this many nats of the best get their own noise
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_TAIL_GUMBEL_ID = 1 << 62  # noise ids past any vocabulary: the tail's Gumbel ...
_TAIL_DRAW_ID = (1 << 62) + 1  # ... and the uniform of the draw inside the tail
_BOUND_MARGIN = 1e-6  # float64 slack when a bound decides instead of the exact logsumexp


def _mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def stream_key(seed: int, request_key: int, position: int) -> int:
    """The 64-bit key of one position's noise: a hash of (seed, request key, absolute position)."""
    return _mix64(_mix64(_mix64(position + _GOLDEN) ^ (request_key & _MASK64)) ^ (seed & _MASK64))


def uniforms(key: int, ids: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1) with 53 random bits, one per id: SplitMix64 output number ``id + 1`` of seed ``key``."""
    x = np.asarray(ids, dtype=np.uint64) + np.uint64(1)
    x *= np.uint64(_GOLDEN)  # wraps modulo 2**64, as SplitMix64 does
    x += np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    u = (x >> np.uint64(11)).astype(np.float64)
    u += 0.5  # never 0 or 1: the noise is always finite
    u *= 2.0**-53
    return u


def gumbel(key: int, ids: np.ndarray) -> np.ndarray:
    """Gumbel(0, 1) noise for token ids (float64); at most -log(-log(1 - 2**-54)) ≈ 37.4."""
    g = uniforms(key, ids)
    np.log(g, out=g)
    np.negative(g, out=g)
    np.log(g, out=g)
    np.negative(g, out=g)
    return g


def gumbel_max_sample(values: np.ndarray, scale: float, key: int, head_nats: float = HEAD_NATS) -> int:
    """An exact sample of ``softmax(values * scale)``, fixed by ``key``: ``argmax(z + g)`` by token-id noise.

    ``values`` are raw logits (float32, ``scale`` = 1/T) or float64 log-weights
    with ``-inf`` for removed tokens (``scale`` = 1). Raises
    :class:`SamplingError` for NaN or all ``-inf``.
    """
    best = values.max()  # NaN propagates through max
    if best != best:
        raise SamplingError("logits contain NaN; the model produced an invalid output row")
    if best == -np.inf:
        raise SamplingError("every token has -inf logit; nothing can be sampled")
    threshold = best - values.dtype.type(head_nats / scale)  # in the units (and dtype) of ``values``
    head = np.flatnonzero(values >= threshold)
    scores = values[head].astype(np.float64)
    scores *= scale
    scores += gumbel(key, head)
    winner = int(np.argmax(scores))
    top = float(scores[winner])
    n_tail = values.shape[0] - head.shape[0]
    if n_tail == 0:
        return int(head[winner])
    tail_gumbel = float(gumbel(key, np.array([_TAIL_GUMBEL_ID]))[0])
    # every tail value is < threshold, so logsumexp(z_tail) < log(n_tail) + threshold * scale
    if top > math.log(n_tail) + float(threshold) * scale + tail_gumbel + _BOUND_MARGIN:
        return int(head[winner])
    tail = np.flatnonzero(values < threshold)  # -inf entries (removed tokens) get weight 0 below
    z_tail = values[tail].astype(np.float64)
    z_tail *= scale
    tail_best = z_tail.max()
    if tail_best == -np.inf:
        return int(head[winner])
    weights = np.exp(z_tail - tail_best)
    cumulative = np.cumsum(weights)
    if top > tail_best + math.log(cumulative[-1]) + tail_gumbel:
        return int(head[winner])
    u = float(uniforms(key, np.array([_TAIL_DRAW_ID]))[0])
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return int(tail[min(index, tail.shape[0] - 1)])
