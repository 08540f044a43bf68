"""The per-request knobs of the loop that are not part of the sampling transform."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.core.errors import ConfigError

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
    detail_top: int = 0  # the top-N of p and q of every verified row in the step records (UI, traces)
    adaptive: bool = False  # choose K per step (localspec.drafting); draft_tokens is then the upper bound
    min_draft_tokens: int = 1  # lower bound of the adaptive K
    lookup: bool = False  # a drafter with a model also copies from the context (HybridDrafter) where that pays
    max_rows: int = 0  # most rows a verification may hold (0: no bound); set where invariance holds only so far

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
        if self.max_rows and self.draft_tokens >= self.max_rows:
            raise ConfigError(
                f"draft_tokens (K) = {self.draft_tokens} needs {self.draft_tokens + 1} rows a verification; "
                f"allowed: at most max_rows - 1 ({self.max_rows - 1})"
            )
        if self.detail_top < 0:
            raise ConfigError(f"detail_top = {self.detail_top} is out of range; allowed: 0 or more")
