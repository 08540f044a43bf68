"""What the loop asks of drafting, and what it tells it: the protocols between the exact core and the speed policy.

The loop drafts, verifies and commits; which source drafts a step, and how many tokens, is the
policy's (:mod:`localspec.drafting`). The output is exact whatever a policy decides, as long as each
decision depends on earlier steps only (docs/design.md, Verification rules). The protocols make
that so: the loop asks for a step's plan before it drafts, and tells the policy what the step did
only once it is verified and committed. A policy sees the context and the step events, never the
target's rows or the random draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from localspec.core.events import StepEvent
from localspec.core.model import LanguageModel
from localspec.core.modes import Draft, Mode
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams

MODEL = "model"  # a proposal sampled from the draft model (q rows: the q-rule)
LOOKUP = "lookup"  # a proposal copied from the context (deterministic: the one-hot rule)


@dataclass(frozen=True)
class Plan:
    """What the next step drafts: ``k`` tokens from ``source`` (MODEL, LOOKUP, or "" for none). A LOOKUP
    plan carries what lookup copies (``tokens``): the step drafts the first ``k`` of them."""

    source: str
    k: int
    tokens: tuple[int, ...] = ()


class Drafter(Protocol):
    """What the loop asks a drafter: to get ready for a reply, and to propose tokens."""

    name: str
    # The draft model whose decode time, vocabulary and context size the loop reads; None for a drafter that
    # evaluates nothing (prompt lookup): its proposals cost no model time and carry no q rows.
    model: LanguageModel | None

    def prefill(self, context: Sequence[int]) -> None:
        """Get ready for a request whose prompt is ``context`` (e.g. evaluate it)."""

    def propose(self, context: Sequence[int], k: int, mode: Mode) -> Draft:
        """Return at most ``k`` tokens (possibly none); a drafter with a model samples them from it."""


class ReplyPolicy(Protocol):
    """One reply's drafting policy: asked what each step drafts, told what each step did."""

    def plan(self, context: Sequence[int]) -> Plan:
        """What the step after ``context`` drafts (the loop bounds ``k`` by the tokens left and the room)."""

    def observe(self, step: StepEvent) -> None:
        """What the step drafted, accepted, emitted and cost; told before the next :meth:`plan`."""


class Policy(Protocol):
    """What the decoder asks before a reply that drafts: the reply's policy, for its settings."""

    def begin(self, options: GenerationOptions, params: SamplingParams) -> ReplyPolicy:
        """The policy of one reply with these settings."""
