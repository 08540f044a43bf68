"""Distributions kept unnormalised, and the draws from them: what the hot path passes around.

:func:`localspec.core.sampling.weights` makes a :class:`Weights` from a row of logits by the one
transform both models are judged by; this module holds what happens next. A rule reads single
probabilities, a few draws and, after a rejection, a residual; none of them writes the full
float64 row unless asked, and every path computes each weight by the same operations on the same
inputs, so every path sees the same numbers (docs/design.md, "A draw without the total").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from localspec.core.errors import SamplingError

#: Inverse-CDF sampling works on blocks: a cumulative sum over a whole row cannot
#: be vectorised, the sums of 256-entry blocks can (a tenth of its cost).
_SAMPLE_BLOCK = 256

#: The hot path (no filter, no penalty) never writes a whole row: it computes the weights one slice at
#: a time into a small buffer that stays in the core's cache, keeping only each slice's sum. Writing
#: the 1.2 MB float64 row of every verified position (V = 151,936) went to memory and page-faulted
#: (docs/performance.md, "Borrowed rows, one-element probabilities, a residual drawn by rejection").
_SLICE = 32768

#: A draw that needs no probability (the target alone's token, a bonus token) reads only the row's head:
#: the tokens whose logit lies above a cut where a weight is ``1 / V`` of the top token's. Every other token
#: weighs at most that, so the tail's bound totals at most the top token's weight (:meth:`Weights.sample`).
#: A row with more than ``V / _HEAD_SHARE`` tokens above the cut (a flat row: a high temperature, a model
#: with random weights) draws under float32 bounds of its blocks instead, which cost less than such a head.
_HEAD_SHARE = 64
#: The tail's bound is the cut's own weight times ``1 + _TAIL_SLACK``: a weight is computed by monotone
#: roundings and an exp within an ulp or two, so a logit at or below the cut weighs at most that.
_TAIL_SLACK = 1e-9
#: Bounds of a row's total decide a rule's comparison only beyond this relative margin: far beyond the
#: rounding of the total as :attr:`Weights.total` computes it, so a decision is the one the exact
#: comparison makes (:meth:`Weights.prob_exceeds`).
_TOTAL_MARGIN = 1e-9

#: A flat row's draw alone proposes a block of this many tokens from float32 upper bounds of the blocks'
#: masses, then accepts it with its float64 mass over the bound (:meth:`Weights.sample`). A float32 bound
#: is a block's float32 sum of weights times ``1 + _BOUND_SLACK``, plus ``_BOUND_FLOOR`` per token for
#: weights that float32 flushes to zero: the errors it must cover are below 2e-4 of a block's mass
#: (docs/design.md, "A draw without the total").
_BOUND_BLOCK = 2048
_BOUND_SLACK = 1e-3
_BOUND_FLOOR = 2.0**-125
_BOUND_SCALE_MAX = 1e30  # 1/T beyond float32's comfortable range: the float64 pass instead
assert _SLICE % _BOUND_BLOCK == 0  # a slice's blocks are whole (_block_bounds indexes them from its start)


def sample_index(weights: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index with probability proportional to ``weights`` (non-negative).

    Inverse-CDF with a single uniform; a zero-weight index is never returned.
    The CDF is searched in two levels (sums of fixed blocks, then one block),
    so only one block of the vocabulary is ever cumulatively summed.
    """
    if isinstance(weights, Weights):
        return weights.sample(rng)
    cdf, block = _block_cdf(weights)
    total = cdf[-1]
    if not total > 0.0:
        raise SamplingError("cannot sample from a distribution with zero total mass")
    return _index_at(weights, rng.random() * total, cdf, block)


def _block_cdf(weights: np.ndarray) -> tuple[np.ndarray, int]:
    """Cumulative sums of ``weights`` by blocks of :data:`_SAMPLE_BLOCK`, and the block size (1 for a short row)."""
    n = weights.shape[0]
    if n < 4 * _SAMPLE_BLOCK:
        return weights.cumsum(), 1
    nb = n // _SAMPLE_BLOCK
    body = nb * _SAMPLE_BLOCK
    sums = np.empty(nb + (body < n))
    np.add.reduce(weights[:body].reshape(nb, _SAMPLE_BLOCK), axis=1, out=sums[:nb])
    if body < n:
        sums[nb] = weights[body:].sum()
    return np.cumsum(sums), _SAMPLE_BLOCK


