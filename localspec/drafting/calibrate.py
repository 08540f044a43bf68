"""What the models cost here, measured once before adaptive drafting's first step.

Adaptive drafting learns costs from the steps it runs, but a controller that
knows nothing has to guess: it used to start at the largest K, which on a CPU
where the draft costs half a target token makes the first reply pay for a
model draft that can never win, and makes the draft read the whole prompt
(seconds for a long one) to find that out. A few timed batches on the
target and one token on the draft answer the question before the first
step: whether the model can pay even at acceptance 1, and which
verification batch sizes are cheap (llama.cpp's CPU kernels change with the
number of rows: 16 rows can cost less than 12 or 15). The measurements are
starting points only; every step's own timings follow. What the timing costs
and what it changed: docs/performance.md, "A catch-up timed before the first step".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.core.model import LanguageModel

VERIFY_ROWS = (1, 2, 3, 4, 8, 16)  # batch sizes timed on the target
SWITCH_ROWS = 4  # the size timed twice in a row on the target, for the extra of a change of size
CATCH_UP_TOKENS = 32  # a catch-up timed on the draft: this many tokens beyond the usual two, one logits row


@dataclass(frozen=True)
class Costs:
    """Seconds per verification batch of ``rows`` rows after a batch of the same size, per drafted token,
    per token a draft reads that it sat out (a catch-up; both None: no draft model), outside the models
    per verified row (None: not measured; only steps measure it), and the extra seconds of a batch whose
    size differs from the one before (None: not measured)."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_token_s: float | None = None
    catch_up_token_s: float | None = None
    other_row_s: float | None = None
    switch_s: float | None = None


def measure_costs(target: LanguageModel, draft: LanguageModel | None = None, rows=VERIFY_ROWS) -> Costs:
    """Time one batch of each size on ``target``, and one token and one catch-up on ``draft``, leaving both
    caches as found. A model whose decode clock does not move (a toy) yields no costs: nothing to start
    from.

    The catch-up decides whether the model drafts at all in a reply whose prompt the draft has not read:
    it must pay for itself within a horizon of tokens. Without a timing the controller guessed half a
    drafted token per token read, and where a batch reads tokens far cheaper than that (the real pair)
    the guess could keep the model out of a whole session: a reply never drafted, so no catch-up was
    ever timed to correct it (docs/performance.md, "A catch-up timed before the first step").

    Each batch is timed after a one-row warm-up, so every size but one row pays a change of size
    (:mod:`localspec.drafting.costs`); one size timed again at once says what the change cost, and the
    others' costs are kept without it."""
    verify = {n: _batch_seconds(target, n) for n in rows if n + 2 <= target.context_size}
    verify = _retime_spikes(target, verify)
    switch_s = None
    if SWITCH_ROWS in verify:
        changed = _batch_seconds(target, SWITCH_ROWS)  # after its one-row warm-up
        switch_s = max(0.0, changed - _batch_seconds(target, SWITCH_ROWS, warm_up=False))
        verify = {n: max(s - switch_s, s / 2) if n > 1 else s for n, s in verify.items()}  # a spike halves none
    draft_s = catch_up_s = None
    if draft is not None:
        draft_s = _batch_seconds(draft, 1)
        if CATCH_UP_TOKENS + 4 <= draft.context_size:
            usual = _batch_seconds(draft, 2, logits=1)
            catch_up_s = (_batch_seconds(draft, 2 + CATCH_UP_TOKENS, logits=1) - usual) / CATCH_UP_TOKENS
    return Costs({n: s for n, s in verify.items() if s > 0}, draft_s or None,
                 catch_up_s if catch_up_s and catch_up_s > 0 else None, switch_s=switch_s)  # fmt: skip


def _retime_spikes(target: LanguageModel, verify: dict[int, float]) -> dict[int, float]:
    """Time again, once, each batch that cost more per row than a smaller one, or more in all than a
    larger one, and keep the faster time.

    Per row, a batch costs less or about the same the larger it is, and in all never less than a smaller
    one, so a batch that broke either rule was likely caught by another process (or by the process's own
    slow first decodes: docs/performance.md, "Adaptive K"). One that costs about the same is at worst
    timed twice. Adaptive drafting takes a size's samples at
    their word, and lookup uses 16 rows only if it believes them cheap: one spiked sample would keep
    it from them for the session.
    """
    retimed = dict(verify)
    for n in sorted(verify):
        dearer_per_row = any(verify[m] / m < verify[n] / n for m in verify if m < n)
        dearer_in_all = any(verify[m] < verify[n] for m in verify if m > n)
        if dearer_per_row or dearer_in_all:
            retimed[n] = min(verify[n], _batch_seconds(target, n))
    return retimed


def token_seconds(model: LanguageModel) -> float:
    """Seconds for one token on a model already in use (no warm-up): how adaptive drafting re-times a
    draft it does not use, without making it read what it sat out."""
    return _batch_seconds(model, 1, warm_up=False)


def _batch_seconds(model: LanguageModel, rows: int, warm_up: bool = True, logits: int | None = None) -> float:
    """Seconds to evaluate ``rows`` tokens after the cache, with every row's logits as verification does
    (``logits``: only the last ones, as a draft's catch-up does).

    A one-row decode first warms caches and threads. The cache is rolled back afterwards; where it is
    too full to append to, its tail is dropped first (the next request re-evaluates it).
    """
    cached = list(model.cached_tokens)
    start = max(0, min(len(cached), model.context_size - rows - 2))
    if start < len(cached):
        model.truncate(start)
    token = cached[start - 1] if start else 0
    try:
        if warm_up:
            model.extend([token], 1)
            model.truncate(start)
        began = model.decode_seconds
        model.extend([token] * rows, rows if logits is None else logits)
        return model.decode_seconds - began
    finally:
        model.truncate(start)
