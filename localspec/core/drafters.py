"""Where draft tokens come from: a small model, or the prompt itself.

A drafter only proposes. Exactness is the verifier's job, and it needs one
fact from the drafter: the distribution each token was drawn from (``q``),
or the statement that the proposal is deterministic (``q`` one-hot).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from localspec.core.model import LanguageModel, common_prefix_length
from localspec.core.modes import Draft, Mode


class Drafter(Protocol):
    """Proposes up to ``k`` tokens to follow ``context``."""

    name: str
    # The draft model whose decode time and vocabulary the loop reads; None for a drafter that
    # evaluates nothing (prompt lookup): its proposals cost no model time and carry no q rows.
    model: LanguageModel | None
    # Seconds of the last proposal spent catching up on context the drafter had not seen (the prompt,
    # or the tokens of steps it sat out): a one-off, not what drafting a token costs.
    catch_up_s: float

    def prefill(self, context: Sequence[int]) -> None:
        """Get ready for a request whose prompt is ``context`` (e.g. evaluate it)."""

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        """Return at most ``k`` tokens (possibly none)."""


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

    def prefill(self, context: Sequence[int]) -> None:
        """Nothing yet: the first proposal catches up in one batch. A reply that never drafts (adaptive
        K found drafting does not pay) then never makes the draft read the prompt at all."""

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        draft = Draft(tokens=[], q_rows=[], logits=[])
        if k <= 0:
            return draft
        logits = self._catch_up(context)
        position = len(context)
        for i in range(k):
            history = mode.history(context, draft.tokens, i)
            token, q = mode.pick_draft(logits, history, position + i)
            draft.tokens.append(token)
            draft.logits.append(logits)
            if q is None:
                draft.q_rows = None
            elif draft.q_rows is not None:
                draft.q_rows.append(q)
            if i + 1 < k:
                logits = self.model.extend([token], 1)[0]
        return draft

    def _catch_up(self, context: Sequence[int]) -> np.ndarray:
        """Evaluate what the cache misses of ``context`` in ONE batch; return the last row's logits.

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
        logits = self.model.extend(context[keep:], 1)[0]
        # d_K and the bonus token are the normal catch-up; more than that is context it never saw
        self.catch_up_s = self.model.decode_seconds - started if len(context) - keep > 2 else 0.0
        return logits


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and copy what followed.

    Deterministic, so ``q`` is one-hot and rejection mode uses the one-hot
    rule (accept with ``p(d)``, resample from ``p`` without ``d``): still exact.
    Costs no model evaluation at all, which pays off when replies quote the
    prompt (summaries, code edits, extraction).
    """

    name = "ngram"
    model = None  # copies from the context: no model, no decode time
    catch_up_s = 0.0

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def prefill(self, context: Sequence[int]) -> None:
        return None

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        draft = Draft(tokens=[], q_rows=None)
        if k <= 0 or len(context) < 2:
            return draft
        tokens = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            pattern = tokens[-n:]
            # all windows of length n that end before the last token
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                draft.tokens = [int(t) for t in tokens[start : start + k]]
                return draft
        return draft
