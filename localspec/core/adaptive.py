"""Adaptive draft length: pick K each step to maximise expected tokens per second.

docs/design.md (Performance model) gives the throughput of a step with ``k`` drafts::

    E[tokens](alpha, k) / (k * t_draft + t_verify(k + 1) + t_other(k))

Every quantity on the right is *measured* while generating: the acceptance
rate ``alpha`` (accepted / examined drafts, a running estimate with a prior),
the draft cost per token, the target's verify cost as a function of batch
size (a least-squares line through the batch sizes seen so far: on a CPU a
batch of 9 rows costs far less than 9 single rows, on a GPU almost nothing
more than one), and the orchestration time per verified row. K is chosen
before drafting, from information about earlier steps only, so it cannot
bias the output: exactness does not depend on K (docs/design.md, Verification rules).

Every ``explore_every`` steps the controller tries a neighbour of its best K
(and every fourth time the far end of the range), so the cost line stays
measured around the optimum and a stale or unlucky measurement fades out.
Costs are medians of recent samples per batch size: other processes on a
shared machine make spikes.

With prompt lookup beside the model (the hybrid drafter) each step has a
third candidate: copy the continuation lookup found. Its drafts cost nothing
to make, only their verification rows; its acceptance is estimated per
*match length* (how many tokens before the end of the context agree with the
occurrence copied from), starting from acceptances measured per match length
on the real pair (``LOOKUP_PRIOR``: a match of 16 tokens or more is a quote, a
shorter one mostly a coincidence). The estimates learn from every step, not
only from lookup's own drafts: whatever drafted, the tokens the target wrote
are compared with what lookup would have copied (``observe_match``), so a
match length lookup is not trusted with still gets measured, and a draft of
``k`` copied tokens is credited position by position (its ``i``-th token was
examined at match length ``m + i``). The step takes whichever of none /
model K / lookup K promises the most tokens per second.

Verification cost is kept per batch size (medians of recent samples), with a
line through them only for sizes not measured yet: on a CPU with repacked
weights a batch of 16 rows costs *less* than one of 12 or 15 (llama.cpp's
gemm reads the weights once per 16 rows, but once per 4 rows below that),
so a straight line would pick the wrong sizes.

When drafting does not pay (best K = 0: a draft that costs more than half a
target token, as on a CPU with a 1.5B target and a 0.5B draft), the reply
runs at the target's own speed; a one-draft probe now and then finds out
whether that is still so. Each probe that changes nothing doubles the gap to
the next (up to ``max_probe_gap`` steps), so a pair where drafting never pays
loses almost nothing to probing, while a reply that reaches text the draft
predicts well is noticed within a bounded number of steps.

The draft model reads what it sat out before it drafts (a new reply's
prompt, a stretch of lookup or K = 0 steps): seconds for a long prompt on a
CPU. That catch-up is weighed: the model is switched to only where it saves
more over the next ``horizon_tokens`` tokens than the catch-up costs; a probe
waits while its catch-up would cost more than 3 % of the reply's steps since
the model last drafted; and where the costs rule the model out even at
acceptance 1, probes only time one draft token (``remeasure_draft``). Before
the first step the costs come from a few timed batches
(:mod:`localspec.core.calibrate`), so no reply starts by guessing.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from localspec.core.calibrate import Costs
from localspec.core.drafters import LOOKUP, MODEL, Match
from localspec.core.errors import ConfigError
from localspec.core.perf import expected_tokens_per_step

MATCH_BUCKETS = (1, 2, 3, 4, 8, 16, 32)  # lookup acceptance is estimated per match length, in these bins
# Prior acceptance of a lookup draft per bin, measured on the real pair (bench prompts, 256 tokens, T = 0
# and 0.7, lookup forced at K = 4 on every step): free text repeats short phrases ("\n\n### ", "the
# ") that do not continue as before, so matches under 16 tokens are accepted 5-45 % of the time, while
# quotes of 16 or more run at 77-97 %. (The rule of succession's m / (m + 1) said 50-80 % for the
# short ones: every reply paid a few failed lookup drafts, 5-10 % of its speed, to unlearn it.)
LOOKUP_PRIOR = {1: 0.2, 2: 0.2, 3: 0.25, 4: 0.25, 8: 0.4, 16: 0.8, 32: 0.95}


def match_bucket(length: int) -> int:
    """The bin of a lookup match ``length`` tokens long (the largest bound not above it)."""
    return max((b for b in MATCH_BUCKETS if b <= length), default=MATCH_BUCKETS[0])


@dataclass(frozen=True)
class Learned:
    """What a controller has learnt, for a later process to start from: its costs (the medians of its
    recent samples) and its acceptance counts (``accepted`` / ``examined`` model drafts, and lookup's
    ``[agreed, compared]`` per match bin)."""

    costs: Costs
    accepted: float = 0.0
    examined: float = 0.0
    lookup: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What the next step drafts: ``k`` tokens from ``source`` (MODEL, LOOKUP, or "" for none)."""

    source: str
    k: int


