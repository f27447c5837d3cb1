"""Text to parse tree: the Lark LALR parser for ``grammar/fxr.lark``, and syntax diagnostics.

Newlines end statements except inside brackets; a small post-lexer drops them
there (as Python does) and enforces a nesting limit, so no input can make the
later, recursive stages overflow the stack.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Iterator, Optional

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .errors import Diagnostic, RuleFileError
from .source import Source

MAX_DEPTH = 256
"""Brackets nested deeper than this are a ``too-deep`` diagnostic."""

MAX_CONDITION_OPERATORS = 200
"""Operators in one condition (`where` to `->`) beyond this are a ``too-deep`` diagnostic."""

_CONDITION_OPERATORS = {"NOT", "AND", "OR", "PLUS", "MINUS", "STAR", "SLASH", "DSLASH", "PERCENT", "DOT", "LSQB",
                        "LPAR", "EQEQ", "NOTEQ", "LT", "LE", "GT", "GE", "IN"}
_OPEN = {"LPAR", "LSQB", "LBRACE"}
_CLOSE = {"RPAR", "RSQB", "RBRACE"}


def grammar_text() -> str:
    """The grammar as shipped inside the package (identical to ``grammar/fxr.lark``)."""
    return resources.files("fxrules").joinpath("fxr.lark").read_text(encoding="utf-8")


class _TooDeep(Exception):
    def __init__(self, token: lark.Token, what: str):
        self.token = token
        self.what = what


class _Newlines:
    """Post-lexer: newlines inside brackets are whitespace; runs of newlines are one."""

    always_accept = ("_NL", "ARROW")  # `->` stays one token even where `-` is expected

    def __init__(self) -> None:
        self.history = threading.local()  # the last two tokens, for error messages

    def process(self, stream: Iterator[lark.Token]) -> Iterator[lark.Token]:
        history = self.history
        history.tokens = (None, None)
        depth = 0
        in_condition = False
        operators = 0  # in the current condition: chains build nested trees, so they are bounded too
        last_was_newline = True  # drops newlines at the start of the file
        for token in stream:
            kind = token.type
            if kind == "_NL":
                if depth > 0 or last_was_newline:
                    continue
                last_was_newline = True
                history.tokens = (history.tokens[1], token)
                yield token
                continue
            if kind == "WHERE":
                in_condition, operators = True, 0
            elif kind == "ARROW":
                in_condition = False
            elif in_condition and kind in _CONDITION_OPERATORS:
                operators += 1
                if operators > MAX_CONDITION_OPERATORS:
                    raise _TooDeep(token, f"a condition with more than {MAX_CONDITION_OPERATORS} operators")
            if kind in _OPEN:
                depth += 1
                if depth > MAX_DEPTH:
                    raise _TooDeep(token, f"brackets nested more than {MAX_DEPTH} deep")
            elif kind in _CLOSE and depth > 0:
                depth -= 1
            last_was_newline = False
            history.tokens = (history.tokens[1], token)
            yield token


_lock = threading.Lock()
_parser: Optional[lark.Lark] = None
_postlex = _Newlines()


def _get_parser() -> lark.Lark:
    global _parser
    with _lock:
        if _parser is None:
            _parser = lark.Lark(
                grammar_text(),
                parser="lalr",
                lexer="contextual",
                postlex=_postlex,
                propagate_positions=True,
                maybe_placeholders=False,
                cache=False,
            )
        return _parser


def parse_tree(source: Source) -> lark.Tree:
    """Parse one file's text, or raise RuleFileError with one syntax diagnostic."""
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    try:
        return _get_parser().parse(text)
    except _TooDeep as exc:
        tok = exc.token
        raise RuleFileError(
            [Diagnostic(source.path, tok.line, tok.column, "too-deep", exc.what,
                        end_line=tok.line, end_column=tok.column + 1)],
            {source.path: source.text},
        ) from None
    except UnexpectedInput as exc:
        raise RuleFileError([_syntax_diagnostic(source, text, exc)], {source.path: source.text}) from None


# ---------------------------------------------------------------------------
# Syntax errors in words
# ---------------------------------------------------------------------------

_WORDS = {
    "ARROW": "`->`", "COLON": "`:`", "COMMA": "`,`", "DOT": "`.`", "ELLIPSIS": "`...`", "BAR": "`|`",
    "EQUAL": "`=`", "LPAR": "`(`", "RPAR": "`)`", "LSQB": "`[`", "RSQB": "`]`", "LBRACE": "`{`",
    "RBRACE": "`}`", "EQEQ": "`==`", "NOTEQ": "`!=`", "LE": "`<=`", "GE": "`>=`", "LT": "`<`", "GT": "`>`",
    "PLUS": "`+`", "MINUS": "`-`", "STAR": "`*`", "SLASH": "`/`", "DSLASH": "`//`", "PERCENT": "`%`",
    "RULE": "`rule`", "USE": "`use`", "AS": "`as`", "DEFAULT": "`default`", "WHERE": "`where`",
    "NOT": "`not`", "AND": "`and`", "OR": "`or`", "IN": "`in`", "TRUE": "`True`", "FALSE": "`False`",
    "NONE": "`None`", "CALL_FUNCTION": "`call_function`", "CALL_METHOD": "`call_method`",
    "CALL_MODULE": "`call_module`", "GET_ATTR": "`get_attr`", "WILDCARD": "`_`",
    "CAPTURE": "a capture such as `$x`", "NAME": "a name", "INT": "an integer", "FLOAT": "a number",
    "STRING": "a string", "_NL": "the end of the line", "$END": "the end of the file",
}

