"""What the checkers of one rule share: the file's aliases at the rule, and what its pattern binds.

Both are frozen values: the file's driver takes a new :class:`Aliases` after ``use`` lines, and
the pattern checker hands its result to the condition and replacement checkers as
:class:`Bindings`, which they read and never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import fxrules.lang.ast as A
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.names import BUILTIN_ALIASES, expand


@dataclass(frozen=True, slots=True)
class Aliases:
    """A file's ``use`` aliases as a rule sees them (those above it), and which of them were reported.

    ``paths`` maps an alias to the full dotted path it stands for. ``reported`` holds the aliases
    whose ``use`` line got an error: names under them are not reported a second time.
    """

    paths: Mapping[str, str]
    reported: frozenset[str] = frozenset()

    def full_path(self, dotted: A.Dotted) -> str:
        """The dotted name with its alias (or built-in alias) expanded; as written when it has none."""
        return expand(dotted.parts, self.paths) or dotted.text

    def is_reported(self, dotted: A.Dotted) -> bool:
        """Whether the name starts with an alias whose ``use`` line was already reported."""
        return dotted.parts[0] in self.reported

    def is_module_head(self, name: str) -> bool:
        """Whether a name is an alias of this file or a built-in one (``torch``, ``F``, ...)."""
        return name in self.paths or name in BUILTIN_ALIASES


@dataclass(frozen=True, slots=True)
class Bindings:
    """What a rule's pattern binds, once the pattern is checked.

    ``captures``: each ``$name`` and where it is first bound. ``names``: each ``as`` name and the
    pattern expression it names. ``ellipses``: where the pattern's argument lists end in ``...``.
    """

    captures: Mapping[str, A.Span]
    names: Mapping[str, A.Expr]
    ellipses: tuple[A.Span, ...]
    variadics: frozenset[str] = frozenset()  # captures bound by `*$xs` (to a list): what `*$xs` may splice


def report_unbound_name(reporter: Reporter, name: str, span: A.Span, bindings: Bindings) -> None:
    """``unbound-name``: a bare name that no ``as`` of the pattern binds."""
    bound = sorted(bindings.names)
    notes = [f"the pattern names: {', '.join(bound)}" if bound else "the pattern names no node with `as`"]
    notes += did_you_mean(name, bound)
    reporter.error(span, "unbound-name", f"`{name}` is not a node the pattern names with `as`", notes=notes)


def report_unbound_capture(reporter: Reporter, name: str, span: A.Span, bindings: Bindings, where: str) -> None:
    """``unbound-capture``: ``$name`` used in ``where`` (the condition, the replacement...) but not bound."""
    bound = sorted(bindings.captures)
    notes = [f"the pattern binds: {', '.join('$' + c for c in bound)}" if bound else "the pattern binds no capture"]
    notes += did_you_mean(name, bound, sigil="$")
    reporter.error(span, "unbound-capture", f"{where} uses `${name}`, which the pattern does not bind", notes=notes)


def unwrap(expr: A.Expr) -> A.Expr:
    """The expression under any ``as`` names."""
    while isinstance(expr, A.Bind):
        expr = expr.expr
    return expr
