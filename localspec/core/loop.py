"""The speculative generation loop, independent of any inference library.

One step, in the spirit of gpt-fast's ``speculative_decode``:

1. the drafter proposes ``k`` tokens after the committed context;
2. the target scores ``[last committed, d_1 .. d_k]`` in one batch (``k + 1`` rows);
3. the mode's rule accepts ``n`` drafts and emits one more token;
4. the target cache is rolled back to the committed tokens (minus the last,
   which the next step evaluates); the draft catches up lazily next step.

The loop owns stop conditions (end-of-generation token, max tokens, stop
strings, full context, cancellation) and emits :mod:`localspec.core.events`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.core.adaptive import AdaptiveK, Learned, Plan
from localspec.core.calibrate import Costs, measure_costs, token_seconds
from localspec.core.drafters import LOOKUP, MODEL, Drafter, Match
from localspec.core.edits import Edit, ReplyEdits
from localspec.core.errors import ConfigError, PromptTooLongError
from localspec.core.events import (
    GenerationResult,
    GenerationStats,
    PositionRecord,
    StepEvent,
    TokenEvent,
    TokenStatus,
    TopEntry,
)
from localspec.core.model import LanguageModel, Vocabulary, common_prefix_length, sync_cache
from localspec.core.modes import Draft, Mode, make_mode
from localspec.core.sampling import SamplingParams, Weights, weights
from localspec.core.text import ReplyText
from localspec.core.verify import Verdict

MAX_DRAFT_TOKENS = 16
# A match this long is a quote, not a coincidence: on the real pair, matches of 16+ tokens were accepted
# 77-97 % of the time, shorter ones 5-45 % (adaptive.py). Without adaptive drafting, a drafter with both
# sources copies from the context at such a match and asks the model otherwise; and a token the target
# wrote in place of a quote's next token is an edit even where lookup did not draft it.
TRUSTED_MATCH = 16
# A renamed word (``_orders`` -> ``_records``) is learnt after a shorter agreement: an edit reply renames
# within its first few tokens (``def summarise_records``), and the text after a rename is read with it
# undone only once it is learnt. The next token confirms it or drops it (``settle_edit``).
RENAME_MATCH = 4


@dataclass
class GenerationOptions:
    """Per-request knobs that are not part of the sampling transform."""

    mode: str = "rejection"
    max_tokens: int = 256
    draft_tokens: int = 4
    seed: int = 0
    request_key: int = 0  # separates invariant-mode noise of different requests with one seed
    stop: Sequence[str] = ()
    detail_top: int = 0  # record the top-N of p and q of every verified row (UI, traces)
    adaptive: bool = False  # choose K per step (localspec.adaptive); draft_tokens is then the upper bound
    min_draft_tokens: int = 1  # lower bound of the adaptive K
    lookup: bool = False  # a drafter with a model also copies from the context (HybridDrafter) where that pays

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens = {self.max_tokens} is out of range; allowed: 1 or more")
        if not 0 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise ConfigError(
                f"draft_tokens (K) = {self.draft_tokens} is out of range; allowed: 0 to {MAX_DRAFT_TOKENS}"
            )
        if self.adaptive and not 0 <= self.min_draft_tokens <= self.draft_tokens:
            raise ConfigError(
                f"min_draft_tokens = {self.min_draft_tokens} is out of range; allowed: 0 to draft_tokens "
                f"({self.draft_tokens})"
            )
        if self.detail_top < 0:
            raise ConfigError(f"detail_top = {self.detail_top} is out of range; allowed: 0 or more")


@dataclass
class _Reply:
    """Per-token facts kept until the text layer releases the token."""

    statuses: list[TokenStatus] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Request:
    """One request in flight: its context, rule, drafter, counters and the limits that end it."""

    context: list[int]
    options: GenerationOptions
    mode: Mode
    drafter: Drafter | None
    stats: GenerationStats
    text: ReplyText
    controller: AdaptiveK | None
    n_ctx: int
    # what the target wrote instead of copied text: the reply's edits (a renamed identifier), which
    # lookup reads undone in the context and redoes in what it copies
    edits: ReplyEdits
    reply: _Reply = field(default_factory=_Reply)
    unconfirmed: Edit | None = None  # the edit learnt last step, until the text confirms it
    backlog: int = 0  # tokens the draft model sat out (beyond the usual two) when the step was planned
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

    def next_plan(self) -> tuple[Plan, Match | None]:
        """What the next step drafts: the chosen source and K, within the tokens left and both contexts'
        room; and what lookup found (its tokens are the proposal of a LOOKUP plan)."""
        if self.drafter is None:
            return Plan("", 0), None
        has_model = self.drafter.model is not None
        match = None
        if self.options.lookup or not has_model:
            match = self.drafter.lookup(self.context, self.edits)
        offered = (
            None if self.unconfirmed is not None else match
        )  # no bet on a match that runs through an unconfirmed edit
        if self.controller is not None:
            self.backlog = self.drafter.backlog(self.context) if has_model else 0
            plan = self.controller.choose(offered, model=has_model, backlog=self.backlog)
        elif offered is not None and (not has_model or offered.length >= TRUSTED_MATCH):
            plan = Plan(LOOKUP, self.options.draft_tokens)
        else:
            plan = Plan(MODEL if has_model else "", self.options.draft_tokens if has_model else 0)
        room = self.n_ctx - len(self.context)
        if plan.source == MODEL:  # the draft model's context must hold the drafts too
            room = min(room, self.drafter.model.context_size - len(self.context) + 1)
        remaining = self.options.max_tokens - self.stats.n_tokens
        return Plan(plan.source, max(0, min(plan.k, remaining - 1, room))), match

    def compare_with_match(self, match: Match, emitted: list[int], copied: bool) -> None:
        """What the target wrote (``emitted``) against what lookup offered, whatever drafted (``copied``:
        lookup did): acceptance evidence per match length for adaptive drafting, and an edit where the
        target replaced the next token of a quote or of a copied draft."""
        agreed = common_prefix_length(emitted, match.tokens)
        compared = min(agreed + 1, len(emitted), match.available)
        if self.unconfirmed is not None:  # this match ran through last step's edit: it only settles that edit
            grown = None if agreed else self.edits.grow(self.unconfirmed, emitted[0])
            if grown is not None:  # the new name goes on (`` running`` + ``_sum``): settled by the next token
                self.unconfirmed = grown
            else:
                self.settle_edit(confirmed=agreed > 0)
            return
        if self.controller is not None:
            self.controller.observe_match(match.length, agreed, compared)
        if agreed == compared:
            return
        quoted, replaced, written = match.length + agreed, match.tokens[agreed], emitted[agreed]
        if copied or quoted >= TRUSTED_MATCH or (quoted >= RENAME_MATCH and self.edits.renames(replaced, written)):
            self.unconfirmed = self.edits.learn(replaced, written)

    def settle_edit(self, confirmed: bool) -> None:
        """The step after an edit was learnt: a rename is followed by the source's next token (the text
        goes on as quoted), a paraphrase is not. Without this, a summary that left its quote would
        read each new word as an edit and bet a long draft on the next one, again and again."""
        if not confirmed:
            self.edits.drop(self.unconfirmed)
        self.unconfirmed = None


class SpeculativeDecoder:
    """Drives a target model and an optional drafter through the speculative loop."""

    def __init__(self, target: LanguageModel, vocab: Vocabulary, drafter: Drafter | None = None) -> None:
        self.target = target
        self.vocab = vocab
        self.drafter = drafter
        draft_vocab = drafter.model.vocab_size if drafter is not None and drafter.model is not None else 0
        self.vocab_size = max(target.vocab_size, draft_vocab)
        self.controller: AdaptiveK | None = None  # the adaptive-K controller of the latest request
        self._controllers: dict[tuple, AdaptiveK] = {}
        self.costs: Costs | None = None  # measured before the first adaptive step, for every controller
        self._learned: dict[tuple, Learned] = {}  # what an earlier process's controllers learnt (see resume)

    def _controller(self, options: GenerationOptions, params: SamplingParams) -> AdaptiveK:
        """The adaptive-K controller for these settings, kept across requests (chat turns) so a new
        reply starts from the acceptance and costs measured so far instead of from the prior."""
        key = (options.mode, params.temperature, options.min_draft_tokens, options.draft_tokens, options.lookup)
        controller = self._controllers.get(key)
        if controller is None:
            controller = self._controllers[key] = AdaptiveK(options.min_draft_tokens, options.draft_tokens)
            if key in self._learned:
                controller.resume(self._learned[key])
                return controller
            if self.costs is None:
                self.costs = measure_costs(self.target, self.drafter.model if self.drafter is not None else None)
            controller.seed(self.costs)
        return controller

    def learned(self) -> dict[tuple, Learned]:
        """What the adaptive controllers have learnt, by their settings, the latest request's last."""
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
        controller = self._controller(options, params) if drafter is not None and options.adaptive else None
        if controller is not None:
            controller.new_reply()
        self.controller = controller  # inspectable after a run (bench, tests)
        request = _Request(context, options, mode, drafter, stats, ReplyText(self.vocab.token_bytes, options.stop),
                           controller, n_ctx, ReplyEdits(self.vocab))  # fmt: skip
        stats.n_prompt_evaluated = sync_cache(self.target, context[:-1])
        if drafter is not None:
            drafter.prefill(context)
        stats.prefill_s = time.perf_counter() - request.started
        return request

    def _step(self, request: _Request) -> Iterator[TokenEvent | StepEvent]:
        """Draft, verify, emit: one step. Returns why the reply ended inside it (eos / stop_string), or None."""
        context, mode, drafter, stats = request.context, request.mode, request.drafter, request.stats
        plan, match = request.next_plan()
        k = plan.k
        step_start = time.perf_counter()
        if request.controller is not None and request.controller.remeasure_draft:
            request.controller.remeasured(token_seconds(request.draft_model))
        draft_t0, target_t0 = _decode_seconds(request.draft_model), self.target.decode_seconds
        # 1. k tokens copied by lookup, or proposed by the drafter (a token the target lacks ends the
        #    draft: it has p = 0)
        if plan.source == LOOKUP:
            draft = Draft(list(match.tokens[:k]), None, source=LOOKUP)
        else:
            draft = drafter.propose(context, k, mode) if k > 0 else Draft()
        draft = _up_to_first_unscorable(draft, self.target.vocab_size)
        draft_s = _decode_seconds(request.draft_model) - draft_t0
        # 2. the target scores [last committed, d_1 .. d_k] in one batch (rows borrowed: read within this step)
        scored = [t for t in draft.tokens if t < self.target.vocab_size]  # all, or all but a doomed last one
        target_logits = self.target.extend([context[-1], *scored], len(scored) + 1, borrow=True)
        # 3. the mode's rule accepts n drafts and picks one more token
        verdict = mode.verify(draft, target_logits, context)
        # 4. roll the target back to the committed tokens (the draft catches up next step)
        self.target.truncate(len(context) + verdict.n_accepted)
        verify_s = self.target.decode_seconds - target_t0
        emitted = draft.tokens[: verdict.n_accepted] + [verdict.token]
        if match is not None:
            request.compare_with_match(match, emitted, draft.source == LOOKUP)
        request.edits.wrote(emitted)
        position = len(context)
        rows = self._position_records(mode, draft, target_logits, context, verdict, request.options.detail_top)
        # 5. commit and release the emitted tokens, up to an end of generation or a stop string
        finished, n_added = None, 0
        statuses = _statuses(len(draft.tokens), verdict)
        for offset, token in enumerate(emitted):
            if self.vocab.is_end_of_generation(token):
                finished = "eos"
                break
            context.append(token)
            n_added += 1
            event = _token_event(
                request.reply, position + offset, request.step, token, statuses[offset], verdict, offset
            )
            request.reply.events.append(event)
            yield from _released(request.reply, request.text.push(token))
            if request.text.stopped:
                finished = "stop_string"
                break
        taken = n_added + (finished == "eos")  # the emitted tokens the reply took, an ending EOS included
        other_s = time.perf_counter() - step_start - draft_s - verify_s
        if request.controller is not None:  # the controller learns what drafting costs, one-off catch-ups apart
            catch_up_s = drafter.catch_up_s if draft.source == MODEL and draft.tokens else 0.0
            request.controller.observe(len(draft.tokens), verdict.n_accepted, len(verdict.checks), draft_s - catch_up_s,
                                       verify_s, other_s, plan.source, catch_up_s, request.backlog)  # fmt: skip
        step = StepEvent(
            step=request.step, position=position, k=k, drafted=list(draft.tokens), n_accepted=verdict.n_accepted,
            source=draft.source if draft.tokens else "",
            emitted=emitted, bonus=verdict.bonus and bool(draft.tokens), rows=rows,
            draft_s=draft_s, verify_s=verify_s, other_s=other_s, residual_mass=verdict.residual_mass,
            examined=len(verdict.checks), n_kept=min(verdict.n_accepted, taken), n_added=n_added,
        )  # fmt: skip
        stats.add_step(step)  # drafts accepted after the reply ended (past an EOS) were never used: not counted
        request.step += 1
        yield step
        return finished

    # ------------------------------------------------------------------
    def _position_records(
        self,
        mode: Mode,
        draft: Draft,
        target_logits: np.ndarray,
        context: Sequence[int],
        verdict: Verdict,
        top: int,
    ) -> list[PositionRecord]:
        """Evidence for every verified row; with ``top`` > 0 also the top-N of p and q."""
        records = []
        start = len(context)
        display = None
        judged = mode.judged_rows(target_logits) if not mode.params.greedy else None  # shown at the mode's own T
        for i in range(len(draft.tokens) + 1):
            check = verdict.checks[i] if i < len(verdict.checks) else None
            is_draft_row = i < len(draft.tokens)
            if check is not None:
                outcome = "accepted" if check.accepted else "rejected"
            elif is_draft_row:
                outcome = "not-reached"
            elif verdict.bonus:
                outcome = "bonus"
            else:
                outcome = "not-reached"
            record = PositionRecord(
                position=start + i,
                draft_token=draft.tokens[i] if is_draft_row else None,
                draft_text=self._piece(draft.tokens[i]) if is_draft_row else None,
                p=_finite(check.p) if check else None,
                q=_finite(check.q) if check else None,
                accept_prob=check.accept_prob if check else None,
                uniform=check.uniform if check else None,
                outcome=outcome,
                target_token=(check.target_token if check and check.target_token is not None else None),
            )
            if outcome in ("rejected", "bonus"):
                record.target_token = verdict.token
            if top and outcome != "not-reached":
                if display is None:
                    display = mode.params if not mode.params.greedy else _display_params(mode.params)
                history = mode.history(context, draft.tokens, i)
                p_row = (
                    judged[i] if judged is not None else weights(target_logits[i], display, history, self.vocab_size)
                )
                record.top_p = self._top(p_row, top)
                if is_draft_row:
                    record.p = p_row.prob(draft.tokens[i]) if record.p is None else record.p
                    q_row = draft.q_rows[i] if draft.q_rows is not None else None  # what the draft was drawn from
                    raw = draft.logits[i] if draft.logits is not None else None
                    if (judged is None or not isinstance(q_row, Weights)) and raw is not None:
                        q_row = weights(raw, display, history, self.vocab_size)
                    if isinstance(q_row, Weights):
                        record.top_q = self._top(q_row, top)
                        if record.q is None:
                            record.q = q_row.prob(draft.tokens[i])
            records.append(record)
        return records

    def _top(self, row: Weights, n: int) -> list[TopEntry]:
        tokens, probs = row.top(n)
        return [TopEntry(int(t), self._piece(int(t)), float(p)) for t, p in zip(tokens, probs)]

    def _piece(self, token: int) -> str:
        vocab = self.vocab if token < self.target.vocab_size else (self.drafter.model if self.drafter else None)
        if vocab is None:
            return f"<token {token}>"
        return vocab.token_bytes(token).decode("utf-8", errors="replace")


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


def _finite(x: float) -> float | None:
    return None if x != x else x  # NaN marks "not used by this rule"


def _display_params(params: SamplingParams) -> SamplingParams:
    from dataclasses import replace

    return replace(params, temperature=1.0)


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
    reply: _Reply, position: int, step: int, token: int, status: TokenStatus, verdict: Verdict, offset: int
) -> TokenEvent:
    """The event of one emitted token; text is filled in when the text layer releases it."""
    event = TokenEvent(index=-1, position=position, step=step, token_id=token, text="", status=status)
    if offset < len(verdict.checks):  # accepted draft token, or the correction of a rejected one
        check = verdict.checks[offset]
        event.p, event.q = _finite(check.p), _finite(check.q)
        event.accept_prob, event.uniform = check.accept_prob, check.uniform
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
