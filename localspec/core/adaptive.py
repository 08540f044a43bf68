"""Adaptive draft length: pick K each step to maximise expected tokens per second.

DESIGN §7 gives the throughput of a step with ``k`` drafts::

    E[tokens](alpha, k) / (k * t_draft + t_verify(k + 1) + t_other(k))

Every quantity on the right is *measured* while generating: the acceptance
rate ``alpha`` (accepted / examined drafts, a running estimate with a prior),
the draft cost per token, the target's verify cost as a function of batch
size (a least-squares line through the batch sizes seen so far: on a CPU a
batch of 9 rows costs far less than 9 single rows, on a GPU almost nothing
more than one), and the orchestration time per verified row. K is chosen
before drafting, from information about earlier steps only, so it cannot
bias the output: exactness does not depend on K (DESIGN §2).

Every ``explore_every`` steps the controller tries a neighbour of its best K
(and every fourth time the far end of the range), so the cost line stays
measured around the optimum, a stale or unlucky measurement fades out, and a
K of 0 (the draft does not pay) is never a trap. Costs are medians of recent
samples per batch size: other processes on a shared machine make spikes.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from localspec.core.errors import ConfigError
from localspec.core.perf import expected_tokens_per_step


@dataclass
class AdaptiveK:
    """Chooses the number of draft tokens per step from measured acceptance and costs."""

    k_min: int
    k_max: int
    alpha_prior: float = 0.7  # prior acceptance rate, worth ``prior_weight`` examined drafts
    prior_weight: float = 4.0
    alpha_decay: float = 0.98  # running counts forget slowly: acceptance drifts with the text
    explore_every: int = 8
    verify_slope_prior: float = 0.15  # extra cost of one more verified row, as a fraction of one row
    stale_steps: float = 64.0  # a batch size not measured for this many steps counts half in the fit
    _accepted: float = 0.0
    _examined: float = 0.0
    _draft: deque = field(default_factory=lambda: deque(maxlen=16))  # recent draft seconds per token
    _other: deque = field(default_factory=lambda: deque(maxlen=16))  # recent other seconds per row
    _verify: dict[int, deque] = field(default_factory=dict)  # batch rows -> recent (step, seconds)
    _steps: int = 0
    _observed: int = 0
    _best: int | None = None
    history: list[int] = field(default_factory=list)  # the K chosen at each step

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_max:
            raise ConfigError(
                f"adaptive draft range {self.k_min}..{self.k_max} is empty; "
                "set speculative.min_draft_tokens <= speculative.draft_tokens"
            )

    # ------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """Running estimate of the per-token acceptance probability."""
        return (self._accepted + self.alpha_prior * self.prior_weight) / (self._examined + self.prior_weight)

    def verify_seconds(self, rows: int) -> float | None:
        """Predicted target seconds for a verification batch of ``rows`` rows (None before any data)."""
        if not self._verify:
            return None
        # per batch size: the median of recent samples (robust to a spike from another process),
        # weighted by how many there are and how recent they are (stale sizes fade out of the fit)
        points = [
            (n, statistics.median(t for _, t in samples),
             len(samples) * 0.5 ** ((self._observed - samples[-1][0]) / self.stale_steps))
            for n, samples in self._verify.items()
        ]  # fmt: skip
        if len(points) == 1:
            n0, t0, _ = points[0]
            one = t0 / (1.0 + self.verify_slope_prior * (n0 - 1))
            return one * (1.0 + self.verify_slope_prior * (rows - 1))
        sw = sum(w for _, _, w in points)
        mn = sum(w * n for n, _, w in points) / sw
        mt = sum(w * t for _, t, w in points) / sw
        var = sum(w * (n - mn) ** 2 for n, _, w in points)
        slope = max(0.0, sum(w * (n - mn) * (t - mt) for n, t, w in points) / var) if var > 0 else 0.0
        return max(mt + slope * (rows - mn), 1e-6)

    def step_seconds(self, k: int) -> float | None:
        verify = self.verify_seconds(k + 1)
        if verify is None:
            return None
        draft = (statistics.median(self._draft) if self._draft else 0.0) * k
        other = (statistics.median(self._other) if self._other else 0.0) * (k + 1)
        return draft + verify + other

    def rate(self, k: int) -> float | None:
        """Predicted tokens per second with ``k`` drafts (None before any data)."""
        seconds = self.step_seconds(k)
        if seconds is None or seconds <= 0:
            return None
        return expected_tokens_per_step(self.alpha, k) / seconds

    # ------------------------------------------------------------------
    def choose(self) -> int:
        """K for the next step."""
        self._steps += 1
        if self._verify and self._draft:
            self._best = max(range(self.k_min, self.k_max + 1), key=lambda k: (self.rate(k) or 0.0, -k))
        best = self._best if self._best is not None else self.k_max
        k = best
        if self.explore_every and self._steps % self.explore_every == 0 and self.k_max > self.k_min:
            # alternate between the neighbours of the best K so both sides stay measured, and now
            # and then jump to the far end, so one unlucky old measurement cannot pin K down
            turn = (self._steps // self.explore_every) % 4
            if turn == 3:
                k = self.k_max if best - self.k_min < self.k_max - best else self.k_min
            elif (turn % 2 == 0 and best < self.k_max) or best == self.k_min:
                k = best + 1
            else:
                k = best - 1
        self.history.append(k)
        if len(self.history) > 4096:
            del self.history[:2048]  # a controller lives as long as its decoder
        return k

    def observe(self, drafted: int, accepted: int, examined: int, draft_s: float, verify_s: float, other_s: float) -> None:
        """Feed back what one step did and cost (``drafted`` = tokens actually proposed)."""
        self._accepted = self._accepted * self.alpha_decay + accepted
        self._examined = self._examined * self.alpha_decay + examined
        if drafted > 0:
            self._draft.append(draft_s / drafted)
        rows = drafted + 1
        self._observed += 1
        self._verify.setdefault(rows, deque(maxlen=8)).append((self._observed, verify_s))
        self._other.append(other_s / rows)

    @property
    def mean_k(self) -> float:
        return sum(self.history) / len(self.history) if self.history else 0.0

