"""Where draft tokens come from: a small model, or the prompt itself.

A drafter only proposes. Exactness is the verifier's job, and it needs one
fact from the drafter: the distribution each token was drawn from (``q``),
or the statement that the proposal is deterministic (``q`` one-hot).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.core.model import LanguageModel, Vocabulary, common_prefix_length
from localspec.core.modes import Draft, Mode
from localspec.core.policy import LOOKUP, MODEL, Drafter
from localspec.core.weights import HeadWeights, Weights
from localspec.drafting.edits import ReplyEdits


@dataclass(frozen=True)
class Match:
    """What prompt lookup found: the tokens it would copy and how much evidence backs them.

    ``length`` is how many tokens at the end of the context agree with the
    text before the copied occurrence (the longest such occurrence wins): a
    continuation preceded by twenty agreeing tokens is far more likely to be
    the text's continuation than one found after a single token, so adaptive
    drafting keeps its acceptance estimates per length.
    """

    start: int  # index of the context token where the copied continuation begins
    length: int  # tokens before the end of the context wholly inside the agreeing text (at least 1)
    tokens: tuple[int, ...]  # the proposal: what followed, with the reply's known edits redone

    @property
    def available(self) -> int:
        return len(self.tokens)


class PolicyDrafter(Drafter, Protocol):
    """A drafter as the policy sees it: besides what the loop asks (:class:`localspec.core.policy.Drafter`),
    what lookup offers, and what the draft model would have to read first and what that cost last time."""

    # Seconds of the last proposal spent catching up on context the drafter had not seen (the prompt,
    # or the tokens of steps it sat out): a one-off, not what drafting a token costs.
    catch_up_s: float

    def backlog(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` a model draft would have to read before drafting, beyond the usual two."""

    def lookup(self, context: Sequence[int], edits: ReplyEdits | None = None) -> Match | None:
        """What prompt lookup offers after ``context`` (None: nothing, or this drafter does no lookup),
        reading it with the reply's ``edits`` undone."""


class ModelDrafter:
    """Drafts with a small causal LM through the same interface as the target.

    The draft cache holds ``context[:-1]`` plus whatever it evaluated while
    drafting last time; :func:`sync_cache` keeps the accepted part, drops the
    rest, and evaluates what is missing — including ``d_K``, the last proposal
    of a fully accepted step, which the draft never evaluated.
    """

    def __init__(self, model: LanguageModel, vocab_size: int | None = None) -> None:
        self.model = model
        self.name = model.name
        self.vocab_size = vocab_size or model.vocab_size
        self.catch_up_s = 0.0
        self._usual = deque(maxlen=8)  # seconds of recent usual catch-ups (d_K and the bonus token)

    def prefill(self, context: Sequence[int]) -> None:
        """Nothing yet: the first proposal catches up in one batch. A reply that never drafts (adaptive
        K found drafting does not pay) then never makes the draft read the prompt at all."""

    def backlog(self, context: Sequence[int]) -> int:
        return max(0, len(context) - common_prefix_length(self.model.cached_tokens, context) - 2)

    def lookup(self, context: Sequence[int], edits: ReplyEdits | None = None) -> Match | None:
        return None

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        draft = Draft(tokens=[], q_rows=[], logits=[], source=MODEL)
        if k <= 0:
            return draft
        borrowed = self._catch_up(context)
        position = len(context)
        for i in range(k):
            history = mode.history(context, draft.tokens, i)
            token, q = mode.pick_draft(borrowed, history, position + i)
            logits = _kept(borrowed, q)
            draft.tokens.append(token)
            draft.logits.append(logits)
            if q is None:
                draft.q_rows = None
            elif draft.q_rows is not None:
                draft.q_rows.append(q)
            if i + 1 < k:
                borrowed = self.model.extend([token], 1, borrow=True)[0]
        return draft

    def _catch_up(self, context: Sequence[int]) -> np.ndarray:
        """Evaluate what the cache misses of ``context`` in ONE batch; return the last row's logits
        (borrowed: valid until the draft's next decode).

        After a fully accepted step the draft lacks ``d_K`` *and* the bonus
        token: one batch of two costs much less than two sequential decodes
        (most steps are fully accepted with a close draft). A draft on AMX
        weights splits it into one-row decodes itself (see ``weight_placement``).
        """
        cached = self.model.cached_tokens
        keep = min(common_prefix_length(cached, context), len(context) - 1)
        if keep < len(cached):
            self.model.truncate(keep)
        started = self.model.decode_seconds
        missing = len(context) - keep
        logits = self.model.extend(context[keep:], 1, borrow=True)[0]
        elapsed = self.model.decode_seconds - started
        # d_K and the bonus token are the usual catch-up, part of what drafting costs; beyond that the
        # draft reads context it never saw (the prompt, or steps it sat out): only the excess is one-off
        if missing <= 2:
            self._usual.append(elapsed)
            self.catch_up_s = 0.0
        else:
            usual = statistics.median(self._usual) if self._usual else elapsed * 2 / missing
            self.catch_up_s = max(0.0, elapsed - usual)
        return logits


