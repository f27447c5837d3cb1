"""Fuzzing the front end: text (or bytes) to AST must never fail other than with a diagnostic.

Rule files are untrusted input, so ``parser.parse(src)`` (and ``parser.parse_lark(src)``, its fallback)
may raise :class:`fxrules.errors.RuleFileError` and nothing else: no
``ValueError``, ``RecursionError``, ``AssertionError`` or lark exception.
Three sources of input:

(a) strings generated from the grammar itself (``grammar/fxr.lark``) with
    :func:`hypothesis.extra.lark.from_lark`. Most of these parse, so they reach
    the reductions' checks; every file that builds must round-trip through the printer.
(b) arbitrary text, and a "token soup" of the language's own words and
    punctuation, which gets further into the parser than random characters;
(c) arbitrary bytes through :func:`fxrules.lang.source.decode`.

How the grammar strategy is made to produce mostly valid files:
``from_lark`` joins terminals with no separator (and only sometimes inserts an
ignored terminal), so ``call_function`` and ``f`` would fuse into one name;
every terminal is therefore drawn with a trailing space. Regex terminals get
explicit strategies: names avoid the keywords (``as`` lexes as ``AS``), numbers
stay within Python's int-from-str limit (see ``test_huge_decimal_integer``),
strings are mostly valid Python literals, and comments appear only at the end
of a line (as part of the ``_NL`` strategy), since a comment generated between
two tokens would swallow the rest of the line.
"""

from __future__ import annotations

import re

import lark
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

import fxrules.lang.parser as parser
import fxrules.lang.printer as printer
import fxrules.lang.source as source
from fxrules.errors import RuleFileError
from tests.ast_shape import listing, shape

PATH = "<fuzz>"


def front_end(text: str) -> object:
    """The pipeline under test: text to RuleFile, or RuleFileError (both loops, which must agree)."""
    src = source.Source(PATH, text)
    try:
        reference = parser.parse_lark(src)
    except RuleFileError as exc:
        with pytest.raises(RuleFileError) as caught:
            parser.parse(src)
        assert [str(d) for d in caught.value.diagnostics] == [str(d) for d in exc.diagnostics]
        raise
    assert listing(parser.parse(src)) == listing(reference)  # spans included; iterative, for deep ASTs
    return reference


def check(text: str) -> bool:
    """Run the front end; True if the text built (and then round-tripped), False on a diagnostic."""
    try:
        rule_file = front_end(text)
    except RuleFileError:
        return False
    printed = printer.print_file(rule_file)
    again = front_end(printed)
    assert shape(again) == shape(rule_file), printed
    assert printer.print_file(again) == printed
    return True


# ---------------------------------------------------------------------------
# (a) Strings from the grammar
# ---------------------------------------------------------------------------

GRAMMAR = lark.Lark(parser.grammar_text(), parser="lalr", start="start")

KEYWORDS = frozenset(
    t.pattern.value for t in GRAMMAR.terminals
    if isinstance(t.pattern, lark.lexer.PatternStr) and re.fullmatch(r"\w+", t.pattern.value)
)
assert {"rule", "as", "not", "None", "call_module", "_"} <= KEYWORDS

