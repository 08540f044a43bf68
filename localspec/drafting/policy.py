"""The speed policy a decoder runs: per reply, the controller for its settings, kept across replies.

:func:`speculative_decoder` gives core's loop this policy. The controllers live as long as the
decoder, one per setting that changes what they learn (mode, temperature, K range, lookup), so a new
reply (a chat turn) starts from the acceptance and costs measured so far instead of from the prior;
the models are timed once before the first adaptive step (:mod:`localspec.drafting.calibrate`), and
what the controllers learnt can be handed to a later process (:meth:`SpeedPolicy.learned`,
:mod:`localspec.app.learned`).
"""

from __future__ import annotations

from localspec.core.loop import SpeculativeDecoder
from localspec.core.model import LanguageModel, Vocabulary
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams
from localspec.drafting.adaptive import AdaptiveK, Learned
from localspec.drafting.calibrate import Costs, measure_costs
from localspec.drafting.drafters import PolicyDrafter
from localspec.drafting.edits import ReplyEdits
from localspec.drafting.fixed import FixedK
from localspec.drafting.lookup import ReplyLookup
from localspec.drafting.reply import ReplyDrafting


def speculative_decoder(
    target: LanguageModel, vocab: Vocabulary, drafter: PolicyDrafter | None = None
) -> SpeculativeDecoder:
    """Core's loop over ``target`` and ``drafter``, its steps planned by a :class:`SpeedPolicy`."""
    return SpeculativeDecoder(target, vocab, drafter, SpeedPolicy(target, vocab, drafter))


class SpeedPolicy:
    """What each reply of one decoder drafts (:class:`localspec.core.policy.Policy`)."""

    def __init__(self, target: LanguageModel, vocab: Vocabulary, drafter: PolicyDrafter | None) -> None:
        self.target = target
        self.vocab = vocab
        self.drafter = drafter
        self.controller: AdaptiveK | None = None  # the adaptive controller of the latest reply that drafted
        self._controllers: dict[tuple, AdaptiveK] = {}
        self.costs: Costs | None = None  # measured before the first adaptive step, for every controller
        self._learned: dict[tuple, Learned] = {}  # what an earlier process's controllers learnt (see resume)

    def begin(self, options: GenerationOptions, params: SamplingParams) -> ReplyDrafting:
        """The policy of a reply: adaptive drafting with the controller for its settings, or a fixed K."""
        controller = self._controller(options, params) if options.adaptive else None
        if controller is not None:
            controller.new_reply()
        self.controller = controller  # inspectable after a run (bench, tests)
        lookup = ReplyLookup(ReplyEdits(self.vocab))
        return ReplyDrafting(self.drafter, controller or FixedK(options.draft_tokens), lookup, options.lookup)

    def _controller(self, options: GenerationOptions, params: SamplingParams) -> AdaptiveK:
        """The adaptive controller for these settings, kept across replies: resumed from what an earlier
        process learnt, else started from the costs timed before the first adaptive step."""
        key = (options.mode, params.temperature, options.min_draft_tokens, options.draft_tokens, options.lookup)
        key += (options.max_rows,) if options.max_rows else ()  # keeps the keys of what earlier processes learnt
        controller = self._controllers.get(key)
        if controller is None:
            lookup_max = min(AdaptiveK.lookup_max, options.max_rows - 1) if options.max_rows else AdaptiveK.lookup_max
            controller = AdaptiveK(options.min_draft_tokens, options.draft_tokens, lookup_max=lookup_max)
            self._controllers[key] = controller
            if key in self._learned:
                controller.resume(self._learned[key])
                return controller
            if self.costs is None:
                self.costs = measure_costs(self.target, self.drafter.model if self.drafter is not None else None)
            controller.seed(self.costs)
        return controller

    def learned(self) -> dict[tuple, Learned]:
        """What the adaptive controllers have learnt, by their settings, the latest reply's last."""
        out = {key: learned for key, learned in self._learned.items() if key not in self._controllers}
        live = sorted(self._controllers.items(), key=lambda item: item[1] is self.controller)
        return out | {key: controller.learned() for key, controller in live}

    def resume(self, learned: dict[tuple, Learned]) -> None:
        """Start from what an earlier process learnt (:meth:`learned`): a controller for settings seen
        before resumes where it ended, one for new settings starts from the latest costs, so no reply
        pays for timing the models again."""
        self._learned = dict(learned)
        if learned:
            self.costs = list(learned.values())[-1].costs
