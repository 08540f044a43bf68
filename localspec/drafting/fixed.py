"""Drafting without adaptive K (``--fixed-k``): the same K every step, from the settings alone."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.core.policy import LOOKUP, MODEL, Plan
from localspec.drafting.drafters import Match
from localspec.drafting.lookup import TRUSTED_MATCH


@dataclass
class FixedK:
    """``k`` tokens every step: lookup's copy at a quote (a match of ``TRUSTED_MATCH`` tokens or more) or
    where there is no draft model, else the model's. It measures nothing, so it learns nothing."""

    k: int
    remeasure_draft = False  # it never asks for the draft to be timed

    def take_rest(self) -> bool:
        """Never: every step drafts ``k``."""
        return False

    def choose(self, match: Match | None = None, model: bool = True, backlog: int = 0) -> Plan:
        if match is not None and (not model or match.length >= TRUSTED_MATCH):
            return Plan(LOOKUP, self.k)
        return Plan(MODEL, self.k) if model else Plan("", 0)

    def observe(self, *step) -> None:
        """What a step did and cost: nothing to learn."""

    def observe_match(self, length: int, agreed: int, compared: int) -> None:
        """What the target wrote after a lookup match: nothing to learn."""

    def remeasured(self, draft_token_s: float) -> None:
        """Never asked for (``remeasure_draft`` stays False)."""
