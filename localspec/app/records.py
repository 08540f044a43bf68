"""Each verified row of a step, as the UI and the traces show it: built from the loop's step events.

A step's record per verified row holds the draft token and its fate, ``p``, ``q``, the acceptance
probability and the uniform that decided it, and with ``detail_top`` the top-N of ``p`` and ``q``
(shown at the mode's own temperature; greedy at T = 1). The loop yields each step with its evidence
(:class:`~localspec.core.events.StepEvidence`: the draft, the verdict and the target rows); the rows
are borrowed from the target, so :func:`with_position_records` builds the records while the loop
waits at that step, and the loop's own timings never include them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace

from localspec.core.events import Event, PositionRecord, StepEvent, TopEntry
from localspec.core.loop import SpeculativeDecoder
from localspec.core.sampling import SamplingParams, weights
from localspec.core.verify import finite
from localspec.core.weights import Weights


def with_position_records(events: Iterator[Event], decoder: SpeculativeDecoder, top: int) -> Iterator[Event]:
    """``decoder``'s events with each step's ``rows`` filled in (``top``: the top-N of p and q, 0 for none)."""
    for event in events:
        if isinstance(event, StepEvent) and event.evidence is not None:
            event.rows = position_records(event, decoder, top)
        yield event


def position_records(step: StepEvent, decoder: SpeculativeDecoder, top: int) -> list[PositionRecord]:
    """Evidence for every verified row of ``step`` (yielded by ``decoder`` and still holding its evidence)."""
    mode, draft, target_logits, verdict, history = (step.evidence.mode, step.evidence.draft,
                                                    step.evidence.target_logits, step.evidence.verdict,
                                                    step.evidence.history)  # fmt: skip
    records = []
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
            position=step.position + i,
            draft_token=draft.tokens[i] if is_draft_row else None,
            draft_text=_piece(decoder, draft.tokens[i]) if is_draft_row else None,
            p=finite(check.p) if check else None,
            q=finite(check.q) if check else None,
            accept_prob=finite(check.accept_prob) if check else None,
            uniform=check.uniform if check else None,
            outcome=outcome,
            target_token=(check.target_token if check and check.target_token is not None else None),
        )
        if outcome in ("rejected", "bonus"):
            record.target_token = verdict.token
        if top and outcome != "not-reached":
            if display is None:
                display = mode.params if not mode.params.greedy else _display_params(mode.params)
            row_history = mode.history(history, draft.tokens, i)
            p_row = (
                judged[i] if judged is not None else weights(target_logits[i], display, row_history, decoder.vocab_size)
            )
            record.top_p = _top(decoder, p_row, top)
            if is_draft_row:
                record.p = p_row.prob(draft.tokens[i]) if record.p is None else record.p
                q_row = draft.q_rows[i] if draft.q_rows is not None else None  # what the draft was drawn from
                raw = draft.logits[i] if draft.logits is not None else None
                if (judged is None or not isinstance(q_row, Weights)) and raw is not None:
                    q_row = weights(raw, display, row_history, decoder.vocab_size)
                if isinstance(q_row, Weights):
                    record.top_q = _top(decoder, q_row, top)
                    if record.q is None:
                        record.q = q_row.prob(draft.tokens[i])
                if record.accept_prob is None and record.p is not None and record.q:  # decided by bounds
                    record.accept_prob = min(1.0, record.p / record.q)
        records.append(record)
    return records


def _top(decoder: SpeculativeDecoder, row: Weights, n: int) -> list[TopEntry]:
    tokens, probs = row.top(n)
    return [TopEntry(int(t), _piece(decoder, int(t)), float(p)) for t, p in zip(tokens, probs)]


def _piece(decoder: SpeculativeDecoder, token: int) -> str:
    """A token's text: the target's vocabulary, or the draft model's for ids beyond it."""
    if token < decoder.target.vocab_size:
        vocab = decoder.vocab
    else:
        vocab = decoder.drafter.model if decoder.drafter else None
    if vocab is None:
        return f"<token {token}>"
    return vocab.token_bytes(token).decode("utf-8", errors="replace")


@functools.cache  # a new SamplingParams validates every field: a tenth of a millisecond a step
def _display_params(params: SamplingParams) -> SamplingParams:
    return replace(params, temperature=1.0)
