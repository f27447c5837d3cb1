"""Diagnostics: located problems in rule files, with stable codes, and the errors that carry them.

Every problem in a rule file becomes a :class:`Diagnostic` (a stable code, a
message, a span, optional notes). The API raises :class:`RuleFileError` holding
all diagnostics of the input; the CLI prints them like a compiler does::

    rules/cleanup/dropout.fxr:3:32: error[unbound-capture]: the replacement uses `$y`, ...
        call_module Dropout($x) -> $y
                                   ^^
    note: the pattern binds: $x
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from fxrules.lang.ast import Span

ERROR = "error"
WARNING = "warning"

# Stable diagnostic codes, with what each means. Tests and the docs refer to these.
CODES: dict[str, str] = {
    # reading and syntax
    "io-error": "the file could not be read",
    "invalid-encoding": "the file is not valid UTF-8 text",
    "binary-input": "the file contains NUL bytes or other binary data",
    "invalid-character": "a character that cannot start any token",
    "unterminated-string": "a string literal that runs to the end of the line",
    "unexpected-token": "a token where the grammar expects something else",
    "unexpected-end": "the file ends in the middle of a rule",
    "too-deep": "nesting deeper than the parser's limit",
    "too-large": "a statement, or a file, with more tokens than the parser's limits (they bound memory while reading)",
    # names
    "unknown-alias": "a dotted name whose first part is neither an alias nor a known module",
    "duplicate-alias": "`use ... as NAME` redefines an alias in the same file",
    "unknown-target": "a call_function target or constant that does not resolve",
    "unknown-method": "a call_method name that torch.Tensor does not have",
    "unknown-module-type": "a call_module type that does not resolve to an nn.Module subclass",
    "unknown-builder": "a module builder that does not resolve to a callable",
    "unknown-attribute": "an attribute constraint the module type's constructor does not take",
    "unknown-name": "a condition refers to a name that is not bound or known",
    "unknown-predicate": "a condition calls a function that is neither a built-in predicate nor a dotted path",
    "import-not-allowed": "resolving the name would import a module outside the allow-list",
    "forbidden-target": "the target executes code or touches the system and is never allowed",
    "not-allowed": "the name is not on the allow-list for its position (fxrules.lang.allowlist, SECURITY.md)",
    # bindings and structure
    "unbound-capture": "the replacement or a condition uses a capture the pattern does not bind",
    "unbound-name": "the replacement uses a node name the pattern does not bind with `as`",
    "duplicate-binding": "two `as` clauses in one rule bind the same name",
    "duplicate-rule": "two rules in one rule set have the same name",
    "bad-contract": "a contract word other than exact, approx, changes",
    "ellipsis-misuse": "`...` not last, repeated, or forwarded without one in the pattern",
    "identity-rewrite": "the replacement is identical to the pattern, so the rule could only loop",
    "arity-mismatch": "pattern and replacement have different numbers of roots (outputs)",
    "bad-pattern": "a construct that cannot be matched (e.g. a builder in a pattern, a literal root)",
    "bad-replacement": "a construct that cannot be built (e.g. `_` or alternation in a replacement)",
    "alternation-binding": "the options of an alternation bind different captures or names",
    "bad-condition": "a condition that raises for every value its types allow (`$x.dtype * 2`, `$x.shape * 1.0`), or a "
                     "`range` with other than 1 to 3 arguments or a zero step",
    # what a replacement or example introduces (SECURITY.md: bounded evaluation)
    "allocation-budget": "literal sizes (a factory's shape, a size, repeat or view argument, an arange count) ask for "
                         "more elements than fxrules' budget",
    "random-state": "an [exact] or [approx] replacement calls a random-number op its pattern does not",
    "device-move": "a replacement names a device (a device string, `device=`, `.cpu()`, `pin_memory`) its pattern "
                   "does not",
    # named patterns
    "unknown-pattern": "a pattern uses `NAME(...)`, but no named pattern NAME is defined above it or used",
    "duplicate-pattern": "two named patterns a file sees have the same name",
    "bad-use": "a `use \"file.fxr\"` line whose file cannot be read, escapes the directory, or has errors",
    # examples
    "misplaced-example": "an `example` line that does not follow a rule",
    "bad-example": "an example model that cannot be built (undeclared input, wildcard, unknown dtype...)",
}


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One located problem. Lines and columns are 1-based; ``end_column`` is exclusive. Line 0 means the
    file (or path) as a whole, such as one that does not exist: it is shown without a line and column."""

    path: str
    line: int
    column: int
    code: str
    message: str
    severity: str = ERROR
    end_line: int = 0
    end_column: int = 0
    notes: tuple[str, ...] = ()

    @classmethod
    def at(cls, span: Span, code: str, message: str, *, notes: Iterable[str] = (), severity: str = ERROR) -> "Diagnostic":
        return cls(
            path=span.path,
            line=span.line,
            column=span.column,
            code=code,
            message=message,
            severity=severity,
            end_line=span.end_line,
            end_column=span.end_column,
            notes=tuple(notes),
        )

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}" if self.line >= 1 else self.path

    def headline(self) -> str:
        return f"{self.location}: {self.severity}[{self.code}]: {self.message}"

    def render(self, source: Optional[str] = None) -> str:
        """The headline, then the source line with a caret underline, then notes."""
        lines = [self.headline()]
        if source is not None and self.line >= 1:
            text_lines = source.splitlines()
            if self.line <= len(text_lines):
                text = text_lines[self.line - 1].rstrip("\r")
                shown = _shorten(text, self.column)
                lines.append("    " + shown.text)
                width = 1
                if self.end_line == self.line and self.end_column > self.column:
                    width = self.end_column - self.column
                width = max(1, min(width, len(shown.text) - shown.caret + 1))
                lines.append("    " + " " * shown.caret_col + "^" * width)
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class _Shown:
    """A source line as a diagnostic shows it (shortened around the caret when long)."""

    text: str
    caret: int  # 1-based column of the caret within ``text``

    @property
    def caret_col(self) -> int:
        return self.caret - 1


_MAX_SHOWN = 120


def _shorten(text: str, column: int) -> _Shown:
    """Cut very long lines (a 10 MB one-line file) to a window around the column."""
    text = text.expandtabs(1) if "\t" in text else text
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    if len(text) <= _MAX_SHOWN:
        return _Shown(text, max(1, column))
    start = max(0, column - 1 - _MAX_SHOWN // 2)
    window = text[start : start + _MAX_SHOWN]
    prefix = "..." if start else ""
    return _Shown(prefix + window, column - start + len(prefix))


def sort_key(diagnostic: Diagnostic) -> tuple:
    return (diagnostic.path, diagnostic.line, diagnostic.column, diagnostic.code)


class FxrulesError(Exception):
    """Base of every exception fxrules raises on purpose."""


class RuleFileError(FxrulesError):
    """A rule file (or several) has errors. ``diagnostics`` lists all of them, in file order."""

    def __init__(self, diagnostics: Sequence[Diagnostic], sources: Optional[dict[str, str]] = None):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(sorted(diagnostics, key=sort_key))
        self.sources: dict[str, str] = dict(sources or {})
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render(self.sources.get(d.path)) for d in self.diagnostics)

    def __reduce__(self):
        return (RuleFileError, (self.diagnostics, self.sources))
