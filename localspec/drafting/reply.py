"""One reply's drafting policy: each step's plan from lookup and the controller, and what each step teaches them.

It is what the loop asks before a step and tells after it (:class:`localspec.core.policy.ReplyPolicy`):
before, what lookup offers after the context, and which source and K the controller chooses
(:class:`~localspec.drafting.adaptive.AdaptiveK`, or :class:`~localspec.drafting.fixed.FixedK`);
after, what the target wrote against what lookup offered (acceptance per match length, and the
reply's edits), and what the step drafted and cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from localspec.core.events import StepEvent
from localspec.core.policy import LOOKUP, MODEL, Plan
from localspec.drafting.calibrate import token_seconds
from localspec.drafting.drafters import Match, PolicyDrafter
from localspec.drafting.lookup import ReplyLookup


class Controller(Protocol):
    """What chooses each step's source and K, and learns from the steps (adaptive or fixed)."""

    remeasure_draft: bool  # asks for one draft token to be timed before the step

    def take_rest(self) -> bool: ...

    def choose(self, match: Match | None = None, model: bool = True, backlog: int = 0) -> Plan: ...

    def observe(
        self,
        drafted: int,
        accepted: int,
        examined: int,
        draft_s: float,
        verify_s: float,
        other_s: float,
        source: str,
        catch_up_s: float,
        backlog: int,
        plan_s: float,
    ) -> None: ...

    def observe_match(self, length: int, agreed: int, compared: int) -> None: ...

    def remeasured(self, draft_token_s: float) -> None: ...


class ReplyDrafting:
    """Plans the steps of one reply and learns from them."""

    def __init__(self, drafter: PolicyDrafter, controller: Controller, lookup: ReplyLookup, looks_up: bool) -> None:
        self.drafter = drafter
        self.controller = controller
        self.lookup = lookup
        self.looks_up = looks_up or drafter.model is None  # whether lookup is asked each step
        self._plan = Plan("", 0)  # the plan of the step under way ...
        self._match: Match | None = None  # ... what lookup offered for it ...
        self._backlog = 0  # ... and what the draft model had to read first (beyond the usual two tokens)

    def plan(self, context: Sequence[int]) -> Plan:
        """The controller's choice for the step after ``context``; a LOOKUP plan carries lookup's copy. A
        step the controller rests (:meth:`AdaptiveK.take_rest`) drafts nothing and looks nothing up."""
        if self.controller.take_rest():
            self._match, self._backlog, self._plan = None, 0, Plan("", 0)
            return self._plan
        has_model = self.drafter.model is not None
        self._match = self.drafter.lookup(context, self.lookup.edits) if self.looks_up else None
        self._backlog = self.drafter.backlog(context) if has_model else 0
        self._plan = self.controller.choose(self.lookup.offered(self._match), model=has_model, backlog=self._backlog)
        if self.controller.remeasure_draft:
            self.controller.remeasured(token_seconds(self.drafter.model))
        return replace(self._plan, tokens=self._match.tokens) if self._plan.source == LOOKUP else self._plan

    def observe(self, step: StepEvent) -> None:
        """What the step wrote against lookup's offer, and what it drafted and cost (one-off catch-ups apart)."""
        if self._match is not None:
            evidence = self.lookup.compare_with_match(self._match, step.emitted, copied=self._plan.source == LOOKUP)
            if evidence is not None:
                self.controller.observe_match(self._match.length, *evidence)
        self.lookup.edits.wrote(step.emitted)
        drafted = len(step.drafted)
        catch_up_s = self.drafter.catch_up_s if step.source == MODEL and drafted else 0.0
        self.controller.observe(drafted, step.n_accepted, step.examined, step.draft_s - catch_up_s, step.verify_s,
                                step.other_s - step.plan_s, self._plan.source, catch_up_s, self._backlog,
                                step.plan_s)  # fmt: skip
