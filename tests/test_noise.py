"""The drafter-invariant pick: exact Gumbel-max sampling with noise on the head only.

Chi-square at significance 1e-6 with fixed keys (docs/design.md, Proving exactness), on rows built so
that the *tail* path (one Gumbel for all tokens far below the best, then an
exact draw inside the tail) decides often; negative controls show that the
same statistic catches the ways such a shortcut goes wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.errors import SamplingError
from localspec.core.noise import gumbel, gumbel_max_sample, stream_key, uniforms

from .stats import chi_square

N = 40_000


def softmax(z: np.ndarray) -> np.ndarray:
    w = np.exp(z - z[np.isfinite(z)].max())
    return w / w.sum()


def counts(sample, values: np.ndarray, scale: float, seed: int = 7) -> np.ndarray:
    out = np.zeros(values.shape[0])
    for position in range(N):
        out[sample(values, scale, stream_key(seed, 3, position))] += 1
    return out


# Wide rows with a small head (1.5 nats): most tokens are in the tail, which wins ~40 % of the time.
WIDE = np.array([0.0, -0.4, -1.0, -1.6, -2.0, -2.2, -2.5, -3.0, -3.5, -4.0, -5.0, -6.0], dtype=np.float32)


def head_nats_small(values, scale, key):
    return gumbel_max_sample(values, scale, key, head_nats=1.5)


@pytest.mark.parametrize(
    "values, scale",
    [
        (WIDE, 1.0),  # float32 logits, T = 1
        (WIDE, 1 / 0.7),  # T = 0.7
        (np.where(np.arange(12) % 4 == 3, -np.inf, WIDE.astype(np.float64)), 1.0),  # removed tokens in head and tail
    ],
    ids=["T=1", "T=0.7", "with -inf"],
)
def test_head_and_tail_sample_exactly_from_softmax(values: np.ndarray, scale: float) -> None:
    expected = softmax(values.astype(np.float64) * scale)
    result = chi_square(counts(head_nats_small, values, scale), expected)
    print(f"\n  gumbel head/tail {values.dtype} scale {scale:.3f}: {result}")
    assert result.passed, result


def head_only(values, scale, key):
    """Bug: forget the tail (as if tokens far below the best could never be drawn)."""
    head = np.flatnonzero(values >= values.max() - 1.5 / scale)
    return int(head[np.argmax(values[head] * scale + gumbel(key, head))])


def tail_by_its_best(values, scale, key):
    """Bug: give the tail the Gumbel of its best token instead of logsumexp (underweights it)."""
    threshold = values.max() - 1.5 / scale
    head = np.flatnonzero(values >= threshold)
    tail = np.flatnonzero(values < threshold)
    scores = values[head] * scale + gumbel(key, head)
    tail_score = values[tail].max() * scale + gumbel(key, np.array([1 << 62]))[0]
    if scores.max() > tail_score:
        return int(head[np.argmax(scores)])
    return int(tail[np.argmax(values[tail])])


def fresh_uniform_per_call(values, scale, key, _rng=np.random.default_rng(5)):
    """Bug: noise drawn once per call and shared by all tokens (perfectly correlated)."""
    g = -np.log(-np.log(_rng.random()))
    return int(np.argmax(values * scale + g))


@pytest.mark.parametrize("broken", [head_only, tail_by_its_best, fresh_uniform_per_call])
def test_negative_controls_fail(broken) -> None:
    result = chi_square(counts(broken, WIDE, 1.0), softmax(WIDE.astype(np.float64)))
    print(f"\n  negative control {broken.__name__}: {result}")
    assert not result.passed, f"{broken.__name__} was not detected: {result}"


def test_without_a_tail_it_is_the_plain_gumbel_max_trick() -> None:
    rng = np.random.default_rng(0)
    for position in range(200):
        values = (rng.standard_normal(1000) * 3).astype(np.float32)
        key = stream_key(11, 2, position)
        full = int(np.argmax(values.astype(np.float64) * 2.0 + gumbel(key, np.arange(1000))))
        assert gumbel_max_sample(values, 2.0, key, head_nats=np.inf) == full
        assert gumbel_max_sample(values, 2.0, key) == full  # the default head holds every likely winner


def test_noise_is_a_pure_function_of_key_and_token_id() -> None:
    key = stream_key(1, 2, 3)
    ids = np.array([5, 17, 40_000])
    assert np.array_equal(gumbel(key, ids), gumbel(key, ids[::-1])[::-1])
    assert np.array_equal(gumbel(key, ids)[1:], gumbel(key, np.arange(49_152))[ids[1:]])
    assert stream_key(1, 2, 3) != stream_key(1, 2, 4) != stream_key(2, 2, 4)
    u = uniforms(key, np.arange(200_000))
    assert 0.0 < u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005


def test_bad_rows_are_errors() -> None:
    with pytest.raises(SamplingError, match="NaN"):
        gumbel_max_sample(np.array([0.0, np.nan], dtype=np.float32), 1.0, 1)
    with pytest.raises(SamplingError, match="-inf"):
        gumbel_max_sample(np.full(4, -np.inf), 1.0, 1)