def _index_at(weights: np.ndarray, x: float, cdf: np.ndarray, block: int) -> int:
    """The first index whose cumulative weight exceeds ``x`` (never one of zero weight)."""
    b = int(cdf.searchsorted(x, side="right"))
    if b >= cdf.shape[0]:  # x is u * total rounded up to the total
        return int(np.flatnonzero(weights)[-1])
    if block == 1:
        return b
    base = cdf[b - 1] if b else 0.0
    start = b * block
    segment = weights[start : start + block]
    j = int(segment.cumsum().searchsorted(x - base, side="right"))
    if j >= segment.shape[0]:  # the block sum and its cumsum rounded differently
        j = int(np.flatnonzero(segment)[-1])
    return start + j


def exp_scaled(raw: np.ndarray, best: np.float64, scale: float, out: np.ndarray) -> np.ndarray:
    """``exp((raw - best) * scale)`` in float64, written into ``out``: the one way a weight is computed from
    a raw logit (a slice of a row, one element of it, a draft's head), so every path gets the same bits.
    Cast, then subtract: the fused ``subtract(raw, best, dtype=float64)``'s bits, faster (a plain cast loop,
    no casting buffer)."""
    np.copyto(out, raw)
    out -= best
    out *= scale
    np.exp(out, out=out)
    return out


def _tail_cut(raw: np.ndarray, best: np.float64, scale: float, depth: int = 1) -> tuple[np.generic, float]:
    """A cut between a row's head and tail (a logit in the row's own dtype) and the most a token at or below
    it can weigh: the cut's weight, its exponent rounded as every weight's is (:func:`exp_scaled`), with the
    slack of :data:`_TAIL_SLACK` (the math library's exp and numpy's differ by an ulp at most). The cut is
    where a weight is ``V ** -depth``; rounded to the row's dtype it may sit a little higher, and the bound
    follows the rounded cut."""
    cut = raw.dtype.type(float(best) - depth * math.log(raw.shape[0]) / scale)
    weight = math.exp((float(cut) - float(best)) * scale)
    return cut, weight * (1.0 + _TAIL_SLACK)


@dataclass(frozen=True)
class _Head:
    """A row's head (the tokens above the ``1 / V`` cut) with its float64 weights and their cumulative
    sums, and the bound on every other token's weight (see :meth:`Weights.sample`)."""

    tokens: np.ndarray
    weights: np.ndarray
    cdf: np.ndarray
    block: int
    tail: float


