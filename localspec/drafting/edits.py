"""What a reply changed of the text it quotes, and its context spelt as the quoted text was.

An edit reply that renames ``orders`` to ``records`` writes ``_records``, `` records`` and
``(records`` where the prompt has ``_orders``, `` orders`` and ``(`` + ``orders``: the rename changes
the tokens, and at ``(records`` even how the text splits into tokens. So prompt lookup matches *text*:
it reads the context with every edit undone (:meth:`ReplyEdits.source_text`), so the text after a
renamed word still agrees with the prompt, and copies what followed with the edits redone, tokenized
afresh where that changes the tokens (:meth:`ReplyEdits.copy`).

Two kinds of edit, learnt from a token the target wrote in place of a copied one:

- a *rename*: the two token texts differ in a word of 3+ letters (``_orders`` -> ``_records``:
  ``order`` -> ``record``). It applies wherever the word appears, inside any token, so learning it
  once covers all its spellings (before, each spelling was learnt with a failed 10-15 token draft);
- a *replacement*: any other change (``0`` -> ``1``), of that token only (shorter words such as ``s``
  or ``id`` appear inside too many others to spread safely).

A rename the target declines somewhere (``order`` kept in a docstring's prose while the code says
``record``) is *contested*, not dropped: a copy stops before the word, so the target picks its spelling
as the step's bonus token, and the rename holds again once the target writes the new name
(:meth:`ReplyEdits.wrote`).

A new name may take several tokens (``total`` -> `` running`` + ``_sum``): a rename learnt from one
token grows while the target goes on writing the same identifier (:meth:`ReplyEdits.grow`), and is
undone in the context's text, across token boundaries.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from localspec.core.model import Vocabulary, common_prefix_length

MIN_WORD = 3  # a rename changes a word at least this long
MAX_NAME = 64  # the longest new name a rename grows to
IDENTIFIER = re.compile(rb"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Edit:
    """``before`` -> ``after``: a renamed word (``word``), or the texts of a replaced token and its replacement."""

    before: bytes
    after: bytes
    word: bool
    copied: int = -1  # a replacement's tokens (unused for a rename)
    written: int = -1
    contested: bool = False  # a rename the target also declined: the target picks at each occurrence


class ReplyEdits:
    """The edits a reply made so far, and its context read as the source spelt it (kept up to date
    incrementally: a step appends a few tokens to a context of hundreds)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.edits: list[Edit] = []
        self._tokens: list[int] = []  # the context read so far ...
        self._pieces: list[bytes] = []  # ... each token's text, replacements undone
        self._starts: list[int] = [0]  # where each piece starts in the joined text (and where it ends)
        self._source: tuple[bytes, list[int]] = (b"", [0])  # the joined text with renames undone too

    def __bool__(self) -> bool:
        return bool(self.edits)

    # ------------------------------------------------------------------
    def learn(self, copied: int, written: int) -> Edit | None:
        """The target wrote ``written`` where lookup offered ``copied``: the edit learnt, if any.

        The latest evidence wins: an edit reply keeps the prompt's wording up to the first renamed
        token and renames from there on. A wrong guess costs one draft: when the target replaces a
        token an edit made, that edit is dropped and nothing is learnt, unless the target wrote the
        source's own spelling of a renamed word: then the rename is *contested* (:meth:`wrote`).
        Nor is anything learnt where one text begins the other (``(`` against ``(records``): the
        text agrees, only its split into tokens differs.
        """
        old, new = self.vocab.token_bytes(copied), self.vocab.token_bytes(written)
        if old == new or old.startswith(new) or new.startswith(old):
            return None
        guessed = [e for e in self.edits if (e.after in old if e.word else e.written == copied)]
        for edit in guessed:
            undone = old.replace(edit.after, edit.before)
            if edit.word and (undone.startswith(new) or new.startswith(undone)):
                self._swap(edit, replace(edit, contested=True))
            else:
                self.drop(edit)
        if guessed:
            return None
        before, after = _changed_word(old, new)
        edit = Edit(before, after, True) if before is not None else Edit(old, new, False, copied, written)
        self.edits.append(edit)
        self._forget()
        return edit

    def grow(self, edit: Edit, written: int) -> Edit | None:
        """The step after ``edit`` was learnt, the target wrote ``written`` instead of the source's next
        token: if it goes on with the new name (`` running`` then ``_sum``), the rename's new name grows
        by it (None: it does not, or ``edit`` is no rename)."""
        text = self.vocab.token_bytes(written)
        if not edit.word or edit not in self.edits or not IDENTIFIER.fullmatch(text):
            return None
        if len(edit.after) + len(text) > MAX_NAME:
            return None
        grown = Edit(edit.before, edit.after + text, True)
        self._swap(edit, grown)
        self._forget()  # the new name is longer: the source text changes
        return grown

    def wrote(self, tokens: Sequence[int]) -> None:
        """The target wrote ``tokens``. A contested rename whose new name they contain holds again.

        An edit reply may rename ``order`` in the code and keep it in the docstring's prose. Dropping
        the rename there cost the next copied draft (the code's ``for record``) and a relearning step;
        instead a copy stops before each occurrence of a contested word (:meth:`copy`), so the target
        writes it as the step's bonus token at no cost, either way, and the text after it matches both.
        """
        contested = [e for e in self.edits if e.contested]
        if not contested:
            return
        text = b"".join(self.vocab.token_bytes(token) for token in tokens)
        for edit in contested:
            if edit.after in text:
                self._swap(edit, replace(edit, contested=False))

    def renames(self, copied: int, written: int) -> bool:
        """Whether writing ``written`` for ``copied`` renames a word (rather than replacing a token)."""
        return _changed_word(self.vocab.token_bytes(copied), self.vocab.token_bytes(written))[0] is not None

    def _swap(self, edit: Edit, changed: Edit) -> None:
        """``edit`` becomes ``changed`` in place (its position decides nothing, but keeps the order learnt)."""
        self.edits[self.edits.index(edit)] = changed

    def drop(self, edit: Edit) -> None:
        if edit in self.edits:
            self.edits.remove(edit)
            self._forget()

    # ------------------------------------------------------------------
    def source_text(self, context: Sequence[int]) -> tuple[bytes, list[int]]:
        """``context`` with every edit undone, as one text, and where each token starts in it (one more
        entry: the end). A token inside a renamed word spanning several tokens (``_sum`` of
        `` running_sum``) starts where the word's undone spelling ends: it has no text of its own."""
        keep = common_prefix_length(self._tokens, context)
        if keep == len(self._tokens) == len(context):
            return self._source
        del self._tokens[keep:], self._pieces[keep:], self._starts[keep + 1 :]
        for token in context[keep:]:
            piece = self._undo(token)
            self._tokens.append(token)
            self._pieces.append(piece)
            self._starts.append(self._starts[-1] + len(piece))
        self._source = self._undo_renames(b"".join(self._pieces), self._starts)
        return self._source

    def copy(self, context: Sequence[int], at: int, most: int) -> tuple[int, ...]:
        """Up to ``most`` tokens of what follows byte ``at`` of :meth:`source_text`, with the edits redone.

        Where nothing changes (no edit in the copied text, a copy starting at a token boundary) these
        are the context's own tokens. Otherwise the text is tokenized afresh, as the target would spell
        it, and its last token dropped unless the copy reaches the context's end (a cut text may end
        in the first part of a word). A copy ends with the first end-of-generation token: after a
        quote that ended a turn comes the chat template and the next turn (whose special tokens have
        no text), never what the target writes next. It also ends before the token holding a contested
        word: the target picks its spelling (:meth:`wrote`).
        """
        text, starts = self.source_text(context)
        first = self.token_at(at, len(context))
        stop = min(len(context), first + most)
        ending = next((i for i in range(first, stop) if self.vocab.is_end_of_generation(context[i])), None)
        whole = ending is not None or stop == len(context)  # the copied text is not cut inside a word
        if ending is not None:
            stop = ending
        contested = [found for e in self.edits if e.contested and (found := text.find(e.before, at, starts[stop])) >= 0]
        if contested:
            stop, whole, ending = max(first, self.token_at(min(contested), len(context))), False, None
        source = text[at : starts[stop]]
        redone = self._redo(source)
        if at == starts[first] and redone == source:
            tokens = list(context[first:stop])
        else:
            tokens = self.vocab.tokenize(redone, add_special=False, parse_special=False)
            if not whole:
                tokens = tokens[:-1]
        if ending is not None:
            tokens.append(context[ending])
        replaced = {e.copied: e.written for e in self.edits if not e.word}
        return tuple(replaced.get(token, token) for token in tokens[:most])

    def token_at(self, at: int, n: int) -> int:
        """The token of the context read last (``n`` tokens) that byte ``at`` of its text begins, or lies
        inside: where a copy from ``at`` starts (a token without text there, an end of turn, included)."""
        starts = self._source[1]
        first = bisect.bisect_left(starts, at, hi=n)
        return first if first < n and starts[first] == at else first - 1

    # ------------------------------------------------------------------
    def _undo(self, token: int) -> bytes:
        """A token's text with a replacement undone (renames are undone in the joined text)."""
        for edit in self.edits:
            if not edit.word and token == edit.written:
                return edit.before
        return self.vocab.token_bytes(token)

    def _undo_renames(self, text: bytes, starts: list[int]) -> tuple[bytes, list[int]]:
        """``text`` with each renamed word's new name written as the old one, and ``starts`` moved with it."""
        spans = []  # (start, end, old name) of every new name in the text, left to right, not overlapping
        for edit in self.edits:
            if edit.word:
                spans += [(m.start(), m.end(), edit.before) for m in re.finditer(re.escape(edit.after), text)]
        if not spans:
            return text, starts
        spans.sort()
        kept, end = [], 0
        for span in spans:
            if span[0] >= end:
                kept.append(span)
                end = span[1]
        pieces, cursor = [], 0
        for start, stop, old in kept:
            pieces += [text[cursor:start], old]
            cursor = stop
        pieces.append(text[cursor:])
        begin = np.array([k[0] for k in kept])
        finish = np.array([k[1] for k in kept])
        shift = np.concatenate([[0], np.cumsum([len(k[2]) - (k[1] - k[0]) for k in kept])])
        at = np.asarray(starts)
        moved = at + shift[np.searchsorted(finish, at, side="right")]
        inside = np.searchsorted(begin, at, side="right") - 1  # the last new name starting at or before
        within = (inside >= 0) & (at > begin[inside]) & (at < finish[inside])
        ends = begin + shift[:-1] + np.array([len(k[2]) for k in kept])  # where each old name ends
        moved[within] = ends[inside[within]]
        return b"".join(pieces), moved.tolist()

    def _redo(self, text: bytes) -> bytes:
        for edit in self.edits:
            if edit.word:
                text = text.replace(edit.before, edit.after)
        return text

    def _forget(self) -> None:
        """The edits changed: the context is read afresh."""
        self._tokens, self._pieces, self._starts = [], [], [0]
        self._source = (b"", [0])


def _changed_word(old: bytes, new: bytes) -> tuple[bytes | None, bytes]:
    """The part of ``old`` that ``new`` replaced (common prefix and suffix removed), if both are words."""
    start = common_prefix_length(old, new)
    end = min(common_prefix_length(old[::-1], new[::-1]), min(len(old), len(new)) - start)
    before, after = old[start : len(old) - end], new[start : len(new) - end]
    if not (_is_word(before) and _is_word(after)):
        return None, b""
    return before, after


def _is_word(text: bytes) -> bool:
    return len(text) >= MIN_WORD and text.isascii() and text.decode().isidentifier()
