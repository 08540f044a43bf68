"""The sampling transform and the verification rules, without sampling statistics.

Algebra of docs/design.md (Proving exactness) (the residual identity and its edge cases), the
transform's edge cases, and hypothesis property tests over random logits,
temperatures, truncations and vocabulary sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.core.errors import ConfigError, SamplingError
from localspec.core.sampling import (
    SamplingParams,
    apply_penalties,
    greedy_token,
    log_weights,
    pad_logits,
    probabilities,
    weights,
)
from localspec.core.verify import (
    RESIDUAL_DRAWS,
    acceptance_rate,
    draw_from_residual,
    verify_onehot,
    verify_picks,
    verify_rejection,
    verify_token_match,
)
from localspec.core.weights import Weights, residual_of, sample_index, top_indices

from .stats import chi_square


class AlwaysReject:
    """A generator whose uniforms are all just below 1: every draft token with p < q is rejected."""

    def random(self) -> float:
        return 1.0 - 1e-12


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The distribution ``verify_rejection`` draws its correction from, captured at its last ``sample_index``
    call.

    The draft token is the one q favours most over p, so a rejection is possible; ``AlwaysReject`` makes it
    happen. The draws from p that a rejection tries first (``draw_from_residual``) all come back as that
    token, where p - q < 0, so none is kept and the residual row is computed and drawn from. What is
    tested is the production code's residual, not a formula restated here.
    """
    from unittest import mock

    import localspec.core.verify as verify

    captured: list[np.ndarray] = []
    token = int(np.argmax(q - p))

    def capture(row, rng):
        row = np.asarray(row, dtype=np.float64)
        captured.append(row / row.sum())
        return token

    with mock.patch.object(verify, "sample_index", capture):
        verdict = verify_rejection([token], [q], [p, p], AlwaysReject())
    assert verdict.n_accepted == 0 and len(captured) == verify.RESIDUAL_DRAWS + 1
    return captured[-1]


def decomposes(p: np.ndarray, q: np.ndarray, residual_row: np.ndarray | None = None) -> bool:
    """min(p, q) + (1 - sum min(p, q)) * residual == p, elementwise (docs/design.md, Proving exactness), with
    the production residual unless another row is given (the negative controls)."""
    m = np.minimum(p, q)
    rejection = 1.0 - m.sum()
    if rejection <= 1e-15:
        return np.allclose(m, p, atol=1e-15)
    row = residual(p, q) if residual_row is None else residual_row
    return np.allclose(m + rejection * row, p, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# algebra
# ---------------------------------------------------------------------------
def test_residual_identity_on_random_pairs() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = int(rng.integers(2, 50))
        p = probabilities(rng.normal(size=v) * 3, SamplingParams(temperature=0.8))
        q = probabilities(rng.normal(size=v) * 3, SamplingParams(temperature=1.3))
        assert decomposes(p, q)
        # negative controls: bug 3 of docs/design.md, Verification rules (the residual replaced by p), and
        # q in place of p - q
        assert not decomposes(p, q, p) and not decomposes(p, q, q)


def test_identical_distributions_always_accept() -> None:
    p = probabilities(np.array([1.0, 2.0, 3.0, 0.5]), SamplingParams(temperature=1.0))
    assert acceptance_rate(p, p) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    for _ in range(100):
        d = sample_index(p, rng)
        verdict = verify_rejection([d], [p], [p, p], rng)
        assert verdict.n_accepted == 1 and verdict.bonus


def test_disjoint_supports_always_reject_and_correct_from_p() -> None:
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.3, 0.7])
    assert acceptance_rate(p, q) == 0.0
    assert decomposes(p, q)
    assert np.allclose(residual(p, q), p)
    rng = np.random.default_rng(0)
    for _ in range(50):
        verdict = verify_rejection([3], [q], [p, p], rng)
        assert verdict.n_accepted == 0 and verdict.token in (0, 1)


