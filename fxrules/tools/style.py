"""Colour on terminals, the conventions people expect (https://no-color.org, FORCE_COLOR).

``NO_COLOR`` set to anything non-empty turns colour off; else ``FORCE_COLOR`` set to anything
non-empty other than ``0`` turns it on (CI logs that render ANSI); else colour is used when the
stream is a terminal and ``TERM`` is not ``dumb``. Only text output is coloured: json, github
and sarif never are.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TextIO

_CODES = {"error": "1;31", "warning": "1;33", "note": "1;36", "bold": "1", "caret": "1;32", "dim": "2"}
_HEADLINE = re.compile(r"^(?P<loc>.*?: )(?P<severity>error|warning)(?P<code>\[[^\]]*\]):")


def wants_colour(stream: TextIO) -> bool:
    """Whether to colour what is written to ``stream`` (see the module docstring)."""
    if os.environ.get("NO_COLOR"):
        return False
    force = os.environ.get("FORCE_COLOR")
    if force and force != "0":
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


@dataclass(frozen=True, slots=True)
class Style:
    """Paints text in a style (``error``, ``warning``, ``note``, ``bold``, ``caret``, ``dim``) or leaves
    it as it is. ``Style(False)`` is the plain style."""

    colour: bool

    @classmethod
    def for_stream(cls, stream: TextIO) -> "Style":
        return cls(wants_colour(stream))

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{_CODES[style]}m{text}\x1b[0m" if self.colour and text else text

    def diagnostic(self, rendered: str) -> str:
        """A rendered Diagnostic (headline, source line, carets, notes) with its parts coloured."""
        if not self.colour:
            return rendered
        lines = rendered.split("\n")
        found = _HEADLINE.match(lines[0])
        if found:
            severity = found["severity"]
            lines[0] = (self.paint(found["loc"], "bold") + self.paint(severity + found["code"], severity) + ":"
                        + self.paint(lines[0][found.end():], "bold"))
        for i, line in enumerate(lines[1:], 1):
            if line.startswith("note: "):
                lines[i] = self.paint("note", "note") + line[4:]
            elif line.strip() and set(line.strip()) == {"^"}:
                lines[i] = self.paint(line, "caret")
        return "\n".join(lines)
