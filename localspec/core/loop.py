"""The speculative generation loop, independent of any inference library and of the speed policy.

One step, in the spirit of gpt-fast's ``speculative_decode``:

1. **draft** — the policy plans the step (source and ``k``, :mod:`localspec.core.policy`); the drafter
   proposes ``k`` tokens after the committed context, or lookup's copy is taken;
2. **verify** — the target scores ``[last committed, d_1 .. d_k]`` in one batch (``k + 1`` rows), the
   mode's rule accepts ``n`` drafts and emits one more token, and the target cache is rolled back to
   the committed tokens (minus the last, which the next step evaluates); the draft catches up lazily;
3. **commit** — the emitted tokens join the context and their text is released; the policy is told
   what the step did and cost.

The loop owns stop conditions (end-of-generation token, max tokens, stop strings, full context,
cancellation) and the timers, and emits :mod:`localspec.core.events`. Which source drafts and how
many tokens is the policy's (:mod:`localspec.drafting`), given to the decoder: the loop is exact
whatever it decides (docs/design.md, Verification rules).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from localspec.core.errors import ConfigError, PromptTooLongError
from localspec.core.events import GenerationResult, GenerationStats, StepEvent, StepEvidence, TokenEvent, TokenStatus
from localspec.core.model import LanguageModel, Vocabulary, sync_cache
from localspec.core.modes import Draft, Mode, make_mode
from localspec.core.options import GenerationOptions
from localspec.core.policy import LOOKUP, MODEL, Drafter, Plan, Policy, ReplyPolicy
from localspec.core.sampling import SamplingParams
from localspec.core.text import ReplyText
from localspec.core.verify import Verdict, finite


@dataclass
class _Reply:
    """Per-token facts kept until the text layer releases the token."""

    statuses: list[TokenStatus] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Request:
    """One request in flight: its context, rule, drafter and policy, counters and the limits that end it."""

    context: list[int]
    options: GenerationOptions
    mode: Mode
    drafter: Drafter | None
    policy: ReplyPolicy | None  # None exactly where there is no drafter
    stats: GenerationStats
    text: ReplyText
    n_ctx: int
    reply: _Reply = field(default_factory=_Reply)
    step: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def draft_model(self) -> LanguageModel | None:
        return self.drafter.model if self.drafter is not None else None

    def limit_reached(self, cancel: threading.Event | None) -> str | None:
        """Why the reply must end before another step (cancelled / max_tokens / context_full), or None."""
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if self.stats.n_tokens >= self.options.max_tokens:
            return "max_tokens"
        if len(self.context) > self.n_ctx:
            return "context_full"
        return None

    def plan(self) -> Plan:
        """The policy's plan for the next step, within the tokens left and both contexts' room."""
        if self.policy is None:
            return Plan("", 0)
        plan = self.policy.plan(self.context)
        room = self.n_ctx - len(self.context)
        if plan.source == MODEL:  # the draft model's context must hold the drafts too
            room = min(room, self.draft_model.context_size - len(self.context) + 1)
        remaining = self.options.max_tokens - self.stats.n_tokens
        return replace(plan, k=max(0, min(plan.k, remaining - 1, room)))


class SpeculativeDecoder:
    """Drives a target model and an optional drafter through the speculative loop.

    A drafter comes with the ``policy`` that plans its steps (``localspec.drafting.policy.speculative_decoder``
    gives it one); without a drafter every reply is the target's alone.
    """

    def __init__(
        self, target: LanguageModel, vocab: Vocabulary, drafter: Drafter | None = None, policy: Policy | None = None
    ) -> None:
        if drafter is not None and policy is None:
            raise TypeError("a drafter needs a policy that plans its steps (see localspec.drafting)")
        self.target = target
        self.vocab = vocab
        self.drafter = drafter
        self.policy = policy
        draft_vocab = drafter.model.vocab_size if drafter is not None and drafter.model is not None else 0
        self.vocab_size = max(target.vocab_size, draft_vocab)

    # ------------------------------------------------------------------
    def run(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> GenerationResult:
        """Generate to the end and return the result (events are discarded)."""
        result = None
        for event in self.stream(prompt, params, options, cancel):
            if isinstance(event, GenerationResult):
                result = event
        assert result is not None
        return result

    def stream(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> Iterator[TokenEvent | StepEvent | GenerationResult]:
        """Yield a :class:`TokenEvent` per released token, a :class:`StepEvent` per step, then the result."""
        request = self._begin(prompt, params, options)
        stop_reason = None
        while stop_reason is None:
            stop_reason = request.limit_reached(cancel)
            if stop_reason is None:
                stop_reason = yield from self._step(request)
        yield from _released(request.reply, request.text.finish())
        request.stats.wall_s = time.perf_counter() - request.started
        reply = request.reply
        yield GenerationResult(
            request.text.text, list(reply.token_ids), list(reply.statuses), stop_reason, request.stats
        )

    def _begin(self, prompt: Sequence[int], params: SamplingParams, options: GenerationOptions) -> _Request:
        """Check the prompt, set up the request, and bring both caches up to it (KV reuse across turns)."""
        context = list(prompt)
        n_ctx = self.target.context_size
        if not context:
            raise ConfigError("the prompt is empty; give at least one token (or enable the chat template)")
        if len(context) >= n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(context)} tokens but the context holds {n_ctx}; shorten it or raise model.n_ctx"
            )
        drafter = None if options.mode == "target-only" else self.drafter
        mode = make_mode(options.mode, params, np.random.default_rng(options.seed), self.vocab_size,
                         options.seed, options.request_key)  # fmt: skip
        stats = GenerationStats(
            mode=mode.name if drafter is not None else "target-only",
            drafter=_drafter_name(drafter, options),
            seed=options.seed,
            k=options.draft_tokens if drafter is not None else 0,
            n_prompt=len(context),
        )
        policy = self.policy.begin(options, params) if drafter is not None else None
        request = _Request(context, options, mode, drafter, policy, stats,
                           ReplyText(self.vocab.token_bytes, options.stop), n_ctx)  # fmt: skip
        stats.n_prompt_evaluated = sync_cache(self.target, context[:-1])
        if drafter is not None:
            drafter.prefill(context)
        stats.prefill_s = time.perf_counter() - request.started
        return request

    def _step(self, request: _Request) -> Iterator[TokenEvent | StepEvent]:
        """Draft, verify, commit: one step. Returns why the reply ended inside it (eos / stop_string), or None."""
        started = time.perf_counter()  # the plan is part of the step's cost: hybrid drafting's lookup and choice
        plan = request.plan()
        plan_s = time.perf_counter() - started
        # 1. draft: the plan's k tokens, copied by lookup or proposed by the drafter
        draft, draft_s = self._draft(request, plan)
        # 2. verify: the target's rows for them, the mode's verdict, and the target rolled back
        target_logits, verdict, verify_s = self._verify(request, draft)
        emitted = draft.tokens[: verdict.n_accepted] + [verdict.token]
        position, history = len(request.context), request.mode.history(request.context, (), 0)  # before the commit
        # 3. commit: the emitted tokens join the context, up to an end of generation or a stop string
        finished, n_added = yield from self._commit(request, emitted, verdict, len(draft.tokens))
        taken = n_added + (finished == "eos")  # the emitted tokens the reply took, an ending EOS included
        step = StepEvent(
            step=request.step, position=position, k=plan.k, drafted=list(draft.tokens), n_accepted=verdict.n_accepted,
            source=draft.source if draft.tokens else "",
            emitted=emitted, bonus=verdict.bonus and bool(draft.tokens), rows=[],
            draft_s=draft_s, verify_s=verify_s, other_s=time.perf_counter() - started - draft_s - verify_s,
            plan_s=plan_s, residual_mass=verdict.residual_mass,
            examined=len(verdict.checks), n_kept=min(verdict.n_accepted, taken), n_added=n_added,
        )  # fmt: skip
        if request.policy is not None:
            request.policy.observe(step)
        request.stats.add_step(step)  # drafts accepted after the reply ended (past an EOS) were never used: not counted
        request.step += 1
        step.evidence = StepEvidence(request.mode, draft, target_logits, verdict, history)
        try:
            yield step
        finally:
            step.evidence = None  # the target rows it holds are borrowed: valid only until the next step
        return finished

    def _draft(self, request: _Request, plan: Plan) -> tuple[Draft, float]:
        """The plan's tokens, cut after the first one the target lacks (it has p = 0), and the draft model's
        seconds for them."""
        started = _decode_seconds(request.draft_model)
        if plan.source == LOOKUP:
            draft = Draft(list(plan.tokens[: plan.k]), None, source=LOOKUP)
        else:
            draft = request.drafter.propose(request.context, plan.k, request.mode) if plan.k > 0 else Draft()
        draft = _up_to_first_unscorable(draft, self.target.vocab_size)
        return draft, _decode_seconds(request.draft_model) - started

    def _verify(self, request: _Request, draft: Draft) -> tuple[np.ndarray, Verdict, float]:
        """The target's rows for ``[last committed, d_1 .. d_k]`` in one batch (borrowed: read within this
        step), the mode's verdict on them, and the target's seconds; its cache is rolled back to the
        committed tokens (the draft catches up at its next proposal)."""
        context, started = request.context, self.target.decode_seconds
        scored = [t for t in draft.tokens if t < self.target.vocab_size]  # all, or all but a doomed last one
        target_logits = self.target.extend([context[-1], *scored], len(scored) + 1, borrow=True)
        verdict = request.mode.verify(draft, target_logits, context)
        self.target.truncate(len(context) + verdict.n_accepted)
        return target_logits, verdict, self.target.decode_seconds - started

    def _commit(self, request: _Request, emitted: list[int], verdict: Verdict, n_drafted: int) -> Iterator[TokenEvent]:
        """Append ``emitted`` to the context and release its text, up to an end of generation or a stop
        string. Returns why the reply ended here (eos / stop_string, or None) and the tokens appended."""
        position = len(request.context)
        statuses = _statuses(n_drafted, verdict)
        for offset, token in enumerate(emitted):
            if self.vocab.is_end_of_generation(token):
                return "eos", offset
            request.context.append(token)
            event = _token_event(position + offset, request.step, token, statuses[offset], verdict, offset)
            request.reply.events.append(event)
            yield from _released(request.reply, request.text.push(token))
            if request.text.stopped:
                return "stop_string", offset + 1
        return None, len(emitted)


# ----------------------------------------------------------------------
def _up_to_first_unscorable(draft: Draft, target_vocab: int) -> Draft:
    """The draft cut after its first token the target does not have (a draft vocabulary may be larger).

    Such a token has p = 0, so every rule rejects it for certain: rejection
    accepts with min(1, 0/q) = 0, greedy's argmax and the Gumbel pick never
    land on it, token-match's target sample never equals it. So it stays in
    the draft, with the q it was sampled from (the residual needs it), but
    the target never evaluates it — llama.cpp would refuse the id — and the
    drafts after it, which can never be reached, are dropped. Its verdict
    needs only the rows of the tokens before it.
    """
    for i, token in enumerate(draft.tokens):
        if token >= target_vocab:
            keep = i + 1
            return Draft(
                draft.tokens[:keep],
                draft.q_rows[:keep] if draft.q_rows is not None else None,
                draft.logits[:keep] if draft.logits is not None else None,
            )
    return draft


def _drafter_name(drafter: Drafter | None, options: GenerationOptions) -> str:
    if drafter is None:
        return "none"
    return drafter.name if options.lookup or drafter.model is None else drafter.model.name


def _decode_seconds(model: LanguageModel | None) -> float:
    return model.decode_seconds if model is not None else 0.0


def _statuses(n_drafted: int, verdict: Verdict) -> list[TokenStatus]:
    out = [TokenStatus.ACCEPTED] * verdict.n_accepted
    if n_drafted == 0:
        out.append(TokenStatus.TARGET)
    elif verdict.bonus:
        out.append(TokenStatus.BONUS)
    else:
        out.append(TokenStatus.CORRECTED)
    return out


def _token_event(
    position: int, step: int, token: int, status: TokenStatus, verdict: Verdict, offset: int
) -> TokenEvent:
    """The event of one emitted token; text is filled in when the text layer releases it."""
    event = TokenEvent(index=-1, position=position, step=step, token_id=token, text="", status=status)
    if offset < len(verdict.checks):  # accepted draft token, or the correction of a rejected one
        check = verdict.checks[offset]
        event.p, event.q = finite(check.p), finite(check.q)
        event.accept_prob, event.uniform = finite(check.accept_prob), check.uniform
        if status is TokenStatus.CORRECTED:
            event.rejected_token = check.token
    return event


def _released(reply: _Reply, released) -> Iterator[TokenEvent]:
    for item in released:
        event = reply.events[item.index]
        event.index = item.index
        event.text = item.text
        reply.token_ids.append(event.token_id)
        reply.statuses.append(event.status)
        yield event
