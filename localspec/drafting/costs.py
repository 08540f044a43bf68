"""What drafting costs here, learnt from the steps' timings: the cost half of adaptive drafting.

A step with ``k`` drafts costs ``k * t_draft + t_verify(k + 1) + t_other * (k + 1) + t_plan`` (docs/design.md,
Performance model). Each term is measured while generating: the draft's seconds per drafted token
(one-off catch-ups apart, kept per token read), the target's seconds per verification batch, the
seconds per step spent choosing what to draft (lookup's search and this choice), and the
seconds per verified row outside the models. Costs are medians of recent samples: other processes on
a shared machine make spikes.

Verification is kept per batch size, with a least-squares line through the sizes only for sizes not
measured yet: on a CPU with repacked weights a batch of 16 rows can cost *less* than one of 12 or 15
(llama.cpp's gemm reads the weights once per 16 rows, but once per 4 rows below that), so a straight
line would pick the wrong sizes; on a GPU a batch costs little more than one row. Before the first
step the costs come from a few timed batches (:mod:`localspec.drafting.calibrate`), so no reply starts
by guessing.

A batch whose size differs from the one before costs more than one of the same size: llama.cpp builds
its compute graph again (and on CUDA captures it again), where a batch of the same size reuses it. A
size's cost is kept as the size costs decode after decode, and the extra of a change of size apart
(:meth:`CostModel.switch_seconds`): learnt from the batches that followed another size, against their
size's steady cost. On a CPU the extra is a few per cent of a batch; on a GPU it is a large part of one
(docs/performance.md, "A change of batch size").
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass

from localspec.core.policy import LOOKUP, MODEL
from localspec.drafting.calibrate import Costs


@dataclass
class CostModel:
    """Predicted seconds of a step's parts, from recent timings of each model."""

    verify_slope_prior: float = 0.15  # extra cost of one more verified row, as a fraction of one row
    stale_steps: float = 64.0  # a batch size not measured for this many steps counts half in the fit
    refresh_steps: int = 8  # a drafting step's predicted cost is derived again at least this often (step_seconds)

    def __post_init__(self) -> None:
        self._draft: deque[float] = deque(maxlen=16)  # recent draft seconds per token
        self._catch_up: deque[float] = deque(maxlen=8)  # recent catch-up seconds per backlog token
        self._other: deque[float] = deque(maxlen=16)  # recent other seconds per row
        self._plan: deque[float] = deque(maxlen=16)  # recent seconds per step spent choosing it
        self._verify: dict[int, deque] = {}  # batch rows -> recent (step, seconds) after a batch of the same size
        self._changed: dict[int, deque] = {}  # batch rows -> recent (step, seconds) after a batch of another size
        self._switch: deque[float] = deque(maxlen=16)  # recent extra seconds of a change of size
        self._last_one_row: int | None = None  # the last step of one row
        self.last_rows: int | None = None  # the size of the last batch (None: unknown, as after a prompt)
        self._seeded: dict[int, tuple[int, float]] = {}  # rows -> (step, seconds) timed before step 1
        self._cache: dict = {}  # estimates derived from the samples (see _memo)
        self._step_cache: dict = {}  # predicted seconds of drafting steps (see step_seconds)
        self.observed = 0  # steps observed

    def seed(self, costs: Costs) -> None:
        """Start from costs measured before the first step: each counts as one sample of its batch size,
        so the steps' own timings soon outvote it, and moves with the one-row cost the steps measure
        (``_drift``)."""
        for rows, seconds in costs.verify_s.items():
            self._seeded[rows] = (self.observed, seconds)
        if costs.switch_s is not None:
            self._switch.append(costs.switch_s)
        if costs.draft_token_s is not None:
            self._draft.append(costs.draft_token_s)
        if costs.catch_up_token_s is not None:
            self._catch_up.append(costs.catch_up_token_s)
        if costs.other_row_s is not None:
            self._other.append(costs.other_row_s)
        self._forget()

    def learned(self) -> Costs:
        """The costs as they stand: the medians of the recent samples (see :meth:`seed`)."""
        median = lambda samples: statistics.median(samples) if samples else None  # noqa: E731
        verify = {rows: median([t for _, t in self._samples(rows)]) for rows in sorted(self._sizes())}
        other = median(self._other)
        return Costs({rows: t for rows, t in verify.items() if t}, median(self._draft), median(self._catch_up),
                     max(0.0, other) if other is not None else None,
                     self.switch_seconds() if self._switch else None)  # fmt: skip

    # --- what a step tells -------------------------------------------------
    def observe(self, rows: int, verify_s: float, other_s: float, plan_s: float = 0.0) -> None:
        """A step verified ``rows`` rows in ``verify_s`` seconds and spent ``other_s`` outside the models,
        besides ``plan_s`` choosing what to draft."""
        self.observed += 1
        if rows == self.last_rows:
            self._verify.setdefault(rows, deque(maxlen=8)).append((self.observed, verify_s))
        else:
            self._changed.setdefault(rows, deque(maxlen=8)).append((self.observed, verify_s))
            steady = self._verify.get(rows)
            if steady:
                self._switch.append(verify_s - statistics.median(t for _, t in steady))
        self.last_rows = rows
        if rows == 1:
            self._last_one_row = self.observed
        self._other.append(other_s / rows)
        self._plan.append(plan_s)
        self._cache.clear()
        if rows > 1 or self.observed % self.refresh_steps == 0:
            self._step_cache.clear()

    def new_reply(self) -> None:
        """The target read a prompt since the last step: the next batch follows another size."""
        self.last_rows = None

    def observe_draft(self, drafted: int, draft_s: float, catch_up_s: float = 0.0, backlog: int = 0) -> None:
        """The draft model proposed ``drafted`` tokens in ``draft_s`` seconds, after reading ``backlog``
        tokens it had sat out in ``catch_up_s`` (a one-off, apart from what drafting a token costs)."""
        self._draft.append(draft_s / drafted)
        if backlog > 0 and catch_up_s > 0:
            self._catch_up.append(catch_up_s / backlog)
        self._forget()

    def observe_draft_token(self, seconds: float) -> None:
        """One draft token timed on its own (a re-timing, no catch-up)."""
        self._draft.append(seconds)
        self._forget()

    def _forget(self) -> None:
        """Every derived estimate is out of date."""
        self._cache.clear()
        self._step_cache.clear()

    # --- estimates ----------------------------------------------------------
    @property
    def draft_timed(self) -> bool:
        """Whether a drafted token has a timing."""
        return bool(self._draft)

    @property
    def verify_timed(self) -> bool:
        """Whether any verification batch has a timing (the steps' own or from before the first step)."""
        return bool(self._sizes())

    def steps_since_one_row(self) -> int | None:
        """Steps observed since the last one-row step (None: no step had one row)."""
        return self.observed - self._last_one_row if self._last_one_row is not None else None

    def switch_seconds(self) -> float:
        """Predicted extra seconds of a batch whose size differs from the one before (0 before any data):
        the median of recent changes' extra over their size's steady cost, none below zero."""
        return self._memo("switch", lambda: max(0.0, statistics.median(self._switch)) if self._switch else 0.0)

    def change_seconds(self, rows: int) -> float:
        """What a batch of ``rows`` rows costs beyond its steady cost if it were the next one."""
        return self.switch_seconds() if rows != self.last_rows else 0.0

    def verify_seconds(self, rows: int) -> float | None:
        """Predicted target seconds for a verification batch of ``rows`` rows after one of the same size
        (None before any data): the median of its recent measurements, else the fitted line. A size's own
        samples never age out by the clock: a long stretch of one-row steps (nothing pays) says nothing
        new about what 8 rows cost, and forgetting it would hand the choice back to the line."""
        return self._memo(("verify", rows), lambda: self._measured_verify_seconds(rows))

    def step_seconds(self, k: int, source: str = MODEL) -> float | None:
        """Predicted seconds of a step drafting ``k`` tokens from ``source`` (None before any data).

        The target alone's (``k`` = 0) follows every step. A drafting step's is derived again when a step
        of more than one row or a draft timing brought news, and every ``refresh_steps`` steps otherwise:
        a stretch of one-row steps moves it only through the medians of the other and plan seconds and
        the drift of the timings taken before the first step, and deriving the up to 40 sizes a step
        weighs (lookup's copies and the model's K) after every one-row step cost more than the rest of
        the step's choice."""
        if k == 0:
            return self._memo(("step", 0, source), lambda: self._step_seconds(0, source))
        key = (k, source)
        if key not in self._step_cache:
            self._step_cache[key] = self._step_seconds(k, source)
        return self._step_cache[key]

    def catch_up_seconds(self, backlog: int) -> float:
        """Predicted seconds for the draft to read ``backlog`` tokens it sat out, in one batch: measured
        per token on earlier catch-ups, else guessed at half a drafted token each (a batch is cheaper
        per token than one-by-one drafting)."""
        if backlog <= 0:
            return 0.0
        if self._catch_up:
            return backlog * statistics.median(self._catch_up)
        return backlog * (statistics.median(self._draft) / 2 if self._draft else 0.0)

    def _step_seconds(self, k: int, source: str) -> float | None:
        verify = self._optimistic_verify_seconds(k + 1) if source == LOOKUP else self.verify_seconds(k + 1)
        if verify is None:
            return None
        draft = self._memo("draft", lambda: statistics.median(self._draft) if self._draft else 0.0)
        other = self._memo("other", lambda: statistics.median(self._other) if self._other else 0.0)
        plan = self._memo("plan", lambda: statistics.median(self._plan) if self._plan else 0.0)
        return (draft * k if source == MODEL else 0.0) + verify + other * (k + 1) + plan

    def _measured_verify_seconds(self, rows: int) -> float | None:
        samples = self._samples(rows)
        if samples:
            return statistics.median(t for _, t in samples)
        return self._fitted_verify_seconds(rows)

    def _live(self, rows: int) -> list[tuple[int, float]]:
        """A batch size's steps' own (step, seconds) samples as they cost after the same size: a sample that
        followed another size less the extra of a change (:meth:`switch_seconds`)."""
        samples = list(self._verify.get(rows, ()))
        if rows in self._changed:
            switch = self.switch_seconds()
            samples += [(step, max(t - switch, 1e-6)) for step, t in self._changed[rows]]
            samples.sort()
        return samples

    def _samples(self, rows: int) -> list[tuple[int, float]]:
        """A batch size's (step, seconds) samples: its steps' own (:meth:`_live`), after its pre-step
        timing scaled by ``_drift``."""
        samples = self._live(rows)
        if rows in self._seeded:
            step, seconds = self._seeded[rows]
            samples.insert(0, (step, seconds * self._memo("drift", self._drift)))
        return samples

    def _drift(self) -> float:
        """How much the one-row cost has moved since the costs were timed before the first step (its
        steps' median over that timing). The pre-step timings of sizes the steps do not use scale with
        it: a process's first decodes can run slower than its later ones, and batches timed in that slow
        stretch, never re-timed while the model does not draft, kept it from ever drafting
        (docs/performance.md, "Adaptive K")."""
        live, seeded = self._live(1), self._seeded.get(1)
        if not live or seeded is None or seeded[1] <= 0:
            return 1.0
        return statistics.median(t for _, t in live) / seeded[1]

    def _sizes(self) -> set[int]:
        """The batch sizes with a timing (the steps' own or from before the first step)."""
        return self._memo("sizes", lambda: set(self._verify) | set(self._changed) | set(self._seeded))

    def _memo(self, key, compute):
        """Estimates are derived from the samples at most once between two observations: a lookup step
        weighs up to 32 sizes, and re-deriving the medians for each is a measurable share of a step."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def _fitted_verify_seconds(self, rows: int) -> float | None:
        if not self._sizes():
            return None
        mn, mt, slope = self._memo("line", self._fit_line)
        return max(mt + slope * (rows - mn), 1e-6)

    def _fit_line(self) -> tuple[float, float, float]:
        """The verify-cost line as (mean rows, mean seconds, slope); through one point, the prior slope."""
        # per batch size: the median of recent samples (robust to a spike from another process),
        # weighted by how many there are and how recent they are (stale sizes fade out of the fit)
        points = [
            (n, statistics.median(t for _, t in samples),
             len(samples) * 0.5 ** ((self.observed - samples[-1][0]) / self.stale_steps))
            for n, samples in ((n, self._samples(n)) for n in self._sizes())
        ]  # fmt: skip
        if len(points) == 1:
            n0, t0, _ = points[0]
            return n0, t0, self.verify_slope_prior * t0 / (1.0 + self.verify_slope_prior * (n0 - 1))
        sw = sum(w for _, _, w in points)
        mn = sum(w * n for n, _, w in points) / sw
        mt = sum(w * t for _, t, w in points) / sw
        var = sum(w * (n - mn) ** 2 for n, _, w in points)
        slope = max(0.0, sum(w * (n - mn) * (t - mt) for n, t, w in points) / var) if var > 0 else 0.0
        return mn, mt, slope

    def _optimistic_verify_seconds(self, rows: int) -> float | None:
        """Lookup's view of a batch size: its measured cost; between two measured sizes, the straight
        line between them; beyond the largest, the cheaper of the fitted line and the largest size's
        cost per row. Lookup drafts are free, so the only way to learn what a longer batch costs is
        to try it once; a line through gemv-heavy sizes (5, 6, 7 rows) would keep it from ever trying
        the larger sizes that cost no more. Inside the measured range the neighbours say more: the
        best per-row cost measured applied to every smaller size made each look as cheap per row, so a
        quote's drafts grew one size at a time, each tried once at a loss; and applied beyond a larger
        size measured dearer per row, it had those sizes tried too."""
        fitted = self.verify_seconds(rows)
        if rows in self._sizes() or fitted is None:
            return fitted
        sizes = self._memo("sorted sizes", lambda: sorted(self._sizes()))  # a quote weighs up to 32 sizes a step
        at = bisect.bisect_left(sizes, rows)
        below, above = sizes[at - 1] if at else None, sizes[at] if at < len(sizes) else None
        if above is None:
            return min(fitted, self.verify_seconds(below) * rows / below)
        if below is None:
            return fitted
        low, high = self.verify_seconds(below), self.verify_seconds(above)
        return low + (high - low) * (rows - below) / (above - below)
