"""Adaptive drafting: what each step drafts, chosen to maximise expected tokens per second.

docs/design.md (Performance model) gives the throughput of a step with ``k`` drafts::

    E[tokens](alpha, k) / (k * t_draft + t_verify(k + 1) + t_other(k))

:class:`AdaptiveK` reads the costs from a :class:`~localspec.drafting.costs.CostModel` and the
acceptance from an :class:`~localspec.drafting.acceptance.Acceptance`, and takes whichever of none,
the model's best K and lookup's best K promises the most tokens per second (lookup's drafts cost
nothing to make, only their verification rows). K is chosen before drafting, from earlier steps
only, so it cannot bias the output: exactness does not depend on K (docs/design.md, Verification
rules).

Every ``explore_every`` steps the policy tries a neighbour of its best K (and every fourth time the
far end of the range, where its predicted rate is at least ``far_floor`` of the best's), so the cost
line stays measured around the optimum and a stale or unlucky measurement fades out.

A verification of another size than the step before costs more than one of the same size (llama.cpp
builds its graph again; :mod:`localspec.drafting.costs` keeps that extra apart). On a GPU it is a good
part of a step, so the policy moves to a new best K only where the move pays for itself within
``horizon_tokens`` tokens, charges a lookup copy of a new size the change, and spaces explorations
and re-timings so that their changes take at most ``switch_budget`` of the time. A far end
predicted far worse is not tried: each try costs about what the prediction says, and where a verified
row is dear (a target over RPC) one such step cost more time than two tokens of the target alone.
While the model drafts, a one-row step now and then keeps the target alone timed: every K is judged
against it.

When drafting does not pay (best K = 0), the reply runs at the target's own speed; a one-draft probe
now and then finds out whether that is still so. Each probe that changes nothing doubles the gap to
the next (up to ``max_probe_gap`` steps), so a pair where drafting never pays loses almost nothing to
probing, while a reply that reaches text the draft predicts well is noticed within a bounded number
of steps.

The draft model reads what it sat out before it drafts (a new reply's prompt, a stretch of lookup or
K = 0 steps): seconds for a long prompt on a CPU. That catch-up is weighed: the model is switched to
only where it saves more over the next ``horizon_tokens`` tokens than the catch-up costs; a probe
waits while its catch-up would cost more than ``probe_budget`` of the reply's steps since the model
last drafted; and where the costs rule the model out even at acceptance 1, probes only time one draft
token (``remeasure_draft``). What each rule was measured to win: docs/performance.md, "Adaptive
drafting and lookup".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from localspec.core.errors import ConfigError
from localspec.core.perf import expected_tokens_per_step
from localspec.core.policy import LOOKUP, MODEL, Plan
from localspec.drafting.acceptance import Acceptance
from localspec.drafting.calibrate import Costs
from localspec.drafting.costs import CostModel
from localspec.drafting.drafters import Match


@dataclass(frozen=True)
class Learned:
    """What a controller has learnt, for a later process to start from: its costs (the medians of its
    recent samples) and its acceptance counts (``accepted`` / ``examined`` model drafts, and lookup's
    ``[agreed, compared]`` per match bin)."""

    costs: Costs
    accepted: float = 0.0
    examined: float = 0.0
    lookup: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass
class AdaptiveK:
    """Chooses what each step drafts (none, the model's K, or lookup's) from measured acceptance and costs."""

    k_min: int
    k_max: int
    lookup_max: int = 32  # most lookup drafts per step (they cost only their verification rows)
    explore_every: int = 8
    far_floor: float = 0.75  # the far end of the range is explored only where predicted at least this share of the best
    max_probe_gap: int = 64  # at K = 0: the longest wait between one-draft probes
    hopeless_factor: int = 4  # ... times this between re-timings where the costs alone rule drafting out
    retime_alone: int = 32  # while the model drafts: a one-row step when the last one is this many steps old
    horizon_tokens: int = 64  # the draft's catch-up must pay for itself within this many tokens
    wait_steps: int = 4  # a long catch-up waits over a reply's first steps, and this long after a lookup match, ...
    wait_catch_up: float = 4.0  # ... while it costs more than this many times what waiting lost (see _wait)
    probe_budget: float = 0.03  # a probe's catch-up may cost this share of the reply's steps without the model
    rest_after: int = 16  # after this many plans in a row drafted nothing, ...
    rest_steps: int = 4  # ... this many steps go without a plan, then one plans again (0: never rest)
    switch_budget: float = 0.005  # changes of batch size made to explore or re-time may cost this share of the time
    costs: CostModel = field(default_factory=CostModel)
    acceptance: Acceptance = field(default_factory=Acceptance)

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_max:
            raise ConfigError(
                f"adaptive draft range {self.k_min}..{self.k_max} is empty; "
                "set speculative.min_draft_tokens <= speculative.draft_tokens"
            )
        self.history: list[int] = []  # the K chosen at each step
        # set when the draft's cost per token should be timed again (a one-token decode, no catch-up): while
        # the costs rule drafting out, only a change of costs could bring it back, and that is all a probe
        # that drafted would find out, at the price of the draft reading everything it sat out
        self.remeasure_draft = False
        self._steps = 0
        self._best: int | None = None
        self._dirty = True  # a drafting step was observed since the best model K was last solved
        self._probe_gap = 0  # steps between probes while not drafting (doubles while probes say no)
        self._next_probe = 0
        self._model_step = 0  # the last step the model drafted
        self._reply_start = 0  # the step the current reply began at
        self._quoted_step = -1_000_000  # the last step lookup had a match of two or more tokens
        self._waited_s = 0.0  # seconds the current reply lost while a catch-up waited (see _wait)
        self._undrafted = 0  # plans in a row that drafted nothing (see take_rest)
        self._rest = 0  # steps left without a plan

    # --- what it starts from ------------------------------------------------------
    def seed(self, costs: Costs) -> None:
        """Start from costs measured before the first step (see :mod:`localspec.drafting.calibrate`)."""
        self.costs.seed(costs)
        self._dirty = True

    def learned(self) -> Learned:
        """Its costs and acceptance counts as they stand (see :meth:`resume`)."""
        return Learned(self.costs.learned(), *self.acceptance.counts())

    def resume(self, learned: Learned) -> None:
        """Start from what an earlier controller learnt: its costs count as one sample each (as
        :meth:`seed`'s do), its acceptance counts as they were, so the first reply of a new process drafts
        as the last reply of the old one ended instead of from the prior."""
        self.seed(learned.costs)
        self.acceptance.resume(learned.accepted, learned.examined, learned.lookup)

    def new_reply(self) -> None:
        """A reply begins: probing and waiting budgets are per reply (see ``_probe`` and ``_wait``), and
        lookup's evidence carries over only in part (:meth:`Acceptance.new_reply`)."""
        self._reply_start = self._steps
        self.costs.new_reply()
        self._waited_s = 0.0
        self._undrafted = self._rest = 0
        self.acceptance.new_reply()

    # --- what it tells the loop --------------------------------------------------
    def take_rest(self) -> bool:
        """Rest this step if a rest is due, and say whether it does. A resting step goes without a plan: the
        target writes alone, with no lookup search and no choice. After ``rest_after`` plans in a row drafted
        nothing, ``rest_steps`` steps rest, then one plans again. A plan costs the step the same whatever it
        chooses, and the target alone (target-only mode) pays none: where nothing pays, as with a draft nearly
        as dear as its target (a GPU's case), planning every step kept the default below the target alone
        (docs/performance.md, "Resting where nothing pays")."""
        if self._rest > 0:
            self._rest -= 1
            return True
        return False

    def rate(self, k: int) -> float | None:
        """Predicted tokens per second with ``k`` model drafts (None before any data)."""
        seconds = self.costs.step_seconds(k)
        if seconds is None or seconds <= 0:
            return None
        return expected_tokens_per_step(self.acceptance.alpha, k) / seconds

    def _rate_now(self, k: int) -> float:
        """Predicted tokens per second of this step with ``k`` model drafts (0: the target alone), charged a
        change of batch size where its size differs from the last step's, as a lookup copy is in
        :meth:`_lookup_plan`, so the comparison favours neither side."""
        seconds = self.costs.step_seconds(k)
        if not seconds:
            return 0.0
        return expected_tokens_per_step(self.acceptance.alpha, k) / (seconds + self.costs.change_seconds(k + 1))

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
        self._undrafted = self._undrafted + 1 if plan.k == 0 else 0
        if self._undrafted >= self.rest_after:
            self._rest = self.rest_steps
        self.history.append(plan.k)
        if len(self.history) > 4096:
            del self.history[:2048]  # a controller lives as long as its decoder
        return plan

    def _lookup_plan(self, match: Match, model: bool, backlog: int = 0, may_quote: bool = False) -> Plan | None:
        """The lookup K with the best predicted rate, if it beats drafting nothing and the model's best K
        as it stands this step (see :meth:`_model_rival`). A copy's size and the target alone's are
        charged a change of batch size where they differ from the last step's: a copy's length follows
        the text, so its size is this step's alone."""
        ks = range(1, min(self.lookup_max, match.available) + 1)
        if not ks:
            return None
        if self.costs.verify_seconds(1) is None:  # nothing measured yet: free drafts are worth a try
            return Plan(LOOKUP, ks[-1])
        expected = self.acceptance.lookup_expected(match.length, ks[-1])
        seconds = lambda n: self.costs.step_seconds(n, LOOKUP) + self.costs.change_seconds(n + 1)  # noqa: E731
        best, fewest = max((expected[n - 1] / seconds(n), -n) for n in ks)  # ties: fewer copies
        n = -fewest
        alone = self._rate_now(0) if not model or self.k_min == 0 else 0.0
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
        target wrote them alone. Also says whether the model waits this step, and its rate once
        caught up (what a lookup step taken while it waits is weighed against)."""
        k = max(range(max(1, self.k_min), self.k_max + 1), key=lambda n: (self.rate(n) or 0.0, -n), default=0)
        rate = self._rate_now(k) if k else 0.0
        if rate <= 0.0 or backlog <= 0 or self.k_min > 0:
            return rate, False, rate
        if self._wait(backlog, may_quote, k, count=False):
            return 0.0, True, rate
        if not self._worth_catching_up(k, backlog):
            return 0.0, False, rate
        return 1.0 / (1.0 / rate + self.costs.catch_up_seconds(backlog) / self.horizon_tokens), False, rate

    def _model_k(self, backlog: int = 0, may_quote: bool = False) -> int:
        """The model's K: the best predicted, a neighbour now and then, or a probe while it does not pay."""
        # the best K is solved again when a step brought news about drafting, and every few steps
        # otherwise (K = 0 steps only refine the one-row cost): solving it each step is a measurable cost
        fresh = self._dirty or self._steps % max(1, self.explore_every) == 0
        if self.costs.verify_timed and self.costs.draft_timed and fresh:
            self._best = self._kept(max(range(self.k_min, self.k_max + 1), key=lambda k: (self.rate(k) or 0.0, -k)))
            self._dirty = False
        best = self._best if self._best is not None else self.k_max
        k = best
        gap = self._spaced(self.explore_every, best) if self.explore_every else 0
        if best == 0 and self.k_max > 0:
            k = self._probe(backlog)
        elif gap and self._steps % gap == 0 and self.k_max > self.k_min:
            k = self._explored(best, (self._steps // gap) % 4)
        if best > 0:
            self._probe_gap = 0  # drafting pays: the next stop starts probing often again
            if self.k_min == 0 and (
                not self._worth_catching_up(best, backlog)
                or self._alone_stale()
                or self._wait(backlog, may_quote, best)
            ):
                return 0
        return k

    def _explored(self, best: int, turn: int) -> int:
        """The K an exploration tries on its ``turn`` (0-3): the neighbours of the best K in turn so both
        sides stay measured, and now and then the far end, so one unlucky old measurement cannot pin K
        down (where its predicted rate is at least ``far_floor`` of the best's)."""
        if turn == 3:
            far = self.k_max if best - self.k_min < self.k_max - best else self.k_min
            return far if (self.rate(far) or 0.0) >= self.far_floor * (self.rate(best) or 0.0) else best
        if (turn % 2 == 0 and best < self.k_max) or best == self.k_min:
            return best + 1
        return best - 1

    def _kept(self, best: int) -> int:
        """The K of the last step where moving to ``best`` would not pay for its change of batch size
        within ``horizon_tokens`` tokens (:meth:`CostModel.switch_seconds`), else ``best``. On a GPU a
        change of size costs a graph rebuild, a good part of a step, so Ks of nearly one rate must not
        take turns (docs/performance.md, "A change of batch size")."""
        rows = self.costs.last_rows
        switch = self.costs.switch_seconds()
        if rows is None or switch <= 0.0 or not self.k_min <= rows - 1 <= self.k_max or rows - 1 == best:
            return best
        now, then = self.rate(rows - 1), self.rate(best)
        if not now or not then or self.horizon_tokens * (1.0 / now - 1.0 / then) > switch:
            return best
        return rows - 1

    def _spaced(self, steps: int, k: int) -> int:
        """``steps``, or more where a step away from ``k`` and back (two changes of batch size) would cost
        more than ``switch_budget`` of the steps' time between two such steps."""
        seconds = self.costs.step_seconds(k)
        if not seconds:
            return steps
        return max(steps, math.ceil(2.0 * self.costs.switch_seconds() / (self.switch_budget * seconds)))

    def _alone_stale(self) -> bool:
        """Whether the target alone (one row, what every K is judged against) needs timing again. While
        the model drafts no step has one row, so its cost would stay what it was when drafting began:
        a pre-step timing in a slow stretch kept a weak draft drafting for whole replies at a loss,
        where one timed row stops it. A one-row step every ``retime_alone`` steps costs a drafting reply
        little (docs/performance.md, "Adaptive K"); without any step's own timing (only the one taken
        before the first step), it comes after ``explore_every`` steps."""
        if not self.retime_alone:
            return False
        since = self.costs.steps_since_one_row()
        if since is None:
            return self.costs.observed >= self.explore_every
        return since >= self._spaced(self.retime_alone, self._best or 0)

    def _wait(self, backlog: int, may_quote: bool, k: int, count: bool = True) -> bool:
        """Whether a long catch-up (a new reply's prompt) waits a step because the reply may quote its
        context, and lookup then write it for free: over the reply's first ``wait_steps`` steps, and
        within ``wait_steps`` of a lookup match of two or more tokens. The waiting of a reply is
        bounded: the steps waited lose at most 1 / ``wait_catch_up`` of what the catch-up costs
        (against drafting ``k``), so a reply that never quotes loses that share of a catch-up at worst
        (``count``: a True answer is counted as a step waited; False only asks). On an edit reply the
        draft read the whole prompt and then drafted a handful of tokens, lookup the rest. A step of
        the target alone loses one token's difference; a lookup step taken while the model waits
        loses what its copy is predicted to fall short of the model (``_lookup_plan``), nothing where
        it outruns it: counted as a whole step each, an edit reply's short copies used up the budget
        and the model read the prompt anyway."""
        if not may_quote:
            return False
        alone, drafting = self.rate(0), self.rate(k)
        if not alone or not drafting or drafting <= alone:
            return False
        step_lost = 1.0 / alone - 1.0 / drafting
        wait = self.costs.catch_up_seconds(backlog) > self.wait_catch_up * (self._waited_s + step_lost)
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
        return self.costs.catch_up_seconds(backlog) <= self.horizon_tokens * (1.0 / alone - 1.0 / drafting)

    def _probe(self, backlog: int) -> int:
        """Not drafting: one draft when the probe is due (then wait twice as long), else none.

        A probe makes the draft catch up on every token since it last ran. Where even acceptance 1
        could not beat the target alone (the costs alone rule drafting out), only a change of costs
        could, so the probe times one draft token instead (``remeasure_draft``) and never drafts.
        Otherwise a probe waits while the draft's catch-up would cost more than ``probe_budget`` of
        this reply's steps since the model last drafted: "never slower" is a promise per reply, and on a
        CPU a new reply's prompt alone can cost a good share of a short reply.
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
        if self.costs.catch_up_seconds(backlog) > self.probe_budget * steps * (self.costs.step_seconds(0) or 0.0):
            return 0
        self._probe_gap = min(2 * self._probe_gap, self.max_probe_gap)
        self._next_probe = self._steps + self._probe_gap
        return 1

    def hopeless(self) -> bool:
        """Whether the measured costs rule drafting out even if every draft token were accepted."""
        alone = self.costs.step_seconds(0)
        if alone is None or not self.costs.draft_timed:
            return False
        return all(
            (seconds := self.costs.step_seconds(k)) is not None and (k + 1) / seconds < 1.0 / alone
            for k in range(max(1, self.k_min), self.k_max + 1)
        )

    # --- what the loop tells it ----------------------------------------------------
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
        plan_s: float = 0.0,
    ) -> None:
        """Feed back what one step did and cost (``drafted`` = tokens actually proposed; ``catch_up_s`` =
        the one-off part of a model step's draft seconds, spent reading ``backlog`` tokens it sat out;
        ``plan_s``: choosing the step, apart from ``other_s``, as it costs per step, not per row).
        What lookup would have copied is fed back separately, on every step (``observe_match``)."""
        looked_up = source == LOOKUP and drafted > 0
        if not looked_up:
            self.acceptance.observe(accepted, examined)
        if drafted > 0 and not looked_up:
            self.costs.observe_draft(drafted, draft_s, catch_up_s, backlog)
            self._dirty = True
            self._model_step = self._steps
        self.costs.observe(drafted + 1, verify_s, other_s, plan_s)

    def observe_match(self, length: int, agreed: int, compared: int) -> None:
        """What the target wrote after a lookup match, whatever drafted (see :meth:`Acceptance.observe_match`)."""
        self.acceptance.observe_match(length, agreed, compared)

    def remeasured(self, draft_token_s: float) -> None:
        """The draft's cost per token, timed again on request (``remeasure_draft``)."""
        self.remeasure_draft = False
        if draft_token_s > 0:
            self.costs.observe_draft_token(draft_token_s)
            self._dirty = True