def test_neg_inf_logits_have_zero_probability_and_never_sampled() -> None:
    logits = np.array([-np.inf, 1.0, -np.inf, 0.5, 2.0])
    p = probabilities(logits, SamplingParams(temperature=0.7))
    assert p[0] == 0.0 and p[2] == 0.0 and p.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    assert {sample_index(p, rng) for _ in range(500)} <= {1, 3, 4}


def test_onehot_draft_rule_is_the_residual_rule_specialised() -> None:
    p = np.array([0.1, 0.6, 0.3])
    onehot = np.array([0.0, 1.0, 0.0])
    assert decomposes(p, onehot)
    assert np.allclose(residual(p, onehot), [0.25, 0.0, 0.75])
    # one-hot verification never emits the rejected token
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = verify_onehot([1], [p, p], rng)
        if v.n_accepted == 0:
            assert v.token != 1
        assert v.checks[0].accept_prob == pytest.approx(0.6)


def test_smaller_draft_vocabulary_is_padded_with_zero_probability() -> None:
    draft_logits = np.array([0.2, 1.5, -0.3], dtype=np.float32)
    q = probabilities(draft_logits, SamplingParams(temperature=1.0), vocab_size=5)
    assert q.shape == (5,) and q[3] == 0.0 and q[4] == 0.0
    p = probabilities(np.array([0.0, 1.0, 0.0, 3.0, 0.5]), SamplingParams(temperature=1.0))
    assert decomposes(p, q)
    # tokens the draft cannot propose keep their full target mass in the residual
    r = residual(p, q)
    assert r[3] > 0 and r[4] > 0


def test_rejection_emits_residual_token_never_a_token_where_q_dominates() -> None:
    p = np.array([0.7, 0.2, 0.1])
    q = np.array([0.1, 0.6, 0.3])
    rng = np.random.default_rng(5)
    for _ in range(300):
        v = verify_rejection([1], [q], [p, p], rng)
        if v.n_accepted == 0:
            assert v.token == 0  # p - q > 0 only at token 0
            assert v.residual_mass is None or v.residual_mass == pytest.approx(0.6)  # known where computed


def test_verdict_details_are_complete() -> None:
    p = np.array([0.5, 0.5])
    q = np.array([0.25, 0.75])
    rng = np.random.default_rng(0)
    v = verify_rejection([0, 1], [q, q], [p, p, p], rng)
    first = v.checks[0]
    assert first.p == 0.5 and first.q == 0.25 and first.accept_prob == 1.0 and first.accepted
    assert 0.0 <= first.uniform < 1.0


def test_greedy_and_coupled_rules() -> None:
    assert verify_picks([3, 4, 5], [3, 4, 9, 1]).n_accepted == 2
    v = verify_picks([3, 4], [3, 4, 7])
    assert v.bonus and v.token == 7
    v = verify_picks([1, 2], [1, 5, 0])
    assert v.n_accepted == 1 and v.token == 5 and not v.bonus