identifiers = st.one_of(
    st.sampled_from(["a", "x", "conv", "bn", "F", "torch", "relu", "_p", "é", "变量", "asx", "exact"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
)
names = identifiers.filter(lambda name: name not in KEYWORDS)
FLOAT_RE = next(t.pattern.to_regexp() for t in GRAMMAR.terminals if t.name == "FLOAT")
STRING_RE = next(t.pattern.to_regexp() for t in GRAMMAR.terminals if t.name == "STRING")

REGEX_TERMINALS = {
    "NAME": names,
    "CAPTURE": identifiers.map(lambda name: "$" + name),  # keywords are fine after `$`
    "INT": st.one_of(
        st.integers(0, 10**30).map(str),
        st.integers(0, 2**80).map(hex),
        st.integers(0, 2**80).map(lambda n: "0X" + format(n, "X")),
        st.from_regex(r"[0-9]{1,12}", fullmatch=True),  # (Unicode digits: in the token soup below)
    ),
    "FLOAT": st.from_regex(FLOAT_RE, fullmatch=True).filter(lambda s: len(s) < 40),
    "STRING": st.one_of(
        st.text(max_size=10).map(printer.string_literal),
        st.text(max_size=10).map(repr),  # single-quoted when possible
        st.from_regex(STRING_RE, fullmatch=True),  # any escape, some of them invalid
    ),
    "_NL": st.sampled_from(["\n", "\r\n", "\n\n", "\n\t  ", "\n# a comment\n", "  # trailing\n\n  "]),
    "WS": st.sampled_from([" ", "\t", "  ", "\f"]),
    "COMMENT": st.just(" "),
    "LINE_CONTINUATION": st.sampled_from(["\\\n", "\\ \r\n  "]),
}


def _terminal_strategies() -> dict:
    explicit = {}
    for terminal in GRAMMAR.terminals:
        if isinstance(terminal.pattern, lark.lexer.PatternStr):
            explicit[terminal.name] = st.just(terminal.pattern.value)
        else:
            explicit[terminal.name] = REGEX_TERMINALS[terminal.name]
    # A trailing space keeps neighbours apart: `call_function f`, `1 .real`, `- >`.
    return {name: strategy.map(lambda s: s + " ") for name, strategy in explicit.items()}


grammar_texts = from_lark(GRAMMAR, start="start", explicit=_terminal_strategies())


@pytest.mark.filterwarnings("ignore:invalid escape sequence")  # "\d" in a string literal
@given(grammar_texts)
@pytest.mark.slow
def test_grammar_strings(text: str) -> None:
    check(text)


@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@pytest.mark.slow
def test_grammar_strings_mostly_build() -> None:
    """Guard the generator itself: if most of its strings failed, (a) would test little."""
    outcomes: list[bool] = []

    @settings(max_examples=60, database=None, derandomize=True)
    @given(grammar_texts)
    def run(text: str) -> None:
        outcomes.append(check(text))

    run()
    assert len(outcomes) >= 30
    assert sum(outcomes) >= 0.8 * len(outcomes), f"{sum(outcomes)} of {len(outcomes)} built"


# ---------------------------------------------------------------------------
# (b) Arbitrary text, and token soup
# ---------------------------------------------------------------------------

VOCABULARY = sorted(
    {t.pattern.value for t in GRAMMAR.terminals if isinstance(t.pattern, lark.lexer.PatternStr)}
    | {"$x", "$rule", "a", "b.c", "0", "12", "0x1f", "1.5", "1e999", ".5e3", "'s'", '"\\n"', '"\\d"',
       '"', "'", "$", "#", "# c\n", "\\\n", "\n", "\r\n", "\t", " ", "é", "٣", "१२"}
)

token_soup = st.lists(
    st.tuples(st.sampled_from(VOCABULARY), st.sampled_from(["", " ", " ", "\n"])), max_size=40
).map(lambda pairs: "".join(word + gap for word, gap in pairs))


@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@given(st.text())
def test_arbitrary_text(text: str) -> None:
    check(text)


@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@given(token_soup)
def test_token_soup(text: str) -> None:
    check(text)


# ---------------------------------------------------------------------------
# (c) Arbitrary bytes
# ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@given(
    st.sampled_from([b"", b"\xef\xbb\xbf"]),
    st.one_of(st.binary(), st.text().map(str.encode), token_soup.map(str.encode)),
)
def test_arbitrary_bytes(bom: bytes, data: bytes) -> None:
    try:
        src = source.decode(bom + data, PATH)
    except RuleFileError:
        return
    check(src.text)


# ---------------------------------------------------------------------------
# Limits: deep input is a `too-deep` diagnostic, never a RecursionError
# ---------------------------------------------------------------------------


def _nest(template: str, inner: str, depth: int) -> str:
    for _ in range(depth):
        inner = template.format(inner)
    return inner


@pytest.mark.parametrize("condition", [
    "not " * 2000 + "a",
    "-" * 2000 + "a",
    " + ".join(["a"] * 2000),
    "a" + ".b" * 2000,
    "a" + "[0]" * 2000,
    "a" + "()" * 2000,
    _nest("({})", "a", 1000),
])
def test_long_condition_chains_are_too_deep(condition: str) -> None:
    with pytest.raises(RuleFileError) as info:
        front_end(f"$x where {condition} -> $x\n")
    assert [d.code for d in info.value.diagnostics] == ["too-deep"]


@pytest.mark.parametrize("template", [
    "call_function f({})",
    "[{}]",
    "({} | _)",
    "call_module M{{k={}}}",
    "call_module M(k={})",
    "({} as n | _)",
])
def test_deep_brackets_are_too_deep(template: str) -> None:
    with pytest.raises(RuleFileError) as info:
        front_end("call_function g({}) -> $x\n".format(_nest(template, "$x", 1000)))
    assert [d.code for d in info.value.diagnostics] == ["too-deep"]


# ---------------------------------------------------------------------------
# Once bugs in the front end: huge literals and deep brackets within the limit
# ---------------------------------------------------------------------------


def test_huge_decimal_integer() -> None:
    check("call_function f(" + "9" * 5000 + ") -> $x\n")


@pytest.mark.parametrize("template", ["call_module M{{k={}}}", "call_module M(k={})", "({} as n | _)"])
def test_deep_brackets_within_the_limit(template: str) -> None:
    check("{} -> $x\n".format(_nest(template, "$x", 250)))  # 250 <= MAX_DEPTH: must build or be a diagnostic
