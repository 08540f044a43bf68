"""Statistical proof that the real speculative loop samples exactly from the target (docs/design.md, Proving exactness).

Toy prefix-dependent models (V = 6) give exact joint probabilities of the
first four generated tokens by enumeration. The real loop runs with K = 3
(``max_tokens = 4`` so the first step drafts all three), so the fourth token
is the first step's bonus token whenever all three drafts are accepted: the
bonus is inside the tested window. Samples are compared with Pearson's
chi-square at significance 1e-6 on each position's marginal, the adjacent
pairs, the full 4-token joint, and the number of drafts accepted in the
first step.

Every test has negative controls: the bugs listed in docs/design.md (Verification rules) as small broken
variants, which must fail the same statistics by a wide margin. Run with
``pytest -s`` to see all the chi-square values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest

from localspec.core.events import GenerationResult, StepEvent
from localspec.core.loop import SpeculativeDecoder
from localspec.core.modes import InvariantMode, RejectionMode
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams, draft_weights, probabilities, weights
from localspec.core.verify import DraftCheck, Verdict
from localspec.core.weights import sample_index
from localspec.drafting.drafters import ModelDrafter, NgramDrafter
from localspec.drafting.policy import speculative_decoder

from .stats import (
    ChiSquare,
    accept_gumbel,
    accept_onehot,
    accept_rejection,
    accept_token_match,
    accepted_length_distribution,
    chi_square,
)
from .toy import ToyLM, exact_joint

V = 6
K = 3
LENGTH = K + 1  # the first step's drafts and its bonus
PROMPT = [0, 1, 2, 3, 4, 5, 0, 1]  # the n-gram drafter finds "0 1" and proposes "2 3 4"
N_RUNS = 20_000
T = 0.8
# For penalties: ids 3, 4 and 5 unseen, 0 seen three times (frequency), and with penalty_last_n = 4 the
# early 0 and 2 fall out of the window as tokens are drafted, so every penalty depends on the history.
PENALTY_PROMPT = [2, 0, 1, 0, 1, 0]
PENALTIES = SamplingParams(
    temperature=T, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.5, penalty_last_n=4
)


@dataclass
class Report:
    """All statistics of one sampled configuration."""

    marginals: list[ChiSquare]
    pairs: list[ChiSquare]
    joint: ChiSquare
    accepted: ChiSquare | None

    def all(self) -> list[ChiSquare]:
        return [*self.marginals, *self.pairs, self.joint, *([self.accepted] if self.accepted else [])]

    def worst(self) -> float:
        return max(c.statistic / c.critical for c in self.all())

    def __str__(self) -> str:
        lines = [f"  marginal {i + 1}: {c}" for i, c in enumerate(self.marginals)]
        lines += [f"  pair {i + 1}-{i + 2}: {c}" for i, c in enumerate(self.pairs)]
        lines.append(f"  joint: {self.joint}")
        if self.accepted:
            lines.append(f"  accepted length: {self.accepted}")
        return "\n".join(lines)


def _models(draft_vocab: int = V) -> tuple[ToyLM, ToyLM]:
    target = ToyLM(V, seed=11, scale=1.6, name="toy-target")
    draft = ToyLM(draft_vocab, seed=23, base=target, noise=1.2, name="toy-draft")
    return target, draft


def sample(
    decoder: SpeculativeDecoder,
    params: SamplingParams,
    mode: str,
    n_runs: int = N_RUNS,
    seed0: int = 0,
    prompt: list[int] = PROMPT,
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first LENGTH tokens (shape V,...,V) and of the first step's accepted drafts (K+1)."""
    joint = np.zeros((V,) * LENGTH)
    accepted = np.zeros(K + 1)
    for run in range(n_runs):
        options = GenerationOptions(mode=mode, max_tokens=4, draft_tokens=K, seed=seed0 + run, request_key=7)
        first_step = None
        for event in decoder.stream(prompt, params, options):
            if isinstance(event, StepEvent) and first_step is None:
                first_step = event
            elif isinstance(event, GenerationResult):
                joint[tuple(event.token_ids[:LENGTH])] += 1
        if first_step is not None and first_step.k == K:
            accepted[first_step.n_accepted] += 1
    return joint, accepted