def test_token_match_keeps_only_equal_samples() -> None:
    p = np.array([0.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    v = verify_token_match([1, 0], [p, p, p], rng)
    assert v.n_accepted == 1 and v.token == 1 and not v.bonus


def test_zero_q_for_the_draft_token_is_refused() -> None:
    with pytest.raises(ValueError, match="q = 0"):
        verify_rejection([0], [np.array([0.0, 1.0])], [np.array([0.5, 0.5])] * 2, np.random.default_rng(0))


# ---------------------------------------------------------------------------
# the transform
# ---------------------------------------------------------------------------
def test_temperature_zero_is_exact_onehot_with_lowest_id_tie_break() -> None:
    logits = np.array([1.0, 3.0, 3.0, 2.0])
    p = probabilities(logits, SamplingParams(temperature=0.0))
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert greedy_token(logits, SamplingParams(temperature=0.0)) == 1


def test_all_equal_logits_give_uniform() -> None:
    p = probabilities(np.zeros(7), SamplingParams(temperature=0.5))
    assert np.allclose(p, 1 / 7)


def test_top_k_larger_than_vocabulary_is_a_no_op() -> None:
    logits = np.array([0.1, 0.2, 0.3])
    a = probabilities(logits, SamplingParams(temperature=1.0, top_k=100))
    b = probabilities(logits, SamplingParams(temperature=1.0))
    assert np.array_equal(a, b)


def test_top_k_keeps_k_tokens() -> None:
    logits = np.array([0.1, 5.0, 0.3, 4.0, 3.0])
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.flatnonzero(p).tolist() == [1, 3]


def test_top_p_keeps_the_smallest_head_reaching_the_mass() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    p = probabilities(np.log(probs), SamplingParams(temperature=1.0, top_p=0.79))
    assert np.flatnonzero(p).tolist() == [0, 1]
    p = probabilities(np.log(probs), SamplingParams(temperature=1.0, top_p=0.81))
    assert np.flatnonzero(p).tolist() == [0, 1, 2]


def test_top_p_head_and_full_sort_agree_on_a_large_vocabulary() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(size=20_000) * 0.5  # flat: the head path must fall back to a full sort
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.5))
    kept = np.flatnonzero(p)
    ref = np.sort(probabilities(logits, SamplingParams(temperature=1.0)))[::-1]
    m = int(np.searchsorted(np.cumsum(ref), 0.5)) + 1
    assert len(kept) == m


def test_min_p_drops_tokens_below_a_fraction_of_the_top() -> None:
    probs = np.array([0.6, 0.3, 0.06, 0.04])
    p = probabilities(np.log(probs), SamplingParams(temperature=1.0, min_p=0.1))
    assert np.flatnonzero(p).tolist() == [0, 1]


def test_penalties_follow_llama_cpp_semantics() -> None:
    row = np.array([2.0, -2.0, 1.0, 1.0])
    apply_penalties(row, [0, 1, 1], SamplingParams(repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25))
    assert row.tolist() == [2.0 / 2 - 0.25 - 0.5, -2.0 * 2 - 0.5 - 0.5, 1.0, 1.0]


def test_penalties_only_look_at_the_last_n_tokens() -> None:
    row = np.array([1.0, 1.0])
    apply_penalties(row, [0, 1], SamplingParams(presence_penalty=1.0, penalty_last_n=1))
    assert row.tolist() == [1.0, 0.0]


def test_all_neg_inf_row_is_an_error_not_nan() -> None:
    with pytest.raises(SamplingError, match="-inf"):
        probabilities(np.full(4, -np.inf), SamplingParams(temperature=1.0))
    with pytest.raises(SamplingError, match="-inf"):
        greedy_token(np.full(4, -np.inf), SamplingParams(temperature=0.0))


def test_nan_logits_are_an_error() -> None:
    with pytest.raises(SamplingError, match="NaN"):
        probabilities(np.array([0.0, np.nan]), SamplingParams(temperature=1.0))
    with pytest.raises(SamplingError, match="NaN"):
        greedy_token(np.array([0.0, np.nan]), SamplingParams(temperature=0.0))


def test_tiny_temperature_does_not_overflow() -> None:
    p = probabilities(np.array([100.0, 99.0, -50.0]), SamplingParams(temperature=0.001))
    assert np.isfinite(p).all() and p[0] == pytest.approx(1.0)


def test_pad_logits_refuses_a_longer_row() -> None:
    with pytest.raises(ValueError, match="only 2"):
        pad_logits(np.zeros(3), 2)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(temperature=-0.1), "sampling.temperature"),
        (dict(top_p=0.0), "sampling.top_p"),
        (dict(top_k=-1), "sampling.top_k"),
        (dict(min_p=1.0), "sampling.min_p"),
        (dict(repeat_penalty=0.0), "sampling.repeat_penalty"),
    ],
)
def test_out_of_range_parameters_name_the_key(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------------------
# property tests
# ---------------------------------------------------------------------------
logit_values = st.one_of(
    st.floats(min_value=-30, max_value=30, allow_nan=False),
    st.just(-np.inf),
)


@st.composite
def transform_case(draw):
    v = draw(st.integers(min_value=1, max_value=40))
    logits = np.array(draw(st.lists(logit_values, min_size=v, max_size=v)))
    if np.all(logits == -np.inf):
        logits[draw(st.integers(0, v - 1))] = draw(st.floats(-5, 5))
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.05, 0.7, 1.0, 2.5])),
        top_k=draw(st.sampled_from([0, 1, 3, 50])),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.01])),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.5])),
        repeat_penalty=draw(st.sampled_from([1.0, 1.3])),
        presence_penalty=draw(st.sampled_from([0.0, 0.4])),
    )
    history = draw(st.lists(st.integers(0, v - 1), max_size=8))
    pad = draw(st.integers(0, 3))
    return logits, params, history, v + pad


