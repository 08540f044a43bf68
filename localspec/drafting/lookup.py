"""One reply's prompt lookup: what it offers each step, and what the reply changed of the text it quotes.

Lookup reads the context with the reply's edits undone (:mod:`localspec.drafting.edits`), so the edits
are learnt from the steps: where the target wrote a token in place of the next one lookup offered,
whatever drafted. An edit is learnt for a step and then settled by the next token: a rename is
followed by the source's next token (the text goes on as quoted), a paraphrase is not.
"""

from __future__ import annotations

from localspec.core.model import common_prefix_length
from localspec.drafting.drafters import Match
from localspec.drafting.edits import Edit, ReplyEdits

# A match this long is a quote, not a coincidence: lookup's drafts at such matches are mostly accepted,
# at shorter ones seldom (acceptance.LOOKUP_PRIOR). Without adaptive drafting, a drafter with both sources
# copies from the context at such a match and asks the model otherwise (FixedK); and a token the target
# wrote in place of a quote's next token is an edit even where lookup did not draft it.
TRUSTED_MATCH = 16
# A renamed word (``_orders`` -> ``_records``) is learnt after a shorter agreement: an edit reply renames
# within its first few tokens (``def summarise_records``), and the text after a rename is read with it
# undone only once it is learnt. The next token confirms it or drops it (``settle_edit``).
RENAME_MATCH = 4


class ReplyLookup:
    """The reply's edits, and the edit learnt last step until the text confirms it."""

    def __init__(self, edits: ReplyEdits) -> None:
        # what the target wrote instead of copied text: the reply's edits (a renamed identifier), which
        # lookup reads undone in the context and redoes in what it copies
        self.edits = edits
        self.unconfirmed: Edit | None = None  # the edit learnt last step, until the text confirms it

    def offered(self, match: Match | None) -> Match | None:
        """The match a step may bet on: none that runs through an unconfirmed edit."""
        return None if self.unconfirmed is not None else match

    def compare_with_match(self, match: Match, emitted: list[int], copied: bool) -> tuple[int, int] | None:
        """What the target wrote (``emitted``) against what lookup offered, whatever drafted (``copied``:
        lookup did): an edit where the target replaced the next token of a quote or of a copied draft.
        Returns the evidence for lookup's acceptance per match length, ``(agreed, compared)`` tokens, or
        None where the match ran through last step's edit and only settles that edit."""
        agreed = common_prefix_length(emitted, match.tokens)
        compared = min(agreed + 1, len(emitted), match.available)
        if self.unconfirmed is not None:  # this match ran through last step's edit: it only settles that edit
            grown = None if agreed else self.edits.grow(self.unconfirmed, emitted[0])
            if grown is not None:  # the new name goes on (`` running`` + ``_sum``): settled by the next token
                self.unconfirmed = grown
            else:
                self.settle_edit(confirmed=agreed > 0)
            return None
        if agreed < compared:
            quoted, replaced, written = match.length + agreed, match.tokens[agreed], emitted[agreed]
            if copied or quoted >= TRUSTED_MATCH or (quoted >= RENAME_MATCH and self.edits.renames(replaced, written)):
                self.unconfirmed = self.edits.learn(replaced, written)
        return agreed, compared

    def settle_edit(self, confirmed: bool) -> None:
        """The step after an edit was learnt: a rename is followed by the source's next token (the text
        goes on as quoted), a paraphrase is not. Without this, a summary that left its quote would
        read each new word as an edit and bet a long draft on the next one, again and again."""
        if not confirmed:
            self.edits.drop(self.unconfirmed)
        self.unconfirmed = None
