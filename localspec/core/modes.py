"""Speculative modes: how a draft token is picked and how the target judges it.

A mode pairs a *draft pick* (what a model drafter does with its logits) with a
*verification rule* from :mod:`localspec.core.verify`, so the two can never drift
apart: rejection mode samples the draft from exactly the ``q`` its rule
divides by (docs/design.md, Verification rules, bugs 1 and 2); invariant mode uses the shared Gumbel
noise on both sides and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.core.noise import gumbel_max_sample, stream_key
from localspec.core.sampling import (
    DRAFT_FLOOR,
    SamplingParams,
    draft_weights,
    greedy_token,
    is_plain_softmax,
    log_weights,
    weights,
)
from localspec.core.verify import (
    Verdict,
    verify_onehot,
    verify_picks,
    verify_rejection,
    verify_token_match,
)

MODES = ("rejection", "greedy", "invariant", "token-match", "target-only")


@dataclass
class Draft:
    """A drafter's proposal for one step."""

    tokens: list[int] = field(default_factory=list)
    # The distribution each token was sampled from (dense rows or unnormalised
    # weights.Weights), or None for a deterministic drafter (q one-hot on the token).
    q_rows: list[np.ndarray] | None = None
    # Raw draft logits per token (model drafters only), where the UI's top-q needs them: a token drawn
    # from a q that reads no raw row (HeadWeights) has None, the q itself is shown.
    logits: list[np.ndarray | None] | None = None
    source: str = ""  # where the tokens came from: "model", "lookup" ("" = no draft)


class LazyRows(Sequence[object]):
    """Row ``i`` is computed by ``make(i)`` the first time a rule looks at it."""

    def __init__(self, n: int, make: Callable[[int], object]) -> None:
        self._n = n
        self._make = make
        self._rows: dict[int, object] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if not 0 <= i < self._n:
            raise IndexError(i)
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = self._make(i)
        return row


class Mode:
    """Base class. ``position`` arguments are absolute positions of the token being chosen."""

    name = "base"

    def __init__(self, params: SamplingParams, rng: np.random.Generator, vocab_size: int) -> None:
        self.params = params
        self.rng = rng
        self.vocab_size = vocab_size
        self._judged: tuple[np.ndarray, LazyRows] | None = None  # the latest target_probs, by its logits

    def pick_draft(self, logits: np.ndarray, history: Sequence[int], position: int) -> tuple[int, np.ndarray | None]:
        """Choose a draft token from draft logits; return it with the q it was sampled from."""
        raise NotImplementedError

    def verify(self, draft: Draft, target_logits: np.ndarray, context: Sequence[int]) -> Verdict:
        """Judge ``draft`` against ``len(draft.tokens) + 1`` target rows following ``context``."""
        raise NotImplementedError

    # helpers -------------------------------------------------------------
    def history(self, context: Sequence[int], draft: Sequence[int], i: int) -> list[int]:
        """Token history seen at draft position ``i`` (for penalties)."""
        if not self.params.has_penalties:
            return []
        return list(context[-self.params.penalty_last_n :]) + list(draft[:i])

    def target_probs(self, target_logits: np.ndarray, context: Sequence[int], draft: Sequence[int]) -> LazyRows:
        """Target rows as :class:`~localspec.core.weights.Weights`, each computed only if a rule looks at it."""
        rows = LazyRows(
            target_logits.shape[0],
            lambda i: weights(target_logits[i], self.params, self.history(context, draft, i), self.vocab_size),
        )
        self._judged = (target_logits, rows)
        return rows

    def judged_rows(self, target_logits: np.ndarray) -> LazyRows | None:
        """The rows the latest verification of ``target_logits`` judged by (None: it used none), so the
        step's records show those very numbers without transforming the vocabulary again."""
        if self._judged is not None and self._judged[0] is target_logits:
            return self._judged[1]
        return None


