"""The one sink every checker reports into: a file's diagnostics, in the order they are found.

Each checker (patterns, conditions, replacements, examples, names) writes here and nowhere
else, so the order of a file's diagnostics is the order of the checks, and whether a rule came
out clean is one comparison of the error count before and after it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable, Optional

from fxrules.lang.ast import Span
from fxrules.lang.diagnostics import WARNING, Diagnostic


@dataclass(slots=True)
class Reporter:
    """Collects the diagnostics of one file. ``errors`` counts the errors among them."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    errors: int = 0

    def error(self, span: Span, code: str, message: str, notes: Iterable[str] = ()) -> None:
        self.diagnostics.append(Diagnostic.at(span, code, message, notes=notes))
        self.errors += 1

    def warning(self, span: Span, code: str, message: str, notes: Iterable[str] = ()) -> None:
        self.diagnostics.append(Diagnostic.at(span, code, message, notes=notes, severity=WARNING))


def closest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate most like ``word``, or None: one that differs only in case first (``GeLU`` is
    ``GELU``, not ``GLU``), else ``difflib``'s closest above its default cut-off."""
    candidates = list(candidates)
    folded = word.casefold()
    same = [c for c in candidates if c.casefold() == folded]
    if same:
        return same[0]
    close = difflib.get_close_matches(word, candidates, n=1)
    return close[0] if close else None


def did_you_mean(word: str, candidates: Iterable[str], sigil: str = "") -> list[str]:
    """``["did you mean `X`?"]`` for the closest candidate, or no note; ``sigil`` prefixes it (``$``)."""
    close = closest(word, candidates)
    return [f"did you mean `{sigil}{close}`?"] if close is not None else []