_EXPR_START = {"CALL_FUNCTION", "CALL_METHOD", "CALL_MODULE", "GET_ATTR", "CAPTURE", "WILDCARD"}


def _found(token: lark.Token) -> str:
    if token.type == "_NL":
        return "the end of the line"
    if token.type == "$END":
        return "the end of the file"
    value = str(token)
    if len(value) > 30:
        value = value[:27] + "..."
    return f"`{value}`"


def _expected_words(expected: set[str]) -> str:
    expected = {e for e in expected if not e.startswith("__")}
    if expected & _EXPR_START and "ARROW" not in expected:
        if "CALL_FUNCTION" in expected:
            return "a pattern (`call_function ...`, `call_module ...`, `$x`, a name or a literal)"
        return "an expression"
    words = sorted(_WORDS.get(e, e) for e in expected)
    if len(words) == 1:
        return words[0]
    if len(words) > 6:
        words = words[:6] + ["..."]
    return "one of " + ", ".join(words)


def _expectation(expected: set[str], previous: Optional[lark.Token]) -> str:
    """Phrase the common cases the way a person would."""
    prev = previous.type if previous is not None else None
    if "ARROW" in expected and "WHERE" in expected:
        return "expected `->` after the pattern (or `where` and a condition)"
    if "ARROW" in expected:
        return "expected `->` after the pattern"
    if expected == {"COLON"} or ("COLON" in expected and prev in ("NAME", "RSQB", "STRING")):
        return "expected `:` after the rule's name"
    if prev == "ARROW":
        return "expected a replacement after `->`"
    if prev == "WHERE":
        return "expected a condition after `where`"
    if prev in ("CALL_FUNCTION", "CALL_MODULE") and "NAME" in expected:
        return f"expected a target name after `{previous}`"
    if prev == "CALL_METHOD":
        return "expected a method name after `call_method`"
    if prev == "RULE":
        return "expected the rule's name after `rule`"
    if prev == "USE":
        return "expected a dotted module path after `use`"
    if prev == "AS":
        return "expected a name after `as`"
    return "expected " + _expected_words(expected)


def _syntax_diagnostic(source: Source, text: str, exc: UnexpectedInput) -> Diagnostic:
    path = source.path
    if isinstance(exc, UnexpectedCharacters):
        line, column = exc.line, exc.column
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        if char in "\"'":
            return Diagnostic(path, line, column, "unterminated-string",
                              "this string is not closed before the end of the line",
                              end_line=line, end_column=column + 1)
        if char == "$":
            return Diagnostic(path, line, column, "invalid-character",
                              "`$` must be followed by a capture name, as in `$x`",
                              end_line=line, end_column=column + 1)
        shown = char if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}" if char else "?"
        return Diagnostic(path, line, column, "invalid-character",
                          f"unexpected character `{shown}`; expected " + _expected_words(set(exc.allowed or ())),
                          end_line=line, end_column=column + 1)
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        previous = getattr(_postlex.history, "tokens", (None, None))[0]
        expected = set(exc.expected or ())
        if token.type == "$END":
            line, column = _end_position(source.text)
            return Diagnostic(path, line, column, "unexpected-end",
                              "the file ends in the middle of a rule; " + _expectation(expected, previous),
                              end_line=line, end_column=column + 1)
        line, column = token.line, token.column
        end_line = getattr(token, "end_line", line) or line
        end_column = getattr(token, "end_column", column + 1) or column + 1
        if token.type == "_NL":  # the caret goes just after the line's last character
            end_line, end_column = line, column + 1
        return Diagnostic(path, line, column, "unexpected-token",
                          f"{_expectation(expected, previous)}, found {_found(token)}",
                          end_line=end_line, end_column=end_column)
    if isinstance(exc, UnexpectedEOF):
        line, column = _end_position(source.text)
        return Diagnostic(path, line, column, "unexpected-end",
                          "the file ends in the middle of a rule; expected " + _expected_words(set(exc.expected or ())),
                          end_line=line, end_column=column + 1)
    return Diagnostic(path, 1, 1, "unexpected-token", str(exc).splitlines()[0] if str(exc) else "syntax error")


def _end_position(text: str) -> tuple[int, int]:
    stripped = text.rstrip()
    line = stripped.count("\n") + 1
    column = len(stripped) - (stripped.rfind("\n") + 1) + 1
    return line, max(1, column)