@settings(max_examples=300, deadline=None)
@given(transform_case())
def test_probabilities_are_always_valid(case) -> None:
    logits, params, history, size = case
    p = probabilities(logits, params, history, size)
    assert p.shape == (size,)
    assert np.isfinite(p).all() and (p >= 0).all()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert (p[len(logits) :] == 0).all()  # padding never gets mass
    assert (p[: len(logits)][logits == -np.inf] == 0).all()  # penalties never revive a -inf logit
    if params.greedy:
        assert p.max() == 1.0


@settings(max_examples=300, deadline=None)
@given(transform_case(), transform_case(), st.integers(0, 2**32 - 1))
def test_residual_is_well_defined_whenever_rejection_is_possible(case_p, case_q, seed) -> None:
    logits_p, params_p, hist, size_p = case_p
    logits_q, _, _, _ = case_q
    size = max(size_p, len(logits_q))
    p = probabilities(logits_p, params_p, hist, size)
    q = probabilities(logits_q, params_p, hist, size)  # same transform on both sides
    m = np.minimum(p, q)
    rejection_mass = 1.0 - m.sum()
    r = np.maximum(p - q, 0.0)
    assert np.isfinite(r).all()
    if rejection_mass > 1e-12:
        assert r.sum() > 0 and r.sum() == pytest.approx(rejection_mass, abs=1e-9)
        assert decomposes(p, q)
    rng = np.random.default_rng(seed)
    token = sample_index(q, rng)
    verdict = verify_rejection([token], [q], [p, p], rng)
    assert 0 <= verdict.token < size and p[verdict.token] > 0


@settings(max_examples=200, deadline=None)
@given(transform_case())
def test_log_weights_argmax_matches_probabilities(case) -> None:
    logits, params, history, size = case
    if params.greedy:
        return
    w = log_weights(logits, params, history, size)
    p = probabilities(logits, params, history, size)
    assert p[np.argmax(w)] == p.max()  # (exp may round distinct weights to equal probabilities)
    assert (p[np.isneginf(w)] == 0).all()  # a removed token never gets probability
    assert np.isfinite(w[p > 0]).all()  # (the converse fails only by float underflow: exp(-760) == 0)


def _residual_draws(p_row, q_row, n: int, seed: int, draw=None) -> np.ndarray:
    draw = draw or draw_from_residual
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(np.asarray(p_row)))
    computed = 0
    for _ in range(n):
        token, mass = draw(p_row, lambda t: float(np.asarray(q_row)[t]), rng, lambda: residual_of(p_row, q_row))
        counts[token] += 1
        computed += mass is not None
    return counts, computed