@dataclass
class AdaptiveK:
    """Chooses the number of draft tokens per step from measured acceptance and costs."""

    k_min: int
    k_max: int
    lookup_max: int = 32  # most lookup drafts per step (they cost only their verification rows)
    alpha_prior: float = 0.7  # prior acceptance rate, worth ``prior_weight`` examined drafts
    prior_weight: float = 4.0
    alpha_decay: float = 0.98  # running counts forget slowly: acceptance drifts with the text
    idle_decay: float = 0.995  # per step the model did not draft (K = 0): its prior returns over ~200 steps
    explore_every: int = 8
    verify_slope_prior: float = 0.15  # extra cost of one more verified row, as a fraction of one row
    stale_steps: float = 64.0  # a batch size not measured for this many steps counts half in the fit
    max_probe_gap: int = 64  # at K = 0: the longest wait between one-draft probes
    hopeless_factor: int = 4  # ... times this between re-timings where the costs alone rule drafting out
    retime_alone: int = 32  # while the model drafts: a one-row step when the last one is this many steps old
    horizon_tokens: int = 64  # the draft's catch-up must pay for itself within this many tokens
    wait_steps: int = 4  # a long catch-up waits over a reply's first steps, and this long after a lookup match, ...
    wait_catch_up: float = 4.0  # ... while it costs more than this many times what waiting lost (see _wait)
    probe_budget: float = 0.03  # a probe's catch-up may cost this share of the reply's steps without the model
    reply_carry: float = 0.25  # the weight lookup's evidence keeps into a new reply (see new_reply)
    _accepted: float = 0.0
    _examined: float = 0.0
    _draft: deque = field(default_factory=lambda: deque(maxlen=16))  # recent draft seconds per token
    _catch_up: deque = field(default_factory=lambda: deque(maxlen=8))  # recent catch-up seconds per backlog token
    _other: deque = field(default_factory=lambda: deque(maxlen=16))  # recent other seconds per row
    _verify: dict[int, deque] = field(default_factory=dict)  # batch rows -> recent (step, seconds)
    _seeded: dict[int, tuple[int, float]] = field(default_factory=dict)  # rows -> (step, seconds) timed before step 1
    # match bin -> [agreed, compared]: how often the target wrote what lookup offered, decayed per comparison
    _lookup: dict[int, list[float]] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)  # estimates derived from the samples (see _memo)
    _steps: int = 0
    _observed: int = 0
    _best: int | None = None
    _probe_gap: int = 0  # steps between probes while not drafting (doubles while probes say no)
    _dirty: bool = True  # a drafting step was observed since the cost model was last solved
    _next_probe: int = 0
    _model_step: int = 0  # the last step the model drafted
    _reply_start: int = 0  # the step the current reply began at
    _quoted_step: int = -1_000_000  # the last step lookup had a match of two or more tokens
    _waited_s: float = 0.0  # seconds the current reply lost while a catch-up waited (see _wait)
    # set when the draft's cost per token should be timed again (a one-token decode, no catch-up): while
    # the costs rule drafting out, only a change of costs could bring it back, and that is all a probe
    # that drafted would find out, at the price of the draft reading everything it sat out
    remeasure_draft: bool = False
    history: list[int] = field(default_factory=list)  # the K chosen at each step

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_max:
            raise ConfigError(
                f"adaptive draft range {self.k_min}..{self.k_max} is empty; "
                "set speculative.min_draft_tokens <= speculative.draft_tokens"
            )

    def seed(self, costs: Costs) -> None:
        """Start from costs measured before the first step (see :mod:`localspec.core.calibrate`): each
        counts as one sample of its batch size, so the steps' own timings soon outvote it, and moves
        with the one-row cost the steps measure (``_drift``)."""
        for rows, seconds in costs.verify_s.items():
            self._seeded[rows] = (self._observed, seconds)
        if costs.draft_token_s is not None:
            self._draft.append(costs.draft_token_s)
        if costs.catch_up_token_s is not None:
            self._catch_up.append(costs.catch_up_token_s)
        if costs.other_row_s is not None:
            self._other.append(costs.other_row_s)
        self._dirty = True
        self._cache.clear()

    def learned(self) -> Learned:
        """Its costs and acceptance counts as they stand (see :meth:`resume`)."""
        median = lambda samples: statistics.median(samples) if samples else None  # noqa: E731
        verify = {rows: median([t for _, t in self._samples(rows)]) for rows in sorted(self._sizes())}
        other = median(self._other)
        costs = Costs({rows: t for rows, t in verify.items() if t}, median(self._draft), median(self._catch_up),
                      max(0.0, other) if other is not None else None)  # fmt: skip
        lookup = {bin_: (agreed, compared) for bin_, (agreed, compared) in self._lookup.items()}
        return Learned(costs, self._accepted, self._examined, lookup)

    def resume(self, learned: Learned) -> None:
        """Start from what an earlier controller learnt: its costs count as one sample each (as
        :meth:`seed`'s do), its acceptance counts as they were, so the first reply of a new process drafts
        as the last reply of the old one ended instead of from the prior."""
        self.seed(learned.costs)
        self._accepted, self._examined = learned.accepted, learned.examined
        self._lookup = {bin_: [agreed, compared] for bin_, (agreed, compared) in learned.lookup.items()}

    # ------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """Running estimate of the per-token acceptance probability."""
        return (self._accepted + self.alpha_prior * self.prior_weight) / (self._examined + self.prior_weight)

    def verify_seconds(self, rows: int) -> float | None:
        """Predicted target seconds for a verification batch of ``rows`` rows (None before any data):
        the median of its recent measurements, else the fitted line. A size's own samples never age
        out by the clock: a long stretch of one-row steps (nothing pays) says nothing new about what
        8 rows cost, and forgetting it would hand the choice back to the line."""
        return self._memo(("verify", rows), lambda: self._measured_verify_seconds(rows))

    def _measured_verify_seconds(self, rows: int) -> float | None:
        samples = self._samples(rows)
        if samples:
            return statistics.median(t for _, t in samples)
        return self._fitted_verify_seconds(rows)

    def _samples(self, rows: int) -> list[tuple[int, float]]:
        """A batch size's (step, seconds) samples: its steps' own, after its pre-step timing scaled by
        ``_drift``."""
        samples = list(self._verify.get(rows, ()))
        if rows in self._seeded:
            step, seconds = self._seeded[rows]
            samples.insert(0, (step, seconds * self._memo("drift", self._drift)))
        return samples

    def _drift(self) -> float:
        """How much the one-row cost has moved since the costs were timed before the first step (its
        steps' median over that timing). The pre-step timings of sizes the steps do not use scale with
        it: a process's first decodes can run slower than its later ones (the demo target timed 12.5 ms
        a row before the first step and decoded at 9 ms), and 2-16-row batches timed in that slow
        stretch, never re-timed while the model does not draft, kept it from ever drafting."""
        live, seeded = self._verify.get(1), self._seeded.get(1)
        if not live or seeded is None or seeded[1] <= 0:
            return 1.0
        return statistics.median(t for _, t in live) / seeded[1]

    def _sizes(self) -> set[int]:
        """The batch sizes with a timing (the steps' own or from before the first step)."""
        return self._memo("sizes", lambda: set(self._verify) | set(self._seeded))

    def _memo(self, key, compute):
        """Estimates are derived from the samples at most once between two observations: a lookup
        step weighs up to 32 sizes, and re-deriving medians for each cost 3% of a target token."""
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
             len(samples) * 0.5 ** ((self._observed - samples[-1][0]) / self.stale_steps))
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
        16 rows, which cost no more than 12. Inside the measured range the neighbours say more:
        the best per-row cost measured (16 rows') applied to 3-15 rows made every size look as cheap
        per row, so a quote's drafts grew one size at a time, each tried once at a loss; and applied
        beyond a larger size measured dearer per row (29 rows), it had 30, 31 and 32 rows tried too."""
        fitted = self.verify_seconds(rows)
        sizes = self._sizes()
        if rows in sizes or fitted is None:
            return fitted
        below = max((n for n in sizes if n < rows), default=None)
        above = min((n for n in sizes if n > rows), default=None)
        if above is None:
            return min(fitted, self.verify_seconds(below) * rows / below)
        if below is None:
            return fitted
        low, high = self.verify_seconds(below), self.verify_seconds(above)
        return low + (high - low) * (rows - below) / (above - below)

    def step_seconds(self, k: int, source: str = MODEL) -> float | None:
        return self._memo(("step", k, source), lambda: self._step_seconds(k, source))

    def _step_seconds(self, k: int, source: str) -> float | None:
        verify = self._optimistic_verify_seconds(k + 1) if source == LOOKUP else self.verify_seconds(k + 1)
        if verify is None:
            return None
        draft = self._memo("draft", lambda: statistics.median(self._draft) if self._draft else 0.0)
        other = self._memo("other", lambda: statistics.median(self._other) if self._other else 0.0)
        return (draft * k if source == MODEL else 0.0) + verify + other * (k + 1)

    def rate(self, k: int) -> float | None:
        """Predicted tokens per second with ``k`` model drafts (None before any data)."""
        seconds = self.step_seconds(k)
        if seconds is None or seconds <= 0:
            return None
        return expected_tokens_per_step(self.alpha, k) / seconds

    def new_reply(self) -> None:
        """A reply begins: probing budgets are per reply (see ``_probe``), and lookup's evidence shrinks to
        ``reply_carry`` of its weight. How often a match continues differs from reply to reply (a chat
        reply quotes nothing, a summary phrases, an edit a whole function): the new reply's own
        comparisons soon outweigh the last reply's, while a bin seen often keeps its direction."""
        self._reply_start = self._steps
        self._waited_s = 0.0
        for counts in self._lookup.values():
            counts[0] *= self.reply_carry
            counts[1] *= self.reply_carry

    def lookup_alpha(self, length: int) -> float:
        """Acceptance estimate of a copied token at match length ``length``: its bin's counts, with the
        bin's measured prior (``LOOKUP_PRIOR``) worth ``prior_weight`` comparisons. The counts carry over
        from reply to reply (a quarter of their weight, see ``new_reply``): binned by match length, they
        describe how quotes and coincidences fare."""
        m = match_bucket(length)
        agreed, compared = self._lookup.get(m, (0.0, 0.0))
        return (agreed + LOOKUP_PRIOR[m] * self.prior_weight) / (compared + self.prior_weight)

    def lookup_expected(self, length: int, k: int) -> list[float]:
        """Expected tokens of a step copying 1..``k`` tokens of a match ``length`` tokens long (index
        ``n - 1`` for ``n`` copies): copied token ``i`` is reached only if the ones before it were
        accepted, and is judged at match length ``length + i``, so a quote's estimate rises as it goes."""
        expected, reach, out = 1.0, 1.0, []
        for i in range(k):
            reach *= self.lookup_alpha(length + i)
            expected += reach
            out.append(expected)
        return out

    def observe_match(self, length: int, agreed: int, compared: int) -> None:
        """What the target wrote after a lookup match ``length`` tokens long, whatever drafted: its first
        ``agreed`` tokens were the ones lookup offered, of ``compared`` compared (``compared > agreed``:
        the next one differed). Every token the target writes is distributed as the target's own, so
        comparing it with the copy measures a copied token's acceptance without drafting one. Each bin
        forgets at ``alpha_decay`` per comparison it receives: it keeps the last ~50, however old."""
        for i in range(compared):
            counts = self._lookup.setdefault(match_bucket(length + i), [0.0, 0.0])
            counts[0] = counts[0] * self.alpha_decay + (i < agreed)
            counts[1] = counts[1] * self.alpha_decay + 1.0

    # ------------------------------------------------------------------
    def choose(self, match: Match | None = None, model: bool = True, backlog: int = 0) -> Plan:
        """What the next step drafts: lookup when ``match`` promises more than the model or nothing,
        else the model's K (``model``: a draft model is there to ask; ``backlog``: tokens it would
        have to read first, beyond the usual two)."""
        self._steps += 1
        if match is not None and match.length >= 2:
            self._quoted_step = self._steps
        may_quote = self.wait_steps > 0 and self._steps - max(self._reply_start, self._quoted_step) <= self.wait_steps
        plan = None
        if match is not None and self.lookup_max > 0:
            plan = self._lookup_plan(match, model, backlog, may_quote)
        if plan is None:
            plan = Plan(MODEL, self._model_k(backlog, may_quote)) if model else Plan("", 0)
        if plan.k == 0:
            plan = Plan("", 0)
        self.history.append(plan.k)
        if len(self.history) > 4096:
            del self.history[:2048]  # a controller lives as long as its decoder
        return plan

    def _lookup_plan(self, match: Match, model: bool, backlog: int = 0, may_quote: bool = False) -> Plan | None:
        """The lookup K with the best predicted rate, if it beats drafting nothing and the model's best K
        as it stands this step (see :meth:`_model_rival`)."""
        ks = range(1, min(self.lookup_max, match.available) + 1)
        if not ks:
            return None
        if self.verify_seconds(1) is None:  # nothing measured yet: free drafts are worth a try
            return Plan(LOOKUP, ks[-1])
        expected = self.lookup_expected(match.length, ks[-1])
        best, fewest = max((expected[n - 1] / self.step_seconds(n, LOOKUP), -n) for n in ks)  # ties: fewer copies
        n = -fewest
        alone = (self.rate(0) or 0.0) if not model or self.k_min == 0 else 0.0
        model_rate, waits, waiting = self._model_rival(backlog, may_quote) if model else (0.0, False, 0.0)
        if best <= max(alone, model_rate):
            return None
        if waits and best < waiting:  # the model sat this step out for a copy it would have outrun
            self._waited_s += expected[n - 1] * (1.0 / best - 1.0 / waiting)
        return Plan(LOOKUP, n)

    def _model_rival(self, backlog: int, may_quote: bool) -> tuple[float, bool, float]:
        """The model's best predicted rate against lookup this step: none while its catch-up on
        ``backlog`` sat-out tokens waits or does not pay, and with the catch-up spread over
        ``horizon_tokens`` where it does. Rated without its catch-up, the model beat lookup's copy of
        a summary's next words at every step while the catch-up kept it from drafting, and the
        target wrote them alone (real pair, AMX VM: 8 steps of growing matches, nothing drafted).
        Also says whether the model waits this step, and its rate once caught up (what a lookup step
        taken while it waits is weighed against)."""
        k = max(range(max(1, self.k_min), self.k_max + 1), key=lambda n: (self.rate(n) or 0.0, -n), default=0)
        rate = (self.rate(k) or 0.0) if k else 0.0
        if rate <= 0.0 or backlog <= 0 or self.k_min > 0:
            return rate, False, rate
        if self._wait(backlog, may_quote, k, count=False):
            return 0.0, True, rate
        if not self._worth_catching_up(k, backlog):
            return 0.0, False, rate
        return 1.0 / (1.0 / rate + self.catch_up_seconds(backlog) / self.horizon_tokens), False, rate

    def catch_up_seconds(self, backlog: int) -> float:
        """Predicted seconds for the draft to read ``backlog`` tokens it sat out, in one batch: measured
        per token on earlier catch-ups, else guessed at half a drafted token each (a batch is cheaper
        per token than one-by-one drafting)."""
        if backlog <= 0:
            return 0.0
        if self._catch_up:
            return backlog * statistics.median(self._catch_up)
        return backlog * (statistics.median(self._draft) / 2 if self._draft else 0.0)

    def remeasured(self, draft_token_s: float) -> None:
        """The draft's cost per token, timed again on request (``remeasure_draft``)."""
        self.remeasure_draft = False
        if draft_token_s > 0:
            self._draft.append(draft_token_s)
            self._dirty = True
            self._cache.clear()

    def _model_k(self, backlog: int = 0, may_quote: bool = False) -> int:
        """The model's K: the best predicted, a neighbour now and then, or a probe while it does not pay."""
        # the cost model is re-solved when a step brought news about drafting, and every few steps
        # otherwise (K = 0 steps only refine the one-row cost): solving it each step costs ~2% of a token
        fresh = self._dirty or self._steps % max(1, self.explore_every) == 0
        if self._sizes() and self._draft and fresh:
            self._best = max(range(self.k_min, self.k_max + 1), key=lambda k: (self.rate(k) or 0.0, -k))
            self._dirty = False
        best = self._best if self._best is not None else self.k_max
        k = best
        if best == 0 and self.k_max > 0:
            k = self._probe(backlog)
        elif self.explore_every and self._steps % self.explore_every == 0 and self.k_max > self.k_min:
            # alternate between the neighbours of the best K so both sides stay measured, and now
            # and then jump to the far end, so one unlucky old measurement cannot pin K down
            turn = (self._steps // self.explore_every) % 4
            if turn == 3:
                k = self.k_max if best - self.k_min < self.k_max - best else self.k_min
            elif (turn % 2 == 0 and best < self.k_max) or best == self.k_min:
                k = best + 1
            else:
                k = best - 1
        if best > 0:
            self._probe_gap = 0  # drafting pays: the next stop starts probing often again
            if self.k_min == 0 and (
                not self._worth_catching_up(best, backlog)
                or self._alone_stale()
                or self._wait(backlog, may_quote, best)
            ):
                return 0
        return k

    def _alone_stale(self) -> bool:
        """Whether the target alone (one row, what every K is judged against) needs timing again. While
        the model drafts no step has one row, so its cost would stay what it was when drafting began: on
        the weak demo pair a pre-step timing 45 % slow (14.5 ms a row, the target ran at 10) kept a
        0.6-acceptance draft drafting for two replies at 0.92x, where one timed row stops it. A one-row
        step every ``retime_alone`` steps costs a drafting reply under 1 %; without any step's own
        timing (only the one taken before the first step), it comes after ``explore_every`` steps."""
        if not self.retime_alone:
            return False
        live = self._verify.get(1)
        if not live:
            return self._observed >= self.explore_every
        return self._observed - live[-1][0] >= self.retime_alone

    def _wait(self, backlog: int, may_quote: bool, k: int, count: bool = True) -> bool:
        """Whether a long catch-up (a new reply's prompt) waits a step because the reply may quote its
        context, and lookup then write it for free: over the reply's first ``wait_steps`` steps, and
        within ``wait_steps`` of a lookup match of two or more tokens. The waiting of a reply is
        bounded: the steps waited lose at most 1 / ``wait_catch_up`` of what the catch-up costs
        (against drafting ``k``), so a reply that never quotes loses that share of a catch-up at worst
        (``count``: a True answer is counted as a step waited; False only asks). On the real pair's
        edit prompt the draft read the 400-token prompt (1.1 s, a third of the reply's decoding) and
        then drafted 6 of 160 tokens, lookup the rest; a step without the model loses 0.03 s there.
        A step of the target alone loses one token's difference; a lookup step taken while the model
        waits loses what its copy is predicted to fall short of the model (``_lookup_plan``), nothing
        where it outruns it: counted as a whole step each, an edit reply's fifteen short copies used
        up the budget and the model read the prompt at its 16th step (1.2 s, then 2 of its tokens)."""
        if not may_quote:
            return False
        alone, drafting = self.rate(0), self.rate(k)
        if not alone or not drafting or drafting <= alone:
            return False
        step_lost = 1.0 / alone - 1.0 / drafting
        wait = self.catch_up_seconds(backlog) > self.wait_catch_up * (self._waited_s + step_lost)
        if wait and count:
            self._waited_s += step_lost
        return wait

    def _worth_catching_up(self, k: int, backlog: int) -> bool:
        """Whether drafting ``k`` saves, over the next ``horizon_tokens`` tokens, more than the draft's
        catch-up on ``backlog`` sat-out tokens costs first (a new reply's prompt, a long lookup stretch)."""
        if backlog <= 0:
            return True
        alone, drafting = self.rate(0), self.rate(k)
        if not alone or not drafting or drafting <= alone:
            return False
        return self.catch_up_seconds(backlog) <= self.horizon_tokens * (1.0 / alone - 1.0 / drafting)

    def _probe(self, backlog: int) -> int:
        """Not drafting: one draft when the probe is due (then wait twice as long), else none.

        A probe makes the draft catch up on every token since it last ran. Where even acceptance 1
        could not beat the target alone (the costs alone rule drafting out), only a change of costs
        could, so the probe times one draft token instead (``remeasure_draft``) and never drafts.
        Otherwise a probe waits while the draft's catch-up would cost more than ``probe_budget`` of
        this reply's steps since the model last drafted: "never slower" is a promise per reply, and a
        new reply's prompt alone can cost a tenth of a short reply on a CPU.
        """
        if self._probe_gap == 0:  # just stopped drafting
            self._probe_gap = max(1, self.explore_every)
            self._next_probe = self._steps + self._probe_gap * (self.hopeless_factor if self.hopeless() else 1)
            return 0
        if self._steps < self._next_probe:
            return 0
        if self.hopeless():
            self.remeasure_draft = True
            self._next_probe = self._steps + self.max_probe_gap * self.hopeless_factor
            return 0
        steps = self._steps - max(self._model_step, self._reply_start)  # this reply's steps without the model
        if self.catch_up_seconds(backlog) > self.probe_budget * steps * (self.step_seconds(0) or 0.0):
            return 0
        self._probe_gap = min(2 * self._probe_gap, self.max_probe_gap)
        self._next_probe = self._steps + self._probe_gap
        return 1

    def hopeless(self) -> bool:
        """Whether the measured costs rule drafting out even if every draft token were accepted."""
        alone = self.step_seconds(0)
        if alone is None or not self._draft:
            return False
        return all(
            (seconds := self.step_seconds(k)) is not None and (k + 1) / seconds < 1.0 / alone
            for k in range(max(1, self.k_min), self.k_max + 1)
        )

    def observe(
        self,
        drafted: int,
        accepted: int,
        examined: int,
        draft_s: float,
        verify_s: float,
        other_s: float,
        source: str = MODEL,
        catch_up_s: float = 0.0,
        backlog: int = 0,
    ) -> None:
        """Feed back what one step did and cost (``drafted`` = tokens actually proposed; ``catch_up_s`` =
        the one-off part of a model step's draft seconds, spent reading ``backlog`` tokens it sat out).
        What lookup would have copied is fed back separately, on every step (``observe_match``)."""
        looked_up = source == LOOKUP and drafted > 0
        if not looked_up:
            decay = self.alpha_decay if examined else self.idle_decay  # without drafts, what was learnt fades slowly
            self._accepted = self._accepted * decay + accepted
            self._examined = self._examined * decay + examined
        if drafted > 0 and not looked_up:
            self._draft.append(draft_s / drafted)
            self._dirty = True
            self._model_step = self._steps
            if backlog > 0 and catch_up_s > 0:
                self._catch_up.append(catch_up_s / backlog)
        rows = drafted + 1
        self._observed += 1
        self._verify.setdefault(rows, deque(maxlen=8)).append((self._observed, verify_s))
        self._other.append(other_s / rows)
        self._cache.clear()

    @property
    def mean_k(self) -> float:
        return sum(self.history) / len(self.history) if self.history else 0.0