def report(joint_counts: np.ndarray, exact: np.ndarray, accepted_counts=None, accepted_exact=None) -> Report:
    n = joint_counts.ndim

    def keep(counts: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return counts.sum(axis=tuple(a for a in range(n) if a not in axes))

    marginals = [chi_square(keep(joint_counts, (i,)), keep(exact, (i,))) for i in range(n)]
    pairs = [chi_square(keep(joint_counts, (i, i + 1)), keep(exact, (i, i + 1))) for i in range(n - 1)]
    acc = chi_square(accepted_counts, accepted_exact) if accepted_counts is not None and accepted_counts.sum() else None
    return Report(marginals, pairs, chi_square(joint_counts, exact), acc)


def _rows(model: ToyLM, params: SamplingParams, size: int = V) -> Callable:
    return lambda prefix: probabilities(model.logits(prefix), params, prefix, size)


# ---------------------------------------------------------------------------
# correct configurations
# ---------------------------------------------------------------------------
CASES = {
    "rejection T=0.8": (SamplingParams(temperature=T), "rejection", accept_rejection, PROMPT),
    "rejection T=0.8 top-k=3": (SamplingParams(temperature=T, top_k=3), "rejection", accept_rejection, PROMPT),
    "rejection T=0.8 top-p=0.9": (SamplingParams(temperature=T, top_p=0.9), "rejection", accept_rejection, PROMPT),
    "rejection T=0.8 min-p=0.1": (SamplingParams(temperature=T, min_p=0.1), "rejection", accept_rejection, PROMPT),
    "rejection T=0.8 penalties (window 4)": (PENALTIES, "rejection", accept_rejection, PENALTY_PROMPT),
    "token-match T=0.8": (SamplingParams(temperature=T), "token-match", accept_token_match, PROMPT),
    "invariant (Gumbel) T=0.8": (SamplingParams(temperature=T), "invariant", accept_gumbel, PROMPT),
    "invariant (Gumbel) penalties (window 4)": (PENALTIES, "invariant", accept_gumbel, PENALTY_PROMPT),
    "invariant (Gumbel) top-k=4 top-p=0.9 min-p=0.05": (
        SamplingParams(temperature=T, top_k=4, top_p=0.9, min_p=0.05),
        "invariant",
        accept_gumbel,
        PROMPT,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_drafter_matches_target_exactly(name: str) -> None:
    params, mode, accept, prompt = CASES[name]
    target, draft = _models()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    joint, accepted = sample(decoder, params, mode, prompt=prompt)
    exact = exact_joint(target, prompt, params, LENGTH, V)
    acc_exact = accepted_length_distribution(_rows(target, params), _rows(draft, params), prompt, K, accept)
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[{name}]\n{result}")
    failed = [str(c) for c in result.all() if not c.passed]
    assert not failed, f"{name}: {failed}"


#: A floor far above the default (sampling.DRAFT_FLOOR), so the head the draft proposes from leaves out
#: tokens the target wants (asserted), and a wrong q would show.
FLOOR = 0.2


def _head_rows(model: ToyLM, params: SamplingParams, floor: float = FLOOR) -> Callable:
    return lambda prefix: draft_weights(model.logits(prefix), params, prefix, V, floor).dense()


def test_draft_proposing_its_head_matches_target_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft proposes only its head (tokens with >= FLOOR of its top token's weight, renormalised):
    a different q, and the rule divides by that q, so the output is still the target's."""
    params = SamplingParams(temperature=T)
    target, draft = _models()
    head, full, p = _head_rows(draft, params)(PROMPT), _rows(draft, params)(PROMPT), _rows(target, params)(PROMPT)
    assert ((head == 0) & (full > 0) & (p > 0.01)).any()  # the floor cuts tokens the target wants
    monkeypatch.setattr(RejectionMode, "draft_floor", FLOOR)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    joint, accepted = sample(decoder, params, "rejection")
    exact = exact_joint(target, PROMPT, params, LENGTH, V)
    acc_exact = accepted_length_distribution(_rows(target, params), _head_rows(draft, params), PROMPT, K,
                                             accept_rejection)  # fmt: skip
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[draft head, floor {FLOOR}]\n{result}")
    failed = [str(c) for c in result.all() if not c.passed]
    assert not failed, failed


@pytest.mark.parametrize("mode, accept", [("rejection", accept_rejection), ("invariant", accept_gumbel)])
def test_smaller_draft_vocabulary_is_padded_exactly(mode: str, accept) -> None:
    """A draft with one token fewer than the target: padded with zero probability, still exact."""
    params = SamplingParams(temperature=T)
    target, draft = _models(draft_vocab=V - 1)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    joint, accepted = sample(decoder, params, mode, n_runs=N_RUNS // 2)
    exact = exact_joint(target, PROMPT, params, LENGTH, V)
    acc_exact = accepted_length_distribution(_rows(target, params), _rows(draft, params, V), PROMPT, K, accept)
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[draft vocabulary {V - 1} < {V}, {mode}]\n{result}")
    assert all(c.passed for c in result.all()), str(result)


class StrictToyLM(ToyLM):
    """A target that refuses token ids outside its vocabulary, as llama.cpp does."""

    def extend(self, tokens, n_logits, borrow=False):
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary ({self.vocab_size})")
        return super().extend(tokens, n_logits)


class WideDraftLM(ToyLM):
    """A draft with one token more than the target (id V, which the target lacks), proposed often."""

    def logits(self, prefix):
        key = tuple(prefix)
        rng = np.random.default_rng([self.seed, len(key), *key])
        shared = self.base.logits(key).astype(np.float64) + self.noise * rng.standard_normal(V)
        return np.append(shared, rng.standard_normal() + 1.0).astype(np.float32)


def _wide_models() -> tuple[StrictToyLM, WideDraftLM]:
    target = StrictToyLM(V, seed=11, scale=1.6, name="toy-target")
    return target, WideDraftLM(V + 1, seed=23, base=target, noise=1.2, name="toy-wide-draft")


@pytest.mark.parametrize("mode", ["rejection", "greedy", "invariant", "token-match"])
def test_larger_draft_vocabulary_never_reaches_the_target(mode: str) -> None:
    """A draft token the target does not have (p = 0) is rejected, never evaluated by the target."""
    target, draft = _wide_models()
    decoder = speculative_decoder(target, target, ModelDrafter(draft, vocab_size=V + 1))
    params = SamplingParams(temperature=0.0 if mode == "greedy" else T)
    proposed_extra = 0
    for run in range(300):
        options = GenerationOptions(
            mode=mode, max_tokens=12, draft_tokens=K, seed=run, request_key=7, adaptive=False, detail_top=3
        )  # the evidence rows (UI, traces) name the draft-only token too
        for event in decoder.stream(PROMPT, params, options):
            if isinstance(event, StepEvent):
                proposed_extra += V in event.drafted
                assert V not in event.drafted[: event.n_accepted] and V not in event.emitted
                assert event.drafted.index(V) == len(event.drafted) - 1 if V in event.drafted else True
    assert proposed_extra > 50, "the draft never proposed its extra token: the test shows nothing"


@pytest.mark.parametrize("mode, accept", [("rejection", accept_rejection), ("invariant", accept_gumbel)])
def test_larger_draft_vocabulary_is_exact(mode: str, accept) -> None:
    """q stays the distribution over V + 1 ids the draft token was drawn from: still exact."""
    params = SamplingParams(temperature=T)
    target, draft = _wide_models()
    decoder = speculative_decoder(target, target, ModelDrafter(draft, vocab_size=V + 1))
    joint, accepted = sample(decoder, params, mode, n_runs=N_RUNS // 2)
    exact = exact_joint(target, PROMPT, params, LENGTH, V)
    acc_exact = accepted_length_distribution(
        _rows(target, params, V + 1), _rows(draft, params, V + 1), PROMPT, K, accept
    )
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[draft vocabulary {V + 1} > {V}, {mode}]\n{result}")
    assert all(c.passed for c in result.all()), str(result)


def test_onehot_drafter_matches_target_exactly() -> None:
    """Prompt lookup proposes deterministically (q one-hot): accept with p(d), resample p without d."""
    params = SamplingParams(temperature=T)
    target, _ = _models()
    ngram = NgramDrafter(target)
    decoder = speculative_decoder(target, target, ngram)
    joint, accepted = sample(decoder, params, "rejection")
    exact = exact_joint(target, PROMPT, params, LENGTH, V)
    proposal = ngram.propose(PROMPT, K, RejectionMode(params, np.random.default_rng(0), V)).tokens
    assert len(proposal) == K

    def onehot(prefix):
        row = np.zeros(V)
        row[proposal[len(prefix) - len(PROMPT)]] = 1.0
        return row

    acc_exact = accepted_length_distribution(_rows(target, params), onehot, PROMPT, K, accept_onehot)
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[one-hot (prompt lookup) drafter]\n{result}")
    assert all(c.passed for c in result.all()), str(result)


# ---------------------------------------------------------------------------
# negative controls: each known bug must fail the same tests
# ---------------------------------------------------------------------------
class DraftTemperatureNotPassed(RejectionMode):
    """Bug (a): the draft token is drawn at T = 1 while the rule uses q at the request's T."""

    def pick_draft(self, logits, history, position):
        q = probabilities(logits, self.params, history, self.vocab_size)
        drawn_from = probabilities(logits, replace(self.params, temperature=1.0), history, self.vocab_size)
        return sample_index(drawn_from, self.rng), q


class ArgmaxDraft(RejectionMode):
    """Bug (b): the draft token is argmax q, but the rule divides by q(d) as if it were sampled."""

    def pick_draft(self, logits, history, position):
        q = probabilities(logits, self.params, history, self.vocab_size)
        return int(np.argmax(q)), q


class ResidualIsP(RejectionMode):
    """Bug (c): after a rejection, resample from p instead of normalize(max(0, p - q))."""

    def verify(self, draft, target_logits, context):
        p_rows = self.target_probs(target_logits, context, draft.tokens)
        checks = []
        for i, token in enumerate(draft.tokens):
            p, q = p_rows[i], draft.q_rows[i]
            accept = min(1.0, p[token] / q[token])
            u = self.rng.random()
            checks.append(DraftCheck(token, p[token], q[token], accept, u, u < accept))
            if u >= accept:
                return Verdict(i, sample_index(p, self.rng), False, checks)
        return Verdict(len(draft.tokens), sample_index(p_rows[len(draft.tokens)], self.rng), True, checks)


class BonusUniform(RejectionMode):
    """Bug (e): the bonus token after a fully accepted draft is drawn uniformly instead of from p."""

    def verify(self, draft, target_logits, context):
        verdict = super().verify(draft, target_logits, context)
        if verdict.bonus and draft.tokens:
            return replace(verdict, token=int(self.rng.integers(self.vocab_size)))
        return verdict


class HistoryDropsDrafts(RejectionMode):
    """Bug (f): the penalty history at draft position i leaves out the drafts before it."""

    def history(self, context, draft, i):
        return list(context[-self.params.penalty_last_n :]) if self.params.has_penalties else []


class HeadDrawnFullQ(RejectionMode):
    """Bug (g): the token is drawn from the draft's head, the rule divides by the full q."""

    def pick_draft(self, logits, history, position):
        head = draft_weights(logits, self.params, history, self.vocab_size, FLOOR)
        return head.sample(self.rng), weights(logits, self.params, history, self.vocab_size)


class StaleRollbackLM(ToyLM):
    """Bug (d): rollback leaves one rejected position in the cache."""

    def truncate(self, n_keep: int) -> None:
        super().truncate(n_keep + 1)


NEGATIVE = {  # name -> (broken mode, or None for the stale-rollback model; params; prompt)
    "(a) draft temperature not passed": (DraftTemperatureNotPassed, SamplingParams(temperature=T), PROMPT),
    "(b) argmax draft treated as sample": (ArgmaxDraft, SamplingParams(temperature=T), PROMPT),
    "(c) residual replaced by p": (ResidualIsP, SamplingParams(temperature=T), PROMPT),
    "(d) rollback leaves a stale position": (None, SamplingParams(temperature=T), PROMPT),
    "(e) bonus drawn uniformly": (BonusUniform, SamplingParams(temperature=T), PROMPT),
    "(f) penalty history drops the drafts": (HistoryDropsDrafts, PENALTIES, PENALTY_PROMPT),
    "(g) head drawn, full q divided by": (HeadDrawnFullQ, SamplingParams(temperature=T), PROMPT),
}


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_negative_control_is_detected(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken, params, prompt = NEGATIVE[name]
    if broken is None:
        reference, _ = _models()
        target = StaleRollbackLM(V, seed=11, scale=1.6, name="stale")
        draft = ToyLM(V, seed=23, base=target, noise=1.2)
        decoder = speculative_decoder(target, target, ModelDrafter(draft))
    else:
        reference, draft = _models()
        decoder = speculative_decoder(reference, reference, ModelDrafter(draft))
        import localspec.core.loop as generation

        monkeypatch.setattr(generation, "make_mode", lambda n, p, rng, v, seed=0, request_key=0: broken(p, rng, v))
    joint, accepted = sample(decoder, params, "rejection", prompt=prompt)
    exact = exact_joint(reference, prompt, params, LENGTH, V)
    acc_exact = accepted_length_distribution(
        _rows(reference, params), _rows(draft, params), prompt, K, accept_rejection
    )
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[NEGATIVE {name}]\n{result}")
    assert not result.joint.passed, f"{name} went undetected by the joint test: {result.joint}"
    assert result.worst() > 3.0, f"{name} is detected only marginally: {result}"


# ---------------------------------------------------------------------------
# negative controls of invariant mode (Gumbel coupling)
# ---------------------------------------------------------------------------
# In invariant mode the committed text is always the target's own Gumbel pick, so draft-side noise bugs
# cannot change the text's distribution, only how often drafts are accepted: they must show in the
# accepted-length statistic (whose exact law assumes the draft and the target share the noise). Noise
# that ignores the position makes every position reuse one draw: the marginals stay right but the
# positions are coupled, which the pairs and the joint must show.
class DraftNoiseShifted(InvariantMode):
    """Bug (g): the draft's noise is the next position's."""

    def pick_draft(self, logits, history, position):
        return self._coupled_pick(logits, history, position + 1), None


class NoiseIgnoresPosition(InvariantMode):
    """Bug (h): one noise draw per request, reused at every position (by draft and target alike)."""

    def _coupled_pick(self, logits, history, position):
        return super()._coupled_pick(logits, history, 0)


class DraftNoiseOtherSeed(InvariantMode):
    """Bug (i): the draft's noise comes from another seed than the target's."""

    def pick_draft(self, logits, history, position):
        self.seed += 1
        try:
            return self._coupled_pick(logits, history, position), None
        finally:
            self.seed -= 1


INVARIANT_NEGATIVE = {
    "(g) draft noise shifted by one position": (DraftNoiseShifted, "accepted"),
    "(h) noise ignores the position": (NoiseIgnoresPosition, "joint"),
    "(i) draft noise from another seed": (DraftNoiseOtherSeed, "accepted"),
}


@pytest.mark.parametrize("name", list(INVARIANT_NEGATIVE))
def test_invariant_negative_control_is_detected(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken, statistic = INVARIANT_NEGATIVE[name]
    params = SamplingParams(temperature=T)
    target, draft = _models()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    import localspec.core.loop as generation

    monkeypatch.setattr(
        generation, "make_mode", lambda n, p, rng, v, seed=0, request_key=0: broken(p, rng, v, seed, request_key)
    )
    joint, accepted = sample(decoder, params, "invariant")
    exact = exact_joint(target, PROMPT, params, LENGTH, V)
    acc_exact = accepted_length_distribution(_rows(target, params), _rows(draft, params), PROMPT, K, accept_gumbel)
    result = report(joint, exact, accepted, acc_exact)
    print(f"\n[NEGATIVE invariant {name}]\n{result}")
    failing = result.joint if statistic == "joint" else result.accepted
    assert not failing.passed, f"{name} went undetected by the {statistic} test: {failing}"
    assert result.worst() > 3.0, f"{name} is detected only marginally: {result}"
