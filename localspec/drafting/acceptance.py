"""How often drafts are accepted: the acceptance half of adaptive drafting, per drafter and match length.

The draft model's acceptance rate ``alpha`` (accepted / examined drafts) is a running estimate with a
prior, its counts decaying as the text moves on. Prompt lookup's is estimated per *match length*
(how many tokens before the end of the context agree with the occurrence copied from), starting from
priors measured per match length on the real pair (``LOOKUP_PRIOR``): a match of 16 tokens or more
is a quote, a shorter one mostly a coincidence. Lookup's estimates learn from every step, not only
from lookup's own drafts: whatever drafted, the tokens the target wrote are compared with what lookup
would have copied (:meth:`Acceptance.observe_match`), so a match length lookup is not trusted with
still gets measured, and a draft of ``k`` copied tokens is credited position by position (its
``i``-th token was examined at match length ``m + i``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MATCH_BUCKETS = (1, 2, 3, 4, 8, 16, 32)  # lookup acceptance is estimated per match length, in these bins
# Prior acceptance of a lookup draft per bin, measured on the real pair with lookup forced on every step
# (docs/performance.md, "Adaptive K"): free text repeats short phrases that do not continue as before, so
# short matches are seldom accepted, while quotes of 16 or more tokens mostly are. (The rule of
# succession's m / (m + 1) trusted the short ones, and every reply paid a few failed lookup drafts to
# unlearn it.)
LOOKUP_PRIOR = {1: 0.2, 2: 0.2, 3: 0.25, 4: 0.25, 8: 0.4, 16: 0.8, 32: 0.95}


def match_bucket(length: int) -> int:
    """The bin of a lookup match ``length`` tokens long (the largest bound not above it)."""
    return MATCH_BUCKETS[max(0, bisect.bisect_right(MATCH_BUCKETS, length) - 1)]


@dataclass
class Acceptance:
    """Running acceptance estimates: the draft model's, and lookup's per match length."""

    alpha_prior: float = 0.7  # prior acceptance rate of the model's drafts, worth ``prior_weight`` examined drafts
    prior_weight: float = 4.0
    alpha_decay: float = 0.98  # running counts forget slowly: acceptance drifts with the text
    idle_decay: float = 0.995  # per step the model did not draft (K = 0): its prior returns over ~200 steps
    reply_carry: float = 0.25  # the weight lookup's evidence keeps into a new reply (see new_reply)

    def __post_init__(self) -> None:
        self._accepted = 0.0
        self._examined = 0.0
        # match bin -> [agreed, compared]: how often the target wrote what lookup offered, decayed per comparison
        self._lookup: dict[int, list[float]] = {}

    def counts(self) -> tuple[float, float, dict[int, tuple[float, float]]]:
        """The model's ``accepted`` and ``examined`` counts and lookup's ``(agreed, compared)`` per bin."""
        lookup = {bin_: (agreed, compared) for bin_, (agreed, compared) in self._lookup.items()}
        return self._accepted, self._examined, lookup

    def resume(self, accepted: float, examined: float, lookup: dict[int, tuple[float, float]]) -> None:
        """Start from the counts of :meth:`counts`, as an earlier process left them."""
        self._accepted, self._examined = accepted, examined
        self._lookup = {bin_: [agreed, compared] for bin_, (agreed, compared) in lookup.items()}

    # --- the draft model ------------------------------------------------------
    @property
    def alpha(self) -> float:
        """Running estimate of the per-token acceptance probability of the model's drafts."""
        return (self._accepted + self.alpha_prior * self.prior_weight) / (self._examined + self.prior_weight)

    def observe(self, accepted: int, examined: int) -> None:
        """A step not drafted by lookup: ``accepted`` of the ``examined`` model drafts were accepted. Without
        drafts what was learnt fades slowly, so a draft that became useful is found again."""
        decay = self.alpha_decay if examined else self.idle_decay
        self._accepted = self._accepted * decay + accepted
        self._examined = self._examined * decay + examined

    # --- prompt lookup ----------------------------------------------------------
    def lookup_alpha(self, length: int) -> float:
        """Acceptance estimate of a copied token at match length ``length``: its bin's counts, with the
        bin's measured prior (``LOOKUP_PRIOR``) worth ``prior_weight`` comparisons. The counts carry over
        from reply to reply (a quarter of their weight, see :meth:`new_reply`): binned by match length,
        they describe how quotes and coincidences fare."""
        m = match_bucket(length)
        agreed, compared = self._lookup.get(m, (0.0, 0.0))
        return (agreed + LOOKUP_PRIOR[m] * self.prior_weight) / (compared + self.prior_weight)

    def lookup_expected(self, length: int, k: int) -> list[float]:
        """Expected tokens of a step copying 1..``k`` tokens of a match ``length`` tokens long (index
        ``n - 1`` for ``n`` copies): copied token ``i`` is reached only if the ones before it were
        accepted, and is judged at match length ``length + i``, so a quote's estimate rises as it goes."""
        expected, reach, out = 1.0, 1.0, []
        alphas = {m: self.lookup_alpha(m) for m in MATCH_BUCKETS}  # a quote weighs up to 32 copies a step
        for i in range(k):
            reach *= alphas[match_bucket(length + i)]
            expected += reach
            out.append(expected)
        return out

    def observe_match(self, length: int, agreed: int, compared: int) -> None:
        """What the target wrote after a lookup match ``length`` tokens long, whatever drafted: its first
        ``agreed`` tokens were the ones lookup offered, of ``compared`` compared (``compared > agreed``:
        the next one differed). Every token the target writes is distributed as the target's own, so
        comparing it with the copy measures a copied token's acceptance without drafting one. Each bin
        forgets at ``alpha_decay`` per comparison it receives: it keeps the last ~50, however old."""
        for i in range(compared):
            counts = self._lookup.setdefault(match_bucket(length + i), [0.0, 0.0])
            counts[0] = counts[0] * self.alpha_decay + (i < agreed)
            counts[1] = counts[1] * self.alpha_decay + 1.0

    def new_reply(self) -> None:
        """A reply begins: lookup's evidence shrinks to ``reply_carry`` of its weight. How often a match
        continues differs from reply to reply (a chat reply quotes nothing, a summary phrases, an edit a
        whole function): the new reply's own comparisons soon outweigh the last reply's, while a bin seen
        often keeps its direction."""
        for counts in self._lookup.values():
            counts[0] *= self.reply_carry
            counts[1] *= self.reply_carry