class NgramDrafter:
    """Prompt lookup: find the earlier occurrence of the context's end that agrees longest, copy what followed.

    Deterministic, so ``q`` is one-hot and rejection mode uses the one-hot
    rule (accept with ``p(d)``, resample from ``p`` without ``d``): still exact.
    Costs no model evaluation at all, which pays off when replies quote the
    prompt (summaries, code edits, extraction).

    It matches text, not token ids, read with the reply's edits undone (see
    :mod:`localspec.drafting.edits`): a reply that renames ``orders`` writes
    ``(records`` where the prompt has ``(`` + ``orders``, so after a rename no
    token sequence of the prompt agrees with the reply's end, while its text
    read with the rename undone does.
    """

    name = "ngram"
    model = None  # copies from the context: no model, no decode time
    catch_up_s = 0.0
    max_match = 64  # agreement counted up to this many tokens (enough to tell a quote from a coincidence)
    max_copy = 32  # most tokens one lookup offers

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    def prefill(self, context: Sequence[int]) -> None:
        return None

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def lookup(self, context: Sequence[int], edits: ReplyEdits | None = None) -> Match | None:
        """The longest text ending the context (its last token with text at least) that occurred before,
        the latest such occurrence; what followed it, up to ``max_copy`` tokens."""
        if len(context) < 2:
            return None
        edits = edits if edits is not None else ReplyEdits(self.vocab)
        text, starts = edits.source_text(context)
        n, end = len(context), len(text)
        last = bisect.bisect_left(starts, end, hi=n) - 1  # the last token with text of its own
        if last < 0:
            return None
        shortest, longest = end - starts[last], end - starts[max(0, n - self.max_match)]
        if text.rfind(text[end - shortest :], 0, end - 1) < 0:
            return None
        while shortest < longest:  # every text shorter than one that occurred before occurred too
            middle = (shortest + longest + 1) // 2
            if text.rfind(text[end - middle :], 0, end - 1) >= 0:
                shortest = middle
            else:
                longest = middle - 1
        at = text.rfind(text[end - shortest :], 0, end - 1) + shortest  # where what followed begins
        length = n - bisect.bisect_left(starts, end - shortest, hi=n)  # tokens wholly inside the agreement
        copied = edits.copy(context, at, self.max_copy)
        if not copied:
            return None
        return Match(edits.token_at(at, n), length, copied)

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        match = self.lookup(context) if k > 0 else None
        return Draft(tokens=list(match.tokens[:k]) if match else [], q_rows=None, source=LOOKUP)


class HybridDrafter:
    """The draft model and prompt lookup behind one drafter.

    Which of them drafts (and how many tokens) is decided per step by adaptive
    drafting from measured acceptance and costs: lookup where the context
    predicts the continuation, the model where it does not, neither where
    neither pays. Exactness holds either way: a lookup proposal is verified
    with the one-hot rule, a model proposal with the q-rule of its own rows.
    """

    def __init__(self, model: ModelDrafter, lookup: NgramDrafter) -> None:
        self.drafter = model
        self.lookup_drafter = lookup
        self.model = model.model
        self.vocab_size = model.vocab_size
        self.name = f"{model.name} + lookup"

    @property
    def catch_up_s(self) -> float:
        return self.drafter.catch_up_s

    def prefill(self, context: Sequence[int]) -> None:
        self.drafter.prefill(context)

    def backlog(self, context: Sequence[int]) -> int:
        return self.drafter.backlog(context)

    def lookup(self, context: Sequence[int], edits: ReplyEdits | None = None) -> Match | None:
        return self.lookup_drafter.lookup(context, edits)

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        return self.drafter.propose(context, k, mode)


def _kept(borrowed: np.ndarray, q) -> np.ndarray | None:
    """A copy of a borrowed draft row, which the draft's next decode overwrites, for the step to keep
    where something reads it again (a ``q`` of the full row, for ``q(d)`` and a rejection's residual;
    the UI's top-q where there is no ``q``); None where ``q`` holds its own few numbers (HeadWeights).
    Copied after the pick read the whole row, so it comes from the core's cache: copied straight after
    the decode it came from memory, at twice what sampling q cost over it."""
    if isinstance(q, HeadWeights):
        return None
    kept = np.array(borrowed)
    if isinstance(q, Weights):
        q.rebind(borrowed, kept)
    return kept
