"""The small interface between the generation loop and a language model.

The loop never sees llama.cpp. It needs a model that can *score tokens after
what is already in its cache* and *roll its cache back to a position*. The
llama.cpp backend and the toy models of the tests implement the same
protocol, so the statistical proof suite exercises the very loop that runs in
production.

Cache convention (as llama.cpp's own speculative example): between steps the
target's cache holds every committed token except the last one; a step
evaluates ``[last, d_1 .. d_K]`` in one batch and gets ``K + 1`` rows of logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM with a rewindable cache."""

    name: str

    @property
    def vocab_size(self) -> int:
        """Number of logits per row."""

    @property
    def context_size(self) -> int:
        """Most tokens the cache can hold."""

    @property
    def cached_tokens(self) -> Sequence[int]:
        """Tokens whose keys/values are in the cache, in position order."""

    @property
    def decode_seconds(self) -> float:
        """Cumulative seconds spent inside the model (for the draft/verify/other split)."""

    def extend(self, tokens: Sequence[int], n_logits: int, borrow: bool = False) -> np.ndarray:
        """Append ``tokens`` to the cache; return logits of the last ``n_logits`` of them.

        Shape ``(n_logits, vocab_size)``. Only those rows are computed. With ``borrow`` the rows may be
        the model's own read-only output buffer, valid only until its next ``extend`` or ``reset``: the
        target's verification rows are read once, within their step, and copying them cost more than a
        step's sampling arithmetic (a 600 KB row at V = 151,936 comes from memory after a decode).
        """

    def truncate(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on (rollback of rejected tokens)."""


@runtime_checkable
class Vocabulary(Protocol):
    """Token texts, end-of-generation ids and the tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""

    def token_bytes(self, token: int) -> bytes:
        """Raw bytes of a token's text (may be part of a UTF-8 character)."""

    def is_end_of_generation(self, token: int) -> bool:
        """True for EOS/EOT-like tokens that end a reply."""

    def tokenize(self, text: str | bytes, add_special: bool, parse_special: bool) -> list[int]:
        """The tokens the model reads for ``text`` (with a BOS: ``add_special``; special tokens written as
        text read as such: ``parse_special``). Prompt lookup spells a renamed copy with it."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest shared prefix."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the common case, compared at C speed
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def sync_cache(model: LanguageModel, tokens: Sequence[int]) -> int:
    """Make ``model``'s cache hold exactly ``tokens``, reusing the longest cached prefix.

    Returns how many tokens had to be evaluated. This is how a new chat turn
    evaluates only its new tokens, and how the draft catches up after a
    step whose last proposal it never evaluated.
    """
    cached = model.cached_tokens
    keep = common_prefix_length(cached, tokens)
    if keep < len(cached):
        model.truncate(keep)
    rest = list(tokens[keep:])
    if rest:
        model.extend(rest, 0)
    return len(rest)
