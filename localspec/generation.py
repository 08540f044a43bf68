"""The speculative generation loop, independent of any inference library.

One step, in the spirit of gpt-fast's ``speculative_decode``:

1. the drafter proposes ``k`` tokens after the committed context;
2. the target scores ``[last committed, d_1 .. d_k]`` in one batch (``k + 1`` rows);
3. the mode's rule accepts ``n`` drafts and emits one more token;
4. the target cache is rolled back to the committed tokens (minus the last,
   which the next step evaluates); the draft catches up lazily next step.

The loop owns stop conditions (end-of-generation token, max tokens, stop
strings, full context, cancellation) and emits :mod:`localspec.events`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .adaptive import AdaptiveK
from .drafters import Drafter
from .errors import ConfigError, PromptTooLongError
from .events import (
    GenerationResult,
    GenerationStats,
    PositionRecord,
    StepEvent,
    TokenEvent,
    TokenStatus,
    TopEntry,
)
from .model import LanguageModel, Vocabulary, sync_cache
from .modes import Draft, Mode, make_mode
from .sampling import SamplingParams, probabilities
from .text import ReplyText
from .verify import Verdict

MAX_DRAFT_TOKENS = 16


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


class SpeculativeDecoder:
    """Drives a target model and an optional drafter through the speculative loop."""

    def __init__(self, target: LanguageModel, vocab: Vocabulary, drafter: Drafter | None = None) -> None:
        self.target = target
        self.vocab = vocab
        self.drafter = drafter
        draft_vocab = getattr(getattr(drafter, "model", None), "vocab_size", 0)
        self.vocab_size = max(target.vocab_size, draft_vocab)
        self.controller: AdaptiveK | None = None  # the adaptive-K controller of the latest request
        self._controllers: dict[tuple, AdaptiveK] = {}

    def _controller(self, options: GenerationOptions, params: SamplingParams) -> AdaptiveK:
        """The adaptive-K controller for these settings, kept across requests (chat turns) so a new
        reply starts from the acceptance and costs measured so far instead of from the prior."""
        key = (options.mode, params.temperature, options.min_draft_tokens, options.draft_tokens)
        controller = self._controllers.get(key)
        if controller is None:
            controller = self._controllers[key] = AdaptiveK(options.min_draft_tokens, options.draft_tokens)
        return controller

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
        """Yield a :class:`StepEvent` per step, a :class:`TokenEvent` per released token, then the result."""
        context = list(prompt)
        n_ctx = self.target.context_size
        if not context:
            raise ConfigError("the prompt is empty; give at least one token (or enable the chat template)")
        if len(context) >= n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(context)} tokens but the context holds {n_ctx}; "
                "shorten it or raise model.n_ctx"
            )
        drafter = None if options.mode == "target-only" else self.drafter
        mode = make_mode(options.mode, params, np.random.default_rng(options.seed), self.vocab_size,
                         options.seed, options.request_key)  # fmt: skip
        draft_model = getattr(drafter, "model", None)
        draft_ctx = draft_model.context_size if draft_model is not None else n_ctx + 1
        stats = GenerationStats(
            mode=mode.name if drafter is not None else "target-only",
            drafter=drafter.name if drafter is not None else "none",
            seed=options.seed,
            k=options.draft_tokens if drafter is not None else 0,
            n_prompt=len(context),
        )
        reply = _Reply()
        text = ReplyText(self.vocab.token_bytes, options.stop)
        controller = self._controller(options, params) if drafter is not None and options.adaptive else None
        self.controller = controller  # inspectable after a run (bench, tests)

        started = time.perf_counter()
        stats.n_prompt_evaluated = sync_cache(self.target, context[:-1])
        if drafter is not None:
            drafter.prefill(context)
        stats.prefill_s = time.perf_counter() - started

        stop_reason = "max_tokens"
        step = 0
        while True:
            if cancel is not None and cancel.is_set():
                stop_reason = "cancelled"
                break
            remaining = options.max_tokens - stats.n_tokens
            room = n_ctx - len(context)
            if remaining <= 0:
                break
            if room < 0:
                stop_reason = "context_full"
                break
            wanted = controller.choose() if controller is not None else options.draft_tokens
            k = min(wanted, remaining - 1, room, draft_ctx - len(context) + 1) if drafter else 0

            step_start = time.perf_counter()
            draft_t0 = _decode_seconds(draft_model)
            target_t0 = self.target.decode_seconds
            draft = drafter.propose(context, k, mode) if drafter is not None and k > 0 else Draft()
            draft = _up_to_first_unscorable(draft, self.target.vocab_size)
            draft_s = _decode_seconds(draft_model) - draft_t0

            scored = [t for t in draft.tokens if t < self.target.vocab_size]  # all, or all but a doomed last one
            target_logits = self.target.extend([context[-1], *scored], len(scored) + 1)
            verdict = mode.verify(draft, target_logits, context)
            self.target.truncate(len(context) + verdict.n_accepted)
            verify_s = self.target.decode_seconds - target_t0

            emitted = draft.tokens[: verdict.n_accepted] + [verdict.token]
            position = len(context)
            rows = self._position_records(mode, draft, target_logits, context, verdict, options.detail_top)
            stats.steps += 1
            stats.drafted += len(draft.tokens)
            stats.examined += len(verdict.checks)

            statuses = _statuses(len(draft.tokens), verdict)
            finished = None
            taken = len(emitted)  # how many of the emitted tokens the reply took (an ending one included)
            for offset, token in enumerate(emitted):
                if self.vocab.is_end_of_generation(token):
                    finished, taken = "eos", offset + 1
                    break
                context.append(token)
                stats.n_tokens += 1
                event = _token_event(reply, position + offset, step, token, statuses[offset], verdict, offset)
                reply.events.append(event)
                yield from _released(reply, text.push(token))
                if text.stopped:
                    finished, taken = "stop_string", offset + 1
                    break
            # drafts the verifier accepted after the reply ended (past an EOS) were never used: not counted
            accepted = min(verdict.n_accepted, taken)
            stats.accepted += accepted
            _count_positions(stats, len(draft.tokens), accepted)
            other_s = time.perf_counter() - step_start - draft_s - verify_s
            stats.draft_s += draft_s
            stats.verify_s += verify_s
            stats.other_s += other_s
            if controller is not None:
                controller.observe(len(draft.tokens), verdict.n_accepted, len(verdict.checks), draft_s, verify_s, other_s)
            yield StepEvent(
                step=step, position=position, k=k, drafted=list(draft.tokens), n_accepted=verdict.n_accepted,
                emitted=emitted, bonus=verdict.bonus and bool(draft.tokens), rows=rows,
                draft_s=draft_s, verify_s=verify_s, other_s=other_s, residual_mass=verdict.residual_mass,
            )  # fmt: skip
            step += 1
            if finished:
                stop_reason = finished
                break

        yield from _released(reply, text.finish())
        stats.wall_s = time.perf_counter() - started
        yield GenerationResult(
            text=text.text,
            token_ids=list(reply.token_ids),
            statuses=list(reply.statuses),
            stop_reason=stop_reason,
            stats=stats,
        )

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
                p_row = probabilities(target_logits[i], display, history, self.vocab_size)
                record.top_p = self._top(p_row, top)
                if is_draft_row:
                    record.p = float(p_row[draft.tokens[i]]) if record.p is None else record.p
                    if draft.logits is not None:
                        q_row = probabilities(draft.logits[i], display, history, self.vocab_size)
                        record.top_q = self._top(q_row, top)
                        if record.q is None:
                            record.q = float(q_row[draft.tokens[i]])
            records.append(record)
        return records

    def _top(self, row: np.ndarray, n: int) -> list[TopEntry]:
        n = min(n, row.shape[0])
        idx = np.argpartition(row, row.shape[0] - n)[row.shape[0] - n :]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        return [TopEntry(int(t), self._piece(int(t)), float(row[t])) for t in idx]

    def _piece(self, token: int) -> str:
        vocab = self.vocab if token < self.target.vocab_size else getattr(self.drafter, "model", None)
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


def _count_positions(stats: GenerationStats, n_drafted: int, n_accepted: int) -> None:
    while len(stats.drafted_by_position) < n_drafted:
        stats.drafted_by_position.append(0)
        stats.accepted_by_position.append(0)
    for i in range(n_drafted):
        stats.drafted_by_position[i] += 1
        if i < n_accepted:
            stats.accepted_by_position[i] += 1


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
