"""Toy language models with exactly known distributions.

Next-token logits are a seeded function of the *whole* cached prefix, so a
cache that keeps a stale token, or a loop that scores the wrong prefix,
changes the output distribution — and the exact probabilities of every short
continuation can be enumerated to test the loop against.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from localspec.core.sampling import SamplingParams, probabilities


class ToyLM:
    """A prefix-dependent random LM implementing the ``LanguageModel`` and ``Vocabulary`` protocols.

    ``base`` makes a draft model: its logits are the base model's plus seeded
    noise of size ``noise``, so the two agree partially (acceptance < 1).
    """

    def __init__(
        self,
        vocab_size: int,
        seed: int,
        scale: float = 1.6,
        base: ToyLM | None = None,
        noise: float = 1.0,
        context_size: int = 256,
        name: str = "toy",
        eos: int | None = None,
    ) -> None:
        self.name = name
        self._vocab_size = vocab_size
        self.seed = seed
        self.scale = scale
        self.base = base
        self.noise = noise
        self._context_size = context_size
        self.cache: list[int] = []
        self._memo: dict[tuple[int, ...], np.ndarray] = {}
        self.evaluated = 0  # tokens evaluated, for KV-reuse assertions
        self.eos = eos

    # -- LanguageModel ---------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def context_size(self) -> int:
        return self._context_size

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self.cache

    @property
    def decode_seconds(self) -> float:
        return 0.0

    def extend(self, tokens: Sequence[int], n_logits: int, borrow: bool = False) -> np.ndarray:
        if len(self.cache) + len(tokens) > self._context_size:
            raise RuntimeError("toy context overflow")
        self.cache.extend(int(t) for t in tokens)
        self.evaluated += len(tokens)
        n = len(self.cache)
        out = np.empty((n_logits, self._vocab_size), dtype=np.float32)
        for j in range(n_logits):
            out[j] = self.logits(self.cache[: n - n_logits + j + 1])
        return out

    def truncate(self, n_keep: int) -> None:
        del self.cache[n_keep:]

    # -- Vocabulary ------------------------------------------------------
    def token_bytes(self, token: int) -> bytes:
        return chr(ord("a") + token).encode()

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eos

    def tokenize(self, text: str | bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        text = text.decode() if isinstance(text, bytes) else text
        return [ord(c) - ord("a") for c in text]

    # -- exact model -----------------------------------------------------
    def logits(self, prefix: Sequence[int]) -> np.ndarray:
        key = tuple(prefix)
        row = self._memo.get(key)
        if row is None:
            rng = np.random.default_rng([self.seed, len(key), *key])
            own = rng.standard_normal(self._vocab_size)
            if self.base is None:
                row = (self.scale * own).astype(np.float32)
            else:
                base = self.base.logits(key)[: self._vocab_size].astype(np.float64)
                row = (base + self.noise * own).astype(np.float32)
            self._memo[key] = row
        return row


def exact_joint(model: ToyLM, prompt: Sequence[int], params: SamplingParams, length: int, vocab: int) -> np.ndarray:
    """``P(x_1..x_length | prompt)`` under ``model`` with ``params``, as an array of shape ``(vocab,)*length``."""
    joint = np.zeros((vocab,) * length)
    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        prefix = list(prompt)
        for tok in seq:
            prob *= probabilities(model.logits(prefix), params, prefix, vocab)[tok]
            if prob == 0.0:
                break
            prefix.append(tok)
        joint[seq] = prob
    return joint


def greedy_reference(model: ToyLM, prompt: Sequence[int], n: int, eos: int | None = None) -> list[int]:
    """Target-only greedy decoding straight from the exact logits (no cache, no loop)."""
    out: list[int] = []
    prefix = list(prompt)
    for _ in range(n):
        token = int(np.argmax(model.logits(prefix)))
        if token == eos:
            break
        out.append(token)
        prefix.append(token)
    return out