@pytest.mark.parametrize("case", ["large residual", "small residual", "one-hot q"])
def test_a_rejection_draws_from_the_residual_exactly(case: str) -> None:
    """A rejection draws from p and keeps x with probability max(0, p - q)(x) / p(x), computing the
    residual only after RESIDUAL_DRAWS draws kept nothing: the token's law must be the residual's
    (chi-square at 1e-6, 40,000 draws), both when draws are mostly kept and when the residual has
    little mass and is mostly computed; the negative control keeps the first draw (law p) and fails."""
    rng = np.random.default_rng(3)
    p = probabilities((rng.standard_normal(40) * 2).astype(np.float32), SamplingParams(temperature=0.8))
    if case == "large residual":
        q = probabilities((rng.standard_normal(40) * 2).astype(np.float32), SamplingParams(temperature=0.8))
    elif case == "small residual":
        q = 0.97 * p + 0.03 * np.roll(p, 1)
    else:
        q = np.zeros(40)
        q[int(np.argmax(p))] = 1.0
    exact = np.maximum(p - q, 0.0)
    mass = exact.sum()
    counts, computed = _residual_draws(p, q, 40_000, seed=5)
    result = chi_square(counts, exact / mass)
    assert result.passed, f"{case}: {result}"
    kept_none = (1 - mass) ** RESIDUAL_DRAWS  # the chance that no draw is kept
    assert computed / 40_000 == pytest.approx(kept_none, abs=0.01), case  # the fallback ran as often as it should

    def first_draw(p_row, q_prob, rng, residual):  # the bug: every draw kept, so the law is p's
        return sample_index(p_row, rng), None

    broken, _ = _residual_draws(p, q, 40_000, seed=5, draw=first_draw)
    assert not chi_square(broken, exact / mass).passed, case


def test_the_one_hot_rule_corrects_with_p_without_the_drafted_token() -> None:
    """verify_onehot's own rejection path (the drafted token never kept, the residual ``p`` without it
    computed only after four draws of it): a correction's law is ``p`` without ``d``, renormalised
    (chi-square at 1e-6 over the rejections of 40,000 verifications), and its residual mass is
    ``1 - p(d)`` every time. Here p(d) = 0.6, so 0.6 ** 4, an eighth of the corrections, reach the fallback."""
    p = np.array([0.6, 0.2, 0.1, 0.05, 0.05])
    rng = np.random.default_rng(9)
    counts = np.zeros(5)
    for _ in range(40_000):
        verdict = verify_onehot([0], [p, p], rng)
        if verdict.n_accepted == 0:
            counts[verdict.token] += 1
            assert verdict.residual_mass == pytest.approx(0.4)
    expected = np.array([0.0, 0.5, 0.25, 0.125, 0.125])
    assert counts[0] == 0 and counts.sum() > 15_000
    assert chi_square(counts, expected).passed, chi_square(counts, expected)
    assert not chi_square(counts, p / p.sum()).passed  # the law it must not have: p itself


def _top_by_sorting(values: np.ndarray, n: int) -> np.ndarray:
    return np.lexsort((np.arange(values.shape[0]), -values))[:n]  # largest first, ties by the lower index


@pytest.mark.parametrize("size", [1, 7, 640, 641, 5000, 151_936])
def test_top_indices_are_the_full_sorts_head_ties_included(size: int) -> None:
    """The sampled bound may keep hundreds of candidates or exactly n; ties at the boundary go to the
    lower index, as a full sort puts them (rows of few distinct values force ties there)."""
    rng = np.random.default_rng(size)
    for values in (rng.standard_normal(size).astype(np.float32) * 3, rng.integers(-3, 3, size).astype(np.float32)):
        for n in {1, 3, 10, min(64, size), size}:
            n = min(n, size)
            np.testing.assert_array_equal(top_indices(values, n), _top_by_sorting(values, n))


def test_weights_top_matches_the_dense_row() -> None:
    """Top-n from the logits (no full row written) and from a full row give the dense row's head, with
    the probabilities ``prob`` gives."""
    rng = np.random.default_rng(7)
    raw = rng.standard_normal(151_936).astype(np.float32) * 4
    params = SamplingParams(temperature=0.8)
    dense = probabilities(raw, params)
    for row in (weights(raw, params), Weights(dense * 3.0)):
        tokens, probs = row.top(10)
        np.testing.assert_array_equal(tokens, _top_by_sorting(dense, 10))
        assert probs == pytest.approx(dense[tokens], rel=1e-12)
        assert [row.prob(int(t)) for t in tokens] == pytest.approx(list(probs), rel=1e-12)
