"""Counter-based Gumbel noise for the drafter-invariant mode.

The noise for a token is a pure function ``g(seed, request_key, position,
token_id)``: Philox keyed by ``(seed, request_key)`` with the absolute
position in the counter, one Exp(1) variate per token id, ``g = -log(E)``.
Because nothing depends on how many random numbers were drawn before, the
draft (any draft, or none) and the target see exactly the same noise at each
position, which is what makes the output independent of the drafter.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

_MASK64 = (1 << 64) - 1


def gumbel_noise(
    seed: int, request_key: int, position: int, vocab_size: int, generator: np.random.Generator | None = None
) -> np.ndarray:
    """Gumbel(0, 1) noise for every token id at one absolute position (float64).

    ``generator`` (a Philox generator) is reused when given: its state is set
    to the (key, counter) of this position, which is much cheaper than
    building a new generator for every position.
    """
    if generator is None:
        generator = np.random.Generator(np.random.Philox(key=0))
    generator.bit_generator.state = {
        "bit_generator": "Philox",
        "state": {
            "counter": np.array([0, 0, 0, position & _MASK64], dtype=np.uint64),
            "key": np.array([seed & _MASK64, request_key & _MASK64], dtype=np.uint64),
        },
        "buffer": np.zeros(4, dtype=np.uint64),
        "buffer_pos": 4,
        "has_uint32": 0,
        "uinteger": 0,
    }
    exp = generator.standard_exponential(vocab_size)
    np.log(exp, out=exp)
    np.negative(exp, out=exp)
    return exp


class NoiseTable:
    """Remembers the noise of recent positions so draft and target share one computation.

    Drawing noise for a 150k vocabulary costs milliseconds; each position is
    needed by the drafter and then again by the verifier.
    """

    def __init__(self, seed: int, request_key: int, vocab_size: int, capacity: int = 64) -> None:
        self.seed = seed
        self.request_key = request_key
        self.vocab_size = vocab_size
        self._capacity = capacity
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._generator = np.random.Generator(np.random.Philox(key=0))

    def __call__(self, position: int) -> np.ndarray:
        row = self._rows.get(position)
        if row is None:
            row = gumbel_noise(self.seed, self.request_key, position, self.vocab_size, self._generator)
            self._rows[position] = row
            if len(self._rows) > self._capacity:
                self._rows.popitem(last=False)
        return row
