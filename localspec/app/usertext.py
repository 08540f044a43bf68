"""Text a user typed or sent, made safe before any front end shows, stores or tokenizes it.

A Python string can hold code points UTF-8 cannot encode: lone surrogates,
from a JSON body's "\\ud800" or from input bytes that were not UTF-8 read with
``surrogateescape``. llama.cpp tokenizes UTF-8, Gradio sends UTF-8 JSON and a
trace is a UTF-8 file, so each such code point becomes U+FFFD, the
replacement character, as a UTF-8 decoder would make of a bad byte.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD; text that is valid Unicode comes back as it is."""
    return _SURROGATE.sub("\ufffd", text)
