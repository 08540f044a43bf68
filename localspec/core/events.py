"""What the generation loop tells the world: one event per step, one per token, one at the end.

The terminal, the Gradio UI, the JSON output of ``generate`` and the JSONL
traces all consume these same dataclasses, so a fate shown in one place is the
fate recorded everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from localspec.core.modes import Draft, Mode
from localspec.core.verify import Verdict


class TokenStatus(str, Enum):
    """The fate of an emitted token (docs/design.md, Visual language)."""

    ACCEPTED = "accepted"  # a draft token the target kept
    CORRECTED = "corrected"  # drawn by the target after rejecting a draft token
    BONUS = "bonus"  # the free target token after a fully accepted draft
    TARGET = "target"  # produced with no draft at all (target-only)


@dataclass
class TopEntry:
    """One line of a top-N table: token id, its text and probability."""

    token: int
    text: str
    prob: float


@dataclass
class PositionRecord:
    """One verified row of a step: the draft token (if any) and the evidence."""

    position: int  # absolute position in the token sequence
    draft_token: int | None  # None for the bonus row
    draft_text: str | None
    p: float | None
    q: float | None
    accept_prob: float | None
    uniform: float | None
    outcome: str  # accepted / rejected / bonus / not-reached
    target_token: int | None = None
    top_p: list[TopEntry] = field(default_factory=list)
    top_q: list[TopEntry] = field(default_factory=list)


@dataclass
class TokenEvent:
    """A token committed to the output."""

    kind = "token"
    index: int  # 0-based index in the reply
    position: int  # absolute position in the token sequence
    step: int
    token_id: int
    text: str  # text this token completes (may be "" inside a multi-byte character)
    status: TokenStatus
    # For an accepted token: its p, q and the decision. For a corrected token:
    # the same evidence about the draft token it replaced (``rejected_token``).
    p: float | None = None
    q: float | None = None
    accept_prob: float | None = None
    uniform: float | None = None
    rejected_token: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["kind"] = self.kind
        return out


@dataclass
class StepEvidence:
    """What a step's verification read: enough to show each verified row's ``p``, ``q`` and top-N.

    The target rows are borrowed from the model's output buffer (valid until its next decode), so the
    loop hands this out only while it yields the step (:attr:`StepEvent.evidence`).
    """

    mode: Mode
    draft: Draft
    target_logits: np.ndarray
    verdict: Verdict
    history: list[int]  # the context tokens before the step that the mode's penalties look at


@dataclass
class StepEvent:
    """One draft-and-verify step."""

    kind = "step"
    # The step's evidence (a StepEvidence), set only while the loop yields the step: what the per-row records
    # (``rows``) are built from outside the loop (localspec.app.records). Not part of the event's data.
    evidence = None
    step: int
    position: int  # absolute position of the first token this step emits
    k: int  # draft tokens requested this step
    drafted: list[int]
    source: str  # where the drafts came from: "model", "lookup", or "" (none this step)
    n_accepted: int
    emitted: list[int]
    bonus: bool
    rows: list[PositionRecord]  # filled in outside the loop, from ``evidence`` (empty until then)
    draft_s: float
    verify_s: float
    other_s: float
    residual_mass: float | None = None
    examined: int = 0  # draft tokens the rule looked at: the accepted ones plus the rejected one
    n_kept: int = 0  # accepted drafts the reply used (fewer than n_accepted when it ended inside them)
    n_added: int = 0  # tokens this step added to the reply (an ending EOS is not one)
    plan_s: float = 0.0  # the part of other_s spent choosing what to draft (a cost per step, not per row)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind
        return out


def step_field(step: StepEvent | dict[str, Any]) -> Callable[..., Any]:
    """``get(name, default)`` for a step as the loop made it or as a trace read it back (a dict)."""
    return step.get if isinstance(step, dict) else lambda name, default=None: getattr(step, name, default)


@dataclass
class GenerationStats:
    """Counters and timings of one reply."""

    mode: str = ""
    drafter: str = ""
    seed: int = 0
    k: int = 0  # draft tokens per step requested (the bound, when adaptive)
    n_prompt: int = 0
    n_prompt_evaluated: int = 0  # prompt tokens the target actually had to evaluate (KV reuse)
    n_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    examined: int = 0  # draft tokens the rule looked at (accepted + the one rejected per step)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    wall_s: float = 0.0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    # per draft source ("model", "lookup"): [steps, drafted, accepted] (a hybrid drafter uses both)
    by_source: dict[str, list[int]] = field(default_factory=dict)

    def add_step(self, step: StepEvent | dict[str, Any]) -> None:
        """Count one step. The loop counts with this as it goes, and :meth:`from_steps` with it from a
        trace, so a live reply, a saved one and a replayed one report the same numbers."""
        get = step_field(step)
        n_drafted, n_kept = len(get("drafted", [])), get("n_kept", 0)
        self.steps += 1
        self.n_tokens += get("n_added", 0)
        self.drafted += n_drafted
        self.accepted += n_kept
        self.examined += get("examined", 0)
        self.draft_s += get("draft_s", 0.0)
        self.verify_s += get("verify_s", 0.0)
        self.other_s += get("other_s", 0.0)
        while len(self.drafted_by_position) < n_drafted:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(n_drafted):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_kept
        if n_drafted:
            counts = self.by_source.setdefault(get("source", "") or "model", [0, 0, 0])
            counts[0] += 1
            counts[1] += n_drafted
            counts[2] += n_kept

    @classmethod
    def from_steps(cls, steps: Iterable[StepEvent | dict[str, Any]], **known: Any) -> GenerationStats:
        """The counters of a reply rebuilt from its steps (``known``: mode, drafter, seed, k, n_prompt…)."""
        stats = cls(**known)
        for step in steps:
            stats.add_step(step)
        return stats

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationStats:
        """Read back :meth:`to_dict` (derived numbers are recomputed, not read)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def steps_by_source(self) -> str:
        """Which drafter each step used, e.g. "lookup 37 · model 8 · none 15 steps" (hybrid drafting)."""
        parts = [f"{source} {counts[0]}" for source, counts in sorted(self.by_source.items(), key=lambda i: -i[1][0])]
        idle = self.steps - sum(counts[0] for counts in self.by_source.values())
        if idle:
            parts.append(f"none {idle}")
        return " · ".join(parts) + " steps" if parts else ""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability estimate (accepted / examined): the performance model's alpha."""
        return self.accepted / self.examined if self.examined else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.n_tokens / self.steps if self.steps else 0.0

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            acceptance_rate=self.acceptance_rate,
            alpha=self.alpha,
            tokens_per_step=self.tokens_per_step,
            tokens_per_second=self.tokens_per_second,
            decode_s=self.decode_s,
        )
        return out


@dataclass
class GenerationResult:
    """The whole reply, once it has stopped."""

    kind = "result"
    text: str
    token_ids: list[int]
    statuses: list[TokenStatus]
    stop_reason: str  # eos / max_tokens / stop_string / context_full / cancelled
    stats: GenerationStats

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "statuses": [s.value for s in self.statuses],
            "stop_reason": self.stop_reason,
            "stats": self.stats.to_dict(),
        }


Event = TokenEvent | StepEvent | GenerationResult
