"""Turning committed tokens into reply text, safely and with stop strings.

Two problems live here. A character may span tokens (byte-fallback tokens
carry single UTF-8 bytes), so text is decoded incrementally and a token whose
bytes do not yet complete a character contributes "" until one does (and
nothing, if the reply ends first). And a stop string may span tokens, so
tokens whose text could be the beginning of a stop string are held back until
it is clear either way; the reply never shows a stop string, not even for one
step.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class ReleasedToken:
    """A token whose text is final."""

    index: int  # index in the reply
    token_id: int
    text: str


class ReplyText:
    """Accumulates reply tokens; releases them once no stop string can involve them."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # all decoded text (released + pending)
        self._spans: list[tuple[int, int, int]] = []  # (token_id, start, end) of pending tokens
        self._n_released = 0
        self._released_upto = 0  # text offset released so far
        self.stopped = False

    @property
    def text(self) -> str:
        """The reply text released so far."""
        return self._text[: self._released_upto]

    def push(self, token_id: int) -> list[ReleasedToken]:
        """Add a token; return the tokens that became final (possibly none, possibly several)."""
        if self.stopped:
            return []
        start = len(self._text)
        self._text += self._decoder.decode(self._token_bytes(token_id))
        self._spans.append((token_id, start, len(self._text)))
        return self._release(final=False)

    def finish(self) -> list[ReleasedToken]:
        """The reply ended: release everything pending.

        A reply cut off mid-character (max tokens, Ctrl-C) ends with the lead
        bytes of a character whose remaining bytes were never generated. They
        are dropped rather than shown as U+FFFD: they are not a character the
        model wrote, only the start of one, and the text stays equal to the
        complete characters of the reply's bytes. The token ids keep them.
        """
        if self.stopped:
            return []
        self._decoder.reset()
        return self._release(final=True)

    def _release(self, final: bool) -> list[ReleasedToken]:
        # A stop string cannot begin inside released text: that text was only
        # released once no suffix of it could start one.
        boundary = len(self._text)
        for stop in self._stop:
            hit = self._text.find(stop, self._released_upto)
            if hit != -1 and hit < boundary:
                boundary = hit
                self.stopped = True
        if not self.stopped and not final:
            boundary = self._hold_back_from(boundary)
        out: list[ReleasedToken] = []
        while self._spans:
            token_id, start, end = self._spans[0]
            if self.stopped:
                if start >= boundary:
                    break  # wholly inside or after the stop string: dropped below
                end = min(end, boundary)
            elif end > boundary:
                break
            self._spans.pop(0)
            out.append(ReleasedToken(self._n_released, token_id, self._text[start:end]))
            self._n_released += 1
            self._released_upto = end
        if self.stopped:
            self._spans.clear()
            self._text = self._text[:boundary]
            self._released_upto = boundary
        return out

    def _hold_back_from(self, boundary: int) -> int:
        """Earliest offset whose suffix is a proper prefix of some stop string."""
        text = self._text
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:length]):
                    boundary = min(boundary, len(text) - length)
                    break
        return boundary