def _block_bounds(raw: np.ndarray, best: np.float64, scale: float) -> np.ndarray:
    """An upper bound of each :data:`_BOUND_BLOCK` block's float64 mass ``sum(exp((raw - best) * scale))``,
    from the same arithmetic in float32 (a third of the time)."""
    n = raw.shape[0]
    bounds = np.empty(-(-n // _BOUND_BLOCK))
    scratch = np.empty(min(_SLICE, n), dtype=np.float32)
    best32, scale32 = np.float32(best), np.float32(scale)
    for start in range(0, n, _SLICE):  # a slice stays in the core's cache
        part = scratch[: min(_SLICE, n - start)]
        np.subtract(raw[start : start + _SLICE], best32, out=part)
        np.multiply(part, scale32, out=part)
        np.exp(part, out=part)
        whole, first = part.shape[0] // _BOUND_BLOCK, start // _BOUND_BLOCK
        bounds[first : first + whole] = np.add.reduce(part[: whole * _BOUND_BLOCK].reshape(whole, _BOUND_BLOCK), axis=1)
        if whole * _BOUND_BLOCK < part.shape[0]:
            bounds[first + whole] = part[whole * _BOUND_BLOCK :].sum()
    sizes = np.full(bounds.shape[0], float(_BOUND_BLOCK))
    sizes[-1] = n - (bounds.shape[0] - 1) * _BOUND_BLOCK
    return bounds * (1.0 + _BOUND_SLACK) + sizes * _BOUND_FLOOR


def top_indices(values: np.ndarray, n: int, stride: int = 64) -> np.ndarray:
    """The indices of the ``n`` largest of ``values``, largest first, ties by the lower index. The
    ``n``-th largest of every ``stride``-th value is at most the row's, so the values at or above it
    hold the winners: a sort of a few hundred instead of the whole row (151,936 for Qwen)."""
    candidates = None
    sample = values[::stride]
    if sample.shape[0] > n:
        bound = np.partition(sample, sample.shape[0] - n)[sample.shape[0] - n]
        candidates = np.flatnonzero(values >= bound)
    if candidates is None or candidates.shape[0] < n:  # a short row (or a NaN bound, which rows never hold)
        candidates = np.arange(values.shape[0])
    found = values[candidates]
    last = np.partition(found, found.shape[0] - n)[found.shape[0] - n]  # the n-th largest
    winners = np.concatenate([candidates[found > last], candidates[found == last]])[:n]  # ties: lower first
    return winners[np.lexsort((winners, -values[winners]))]


class Weights:
    """A distribution kept unnormalised, ``p = w / total``: what the hot path passes around.

    Speculative rules mostly need *one* probability per row (``p(d)``, ``q(d)``)
    and a few draws; a rejection's residual, where it is computed at all, is
    another such row (:meth:`residual`), and only the one-hot rule's needs a
    normalised full row. ``prob(t)`` is bit-identical to
    ``probabilities(...)[t]`` (same division), so the rules decide exactly as
    on dense rows.

    Built by :meth:`of_logits`, the row is never written whole unless asked
    for (``w``, ``dense``): a probability computes its one element, a draw
    finds its slice from the slice sums and reads that slice alone. Each
    slice is computed by the same operations on the same inputs every time,
    so every path sees the same numbers.
    """

    __slots__ = ("_w", "_total", "_dense", "_raw", "_best", "_scale", "_masses", "_parts", "_head", "_bounds")

    def __init__(self, w: np.ndarray) -> None:
        self._w: np.ndarray | None = w
        self._raw: np.ndarray | None = None
        self._parts: tuple[Weights, Weights] | None = None
        self._dense: np.ndarray | None = None
        self._set_total(float(w.sum()))

    @classmethod
    def of_logits(cls, raw: np.ndarray, best: float, scale: float) -> Weights:
        """``exp((raw - best) * scale)`` in float64, as sums of slices summed when first needed (a draw
        alone needs none); no full row is written. Keeps ``raw`` (read again for a probability or a
        draw): the caller must not change it."""
        self = cls.__new__(cls)
        self._w, self._dense, self._parts, self._masses, self._total = None, None, None, None, None
        self._head, self._bounds = None, None  # computed when first asked for (False: none for this row)
        self._raw, self._best, self._scale = raw, np.float64(best), scale
        return self

    def rebind(self, raw: np.ndarray, copy: np.ndarray) -> None:
        """Read ``copy`` from now on wherever this row read ``raw`` (an equal copy of it), so the buffer
        ``raw`` lives in may be reused: a draft row borrowed from llama.cpp's output buffer."""
        if self._raw is raw:
            self._raw = copy

    @classmethod
    def residual(cls, p: Weights, q: Weights) -> Weights:
        """``max(0, p / p.total - q / q.total)``, unnormalised (the residual of docs/design.md, Verification
        rules): with both rows in slices, slice by slice like :meth:`of_logits`, so a rejection writes no
        full row either (the dense rows, their difference and its cumulative sums were seven passes over 1.2 MB each at
        V = 151,936). Every element is the same operations on the same numbers as on the dense rows."""
        self = cls.__new__(cls)
        self._w, self._dense, self._raw, self._parts = None, None, None, (p, q)
        self._sum_slices()
        return self

    @property
    def total(self) -> float:
        """The row's total weight, ``p = w / total``."""
        if self._total is None:
            self._sum_slices()
        return self._total

    def _sum_slices(self) -> None:
        size = self.shape[0]
        scratch = np.empty(min(_SLICE, size))
        self._masses = [float(self._slice(start, scratch).sum()) for start in range(0, size, _SLICE)]
        self._set_total(sum(self._masses))

    def _set_total(self, total: float) -> None:
        if not total > 0.0:
            raise SamplingError("cannot sample from a distribution with zero total mass")
        self._total = total

    def _slice(self, start: int, out: np.ndarray | None = None, size: int = _SLICE) -> np.ndarray:
        """The weights from ``start``, ``size`` of them (read from the full row once it exists). A token's
        probability asks for one element: numpy's exp gives an element the same bits alone as inside a
        slice (its vector loop masks the tail; the tests compare every path), at a small fraction of
        the slice's cost."""
        if self._w is not None:
            return self._w[start : start + size]
        if self._parts is not None:  # never in place on a part's own slice: it may be that part's full row
            p, q = self._parts
            p_part = p._slice(start, out, size)
            part = np.divide(p_part, p.total, out=out[: p_part.shape[0]] if out is not None else None)
            part -= q._slice(start, None, size) / q.total
            np.maximum(part, 0.0, out=part)
            return part
        raw = self._raw[start : start + size]
        part = (out if out is not None else np.empty(raw.shape[0]))[: raw.shape[0]]
        return exp_scaled(raw, self._best, self._scale, part)

    @property
    def w(self) -> np.ndarray:
        """The full unnormalised row (written on first use)."""
        if self._w is None:
            row = np.empty(self.shape[0])
            for start in range(0, row.shape[0], _SLICE):
                self._slice(start, row[start : start + _SLICE])
            self._w = row
        return self._w

    @property
    def shape(self) -> tuple[int, ...]:
        if self._w is not None:
            return self._w.shape
        return self._raw.shape if self._raw is not None else self._parts[0].shape

    def prob(self, token: int) -> float:
        if self._w is not None:
            return float(self._w[token] / self.total)
        return float(self._slice(token, size=1)[0] / self.total)

    def top(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` most likely tokens, most likely first, and their probabilities (as ``prob`` gives
        them). Without a full row, the order of the logits is the order of the weights (the transform
        is increasing), so only the winners' weights are computed."""
        n = min(n, self.shape[0])
        tokens = top_indices(self._raw if self._raw is not None else self.w, n)
        probs = np.array([self.prob(int(t)) for t in tokens])
        order = np.lexsort((tokens, -probs))  # most likely first; ties by token id
        return tokens[order], probs[order]

    def dense(self) -> np.ndarray:
        """The normalised row (computed once, on demand)."""
        if self._dense is None:
            self._dense = self.w / self.total
        return self._dense

    def sample(self, rng: np.random.Generator) -> int:
        if self._w is not None:
            return sample_index(self._w, rng)
        if self._masses is None and self._raw is not None and self._bounded():
            token = self._sample_by_head(rng)
            return token if token is not None else self._sample_by_bounds(rng)
        x = rng.random() * self.total
        below, last = 0.0, 0  # the mass of the slices before this one; the last slice with mass
        for i, mass in enumerate(self._masses):
            if x < below + mass:
                part = self._slice(i * _SLICE)
                return i * _SLICE + _index_at(part, x - below, *_block_cdf(part))
            below += mass
            last = i if mass > 0.0 else last
        part = self._slice(last * _SLICE)  # x is u * total rounded up to the total
        return last * _SLICE + int(np.flatnonzero(part)[-1])

    def _bounded(self) -> bool:
        return bool(np.isfinite(self._best)) and 0.0 < self._scale <= _BOUND_SCALE_MAX

    def _sample_by_bounds(self, rng: np.random.Generator) -> int:
        """A draw with the law of :meth:`sample` without the float64 pass over the row: a uniform point
        under the blocks' float32 upper bounds picks a block; the point lies under the block's float64
        mass with probability mass / bound, and then picks the token by the block's cumulative weights
        (computed as every path computes them). Otherwise a new point: so each token is drawn with
        probability proportional to its float64 weight. About 1 draw in 1,000 takes a second point."""
        bounds = np.cumsum(_block_bounds(self._raw, self._best, self._scale))
        segment = np.empty(min(_BOUND_BLOCK, self._raw.shape[0]))
        while True:
            x = rng.random() * bounds[-1]
            b = min(int(bounds.searchsorted(x, side="right")), bounds.shape[0] - 1)
            y = x - (bounds[b - 1] if b else 0.0)  # uniform under block b's bound
            raw = self._raw[b * _BOUND_BLOCK : (b + 1) * _BOUND_BLOCK]
            cdf = exp_scaled(raw, self._best, self._scale, segment[: raw.shape[0]]).cumsum()
            if y < cdf[-1]:
                return b * _BOUND_BLOCK + int(cdf.searchsorted(y, side="right"))

    def _head_of(self) -> _Head | None:
        """The row's head (computed once), or None for a flat row (see :data:`_HEAD_SHARE`)."""
        if self._head is None:
            self._head = False
            raw, best, scale = self._raw, self._best, self._scale
            n = raw.shape[0]
            cut, tail = _tail_cut(raw, best, scale)
            above = raw > cut
            m = int(np.count_nonzero(above))
            if 0 < m <= n // _HEAD_SHARE and tail * (n - m) <= 2.0:  # else flat, or a cut rounded up to the top
                tokens = np.flatnonzero(above)
                w = exp_scaled(raw[tokens], best, scale, np.empty(m))
                self._head = _Head(tokens, w, *_block_cdf(w), tail)
        return self._head or None

    def _sample_by_head(self, rng: np.random.Generator) -> int | None:
        """A draw with the law of :meth:`sample` that computes the head's weights alone (None for a flat
        row). A uniform point lies under the head's cumulative weights, which pick its token, or in the
        tail: ``V - m`` cells, one per tail token, each as wide as the tail's bound. A point in a cell
        picks its token if it lies under that token's weight, else a new point is drawn. So every token
        is drawn with probability proportional to its float64 weight, and the tail, whose bound totals at
        most the top token's weight, takes at most half the points."""
        head = self._head_of()
        if head is None:
            return None
        n, m, tail = self._raw.shape[0], head.tokens.shape[0], head.tail
        head_mass, tail_mass = float(head.cdf[-1]), tail * (n - m)
        skipped = head.tokens - np.arange(m)  # tail tokens before each head token
        while True:
            x = rng.random() * (head_mass + tail_mass)
            if x < head_mass:
                return int(head.tokens[_index_at(head.weights, x, head.cdf, head.block)])
            cell = min(int((x - head_mass) / tail), n - m - 1)
            token = cell + int(skipped.searchsorted(cell, side="right"))  # the cell-th tail token
            if (x - head_mass) - cell * tail < self._slice(token, size=1)[0]:
                return token

    def prob_exceeds(self, token: int, level: float) -> bool | None:
        """Whether ``p(token) > level``, decided without the float64 pass over the row where bounds of
        the total settle it (:meth:`_total_bounds`); None where they do not, and the caller computes
        ``p``. A decision is the exact comparison's: the bounds hold the computed total with a margin far
        beyond its rounding (:data:`_TOTAL_MARGIN`)."""
        if level < 0.0:
            return True
        if level >= 1.0:
            return False  # p <= 1
        if self._raw is None or self._total is not None or not self._bounded():
            return None  # the total is known (a probability is one division) or no bounds exist
        weight = float(self._slice(token, size=1)[0])
        if level == 0.0:
            return weight > 0.0
        bounds = self._total_bounds()
        if bounds is None:
            return None
        low, high = bounds
        if weight > level * high:
            return True
        if weight <= level * low:
            return False
        return None

    def _total_bounds(self) -> tuple[float, float] | None:
        """Bounds ``low <= total <= high`` from the row's head (computed once; None for a flat row): the
        head's weights summed, the tokens between the head's ``1 / V`` cut and a ``1 / V**2`` cut counted
        and each bounded by the first cut's weight, every other token by the second's (docs/design.md,
        "Decisions without the total")."""
        if self._bounds is None:
            self._bounds = False
            head = self._head_of()
            if head is not None:
                raw, n, m = self._raw, self._raw.shape[0], head.tokens.shape[0]
                far_cut, far = _tail_cut(raw, self._best, self._scale, depth=2)
                between = int(np.count_nonzero(raw > far_cut)) - m
                mass = float(head.cdf[-1])
                high = mass + between * head.tail + (n - m - between) * far
                self._bounds = (mass * (1.0 - _TOTAL_MARGIN), high * (1.0 + _TOTAL_MARGIN))
        return self._bounds or None

    def __getitem__(self, token):  # row[token] -> probability, as on a dense row
        if isinstance(token, (int, np.integer)):
            return self.prob(int(token))
        return self.dense()[token]

    def __array__(self, dtype=None, copy=None):  # np.asarray(row) -> the dense row
        dense = self.dense()
        return dense if dtype is None else dense.astype(dtype)


class HeadWeights(Weights):
    """A distribution on a few tokens, every other token at weight 0: sorted ``ids`` and their unnormalised
    weights. What :func:`draft_weights` proposes from; answers like any :class:`Weights` (a probability,
    a draw, the top, a slice of the full row for a rejection's residual) from those few numbers."""

    __slots__ = ("_ids", "_vals", "_size")

    def __init__(self, ids: np.ndarray, vals: np.ndarray, size: int) -> None:
        self._w, self._dense, self._raw, self._parts = None, None, None, None
        self._ids, self._vals, self._size = ids, vals, size
        self._set_total(float(vals.sum()))

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._size,)

    def _slice(self, start: int, out: np.ndarray | None = None, size: int = _SLICE) -> np.ndarray:
        n = min(size, self._size - start)
        part = out[:n] if out is not None else np.empty(n)
        part.fill(0.0)
        lo, hi = np.searchsorted(self._ids, (start, start + n))
        part[self._ids[lo:hi] - start] = self._vals[lo:hi]
        return part

    def prob(self, token: int) -> float:
        j = int(np.searchsorted(self._ids, token))
        if j < self._ids.shape[0] and self._ids[j] == token:
            return float(self._vals[j] / self.total)
        return 0.0

    def sample(self, rng: np.random.Generator) -> int:
        x = rng.random() * self.total
        return int(self._ids[_index_at(self._vals, x, self._vals.cumsum(), 1)])

    def top(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        order = np.lexsort((self._ids, -self._vals))[:n]  # most likely first; ties by token id
        return self._ids[order], self._vals[order] / self.total


def prob_of(row, token: int) -> float:
    """``row[token]`` for a dense row or a :class:`Weights`."""
    return row.prob(token) if isinstance(row, Weights) else float(row[token])


def prob_exceeds(row, token: int, level: float) -> bool | None:
    """Whether ``row[token] > level`` where a :class:`Weights` decides it without its total (see
    :meth:`Weights.prob_exceeds`), else None."""
    return row.prob_exceeds(token, level) if isinstance(row, Weights) else None


def residual_of(p_row: np.ndarray | Weights, q_row: np.ndarray | Weights) -> Weights:
    """``max(0, p - q)`` unnormalised, for dense rows or :class:`Weights` (in slices where both are)."""
    if _sliced(p_row) and _sliced(q_row) and p_row.shape == q_row.shape:
        return Weights.residual(p_row, q_row)
    row = np.subtract(dense_of(p_row), dense_of(q_row))
    np.maximum(row, 0.0, out=row)
    return Weights(row)


def _sliced(row) -> bool:
    return isinstance(row, Weights) and row._w is None


def dense_of(row) -> np.ndarray:
    """The normalised full row of a dense row or a :class:`Weights`."""
    return row.dense() if isinstance(row, Weights) else row
