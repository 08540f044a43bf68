"""How a token's fate looks in a terminal: ANSI colours, text markers, or nothing.

docs/design.md (Visual language) says colour is never the only cue. With colour on, accepted tokens
are green, corrected red, bonus blue and target-only tokens plain; with colour
off (``--no-color``, ``NO_COLOR``) the fate can still be shown with markers
(``[corrected]``, ``{bonus}``), and output that is not a terminal gets the bare
text so that a pipe receives exactly what the model wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from localspec.core.events import TokenStatus

RESET = "\x1b[0m"
DIM = "\x1b[2m"
BOLD = "\x1b[1m"
RED = "\x1b[31m"

# accepted green, corrected red, bonus blue, target plain (docs/design.md, Visual language)
COLOURS: dict[TokenStatus, str] = {
    TokenStatus.ACCEPTED: "\x1b[32m",
    TokenStatus.CORRECTED: "\x1b[31m",
    TokenStatus.BONUS: "\x1b[94m",
    TokenStatus.TARGET: "",
}

# plain-text markers: accepted and target tokens stay bare so that the text stays readable
MARKERS: dict[TokenStatus, tuple[str, str]] = {
    TokenStatus.ACCEPTED: ("", ""),
    TokenStatus.CORRECTED: ("[", "]"),
    TokenStatus.BONUS: ("{", "}"),
    TokenStatus.TARGET: ("", ""),
}


def colour_wanted(no_color_flag: bool, stream_is_tty: bool, environ: dict[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when the user said no (flag or the NO_COLOR convention)."""
    env = os.environ if environ is None else environ
    if no_color_flag or env.get("NO_COLOR", "") != "":
        return False
    if env.get("TERM", "") == "dumb":
        return False
    return stream_is_tty


@dataclass
class TokenStyle:
    """Rendering switches for one chat session (``markers`` can be toggled with /markers)."""

    colour: bool
    markers: bool

    @classmethod
    def choose(cls, no_color_flag: bool, show_status: bool | None, stdout_is_tty: bool) -> TokenStyle:
        """``show_status`` None = automatic: markers when a terminal gets no colour, none for pipes."""
        colour = colour_wanted(no_color_flag, stdout_is_tty)
        markers = (stdout_is_tty and not colour) if show_status is None else show_status
        return cls(colour, markers)

    def token(self, text: str, status: TokenStatus) -> str:
        """One token's text dressed for the terminal (the conversation keeps the bare text)."""
        if not text:
            return ""
        if self.markers:
            left, right = MARKERS[status]
            text = f"{left}{text}{right}"
        code = COLOURS[status] if self.colour else ""
        return f"{code}{text}{RESET}" if code else text

    def dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.colour else text

    def bold(self, text: str) -> str:
        return f"{BOLD}{text}{RESET}" if self.colour else text

    def error(self, text: str) -> str:
        return f"{RED}{text}{RESET}" if self.colour else text

    def legend(self) -> str:
        """The one-line key to what the statuses look like in the current style."""
        if not self.colour and not self.markers:
            return (
                "legend: token fates are not shown (plain text); use --show-status for [corrected] and {bonus} markers"
            )
        parts = []
        for status in (TokenStatus.ACCEPTED, TokenStatus.CORRECTED, TokenStatus.BONUS, TokenStatus.TARGET):
            sample = self.token(status.value, status)
            parts.append(sample)
        text = "legend: " + "  ".join(parts)
        if self.markers:
            text += "   ([x] corrected by the target, {x} free bonus token, bare = accepted draft or target)"
        return text