class RejectionMode(Mode):
    """Exact speculative sampling; the default for T > 0."""

    name = "rejection"
    draft_floor = DRAFT_FLOOR  # the draft proposes its head only (see draft_weights); 0 = its full q

    def pick_draft(self, logits, history, position):
        q = draft_weights(logits, self.params, history, self.vocab_size, self.draft_floor)
        return q.sample(self.rng), q

    def verify(self, draft, target_logits, context):
        p_rows = self.target_probs(target_logits, context, draft.tokens)
        if draft.q_rows is None:
            return verify_onehot(draft.tokens, p_rows, self.rng)
        return verify_rejection(draft.tokens, draft.q_rows, p_rows, self.rng)


class GreedyMode(Mode):
    """T = 0: byte-identical to target-only greedy decoding (given batch-invariant logits)."""

    name = "greedy"

    def pick_draft(self, logits, history, position):
        return greedy_token(logits, self.params, history, self.vocab_size), None

    def verify(self, draft, target_logits, context):
        best = LazyRows(
            target_logits.shape[0],
            lambda i: greedy_token(
                target_logits[i], self.params, self.history(context, draft.tokens, i), self.vocab_size
            ),
        )
        return verify_picks(draft.tokens, best)


class InvariantMode(Mode):
    """Gumbel coupling: same seed, same text, with any draft or none."""

    name = "invariant"

    def __init__(self, params, rng, vocab_size, seed: int, request_key: int) -> None:
        super().__init__(params, rng, vocab_size)
        self.seed = seed
        self.request_key = request_key

    def _coupled_pick(self, logits: np.ndarray, history: Sequence[int], position: int) -> int:
        if self.params.greedy:
            return greedy_token(logits, self.params, history, self.vocab_size)
        key = stream_key(self.seed, self.request_key, position)
        raw = np.asarray(logits)
        if is_plain_softmax(raw, self.params, history, self.vocab_size):  # no full-vocabulary pass first
            return gumbel_max_sample(raw, 1.0 / self.params.temperature, key)
        return gumbel_max_sample(log_weights(logits, self.params, history, self.vocab_size), 1.0, key)

    def pick_draft(self, logits, history, position):
        return self._coupled_pick(logits, history, position), None

    def verify(self, draft, target_logits, context):
        start = len(context)
        picks = LazyRows(
            target_logits.shape[0],
            lambda i: self._coupled_pick(target_logits[i], self.history(context, draft.tokens, i), start + i),
        )
        return verify_picks(draft.tokens, picks)


class TokenMatchMode(RejectionMode):
    """Baseline of several popular stacks: keep a draft token only if the target sampled the same one."""

    name = "token-match"

    def verify(self, draft, target_logits, context):
        return verify_token_match(draft.tokens, self.target_probs(target_logits, context, draft.tokens), self.rng)


class TargetOnlyMode(RejectionMode):
    """No draft: every token is sampled from ``p`` (the loop always calls verify with an empty draft)."""

    name = "target-only"


def make_mode(
    name: str,
    params: SamplingParams,
    rng: np.random.Generator,
    vocab_size: int,
    seed: int = 0,
    request_key: int = 0,
) -> Mode:
    """Build a mode by name. Greedy mode ignores temperature; T = 0 makes every sampling mode greedy."""
    if name not in MODES:
        from localspec.core.errors import ConfigError

        raise ConfigError(f"mode {name!r} is unknown; choose one of {', '.join(MODES)}")
    if name == "invariant":
        return InvariantMode(params, rng, vocab_size, seed, request_key)
    if name == "greedy" or params.greedy:
        if not params.greedy:
            params = _with_temperature(params, 0.0)
        return GreedyMode(params, rng, vocab_size)
    return {"rejection": RejectionMode, "token-match": TokenMatchMode, "target-only": TargetOnlyMode}[name](
        params, rng, vocab_size
    )


def _with_temperature(params: SamplingParams, temperature: float) -> SamplingParams:
    from dataclasses import replace

    return replace(params, temperature=temperature)
