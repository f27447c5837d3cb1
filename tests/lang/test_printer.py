"""Tests of fxrules.lang.printer, the canonical formatter behind ``fxrules fmt``.

The printer's contract is the round trip ``build(parse(print(ast))) == ast``
for every AST the builder produces, and idempotence on text. Checked here:

* on every ``.fxr`` file of the pass corpus and of ``rules/``;
* on exact expected texts, for the layout and the parenthesization of
  conditions, which the round trip alone would not pin down;
* on random ASTs from Hypothesis strategies that build only what the grammar
  can express (see the strategies section for the few shapes left out);
* on very deep ASTs, which must print without recursion errors.

AST equality is too weak for a round trip: dataclass ``==`` finds ``1``,
``1.0`` and ``True`` equal, and ``0.0`` equal to ``-0.0``. So comparisons go
through :func:`shape`, which also compares the types of literal values.
"""

from __future__ import annotations

import ast as pyast
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fxrules.lang.ast as A
import fxrules.lang.parser as parser
import fxrules.lang.printer as printer
from fxrules.errors import RuleFileError
from fxrules.lang.source import Source
from tests.ast_shape import shape

ROOT = Path(__file__).resolve().parents[2]
PATH = "<test>"


def parse(text: str, path: str = PATH) -> A.RuleFile:
    source = Source(path, text)
    return parser.parse(source)


def assert_round_trip(rule_file: A.RuleFile) -> str:
    """Print, re-read and compare; then check that printing again changes nothing."""
    text = printer.print_file(rule_file)
    again = parse(text, rule_file.path)
    assert shape(again) == shape(rule_file), text
    assert printer.print_file(again) == text
    return text


def fmt(text: str) -> str:
    return printer.print_file(parse(text))


def cond_text(condition: str) -> str:
    """The canonical text of one condition, read from a one-line rule."""
    (rule,) = parse(f"$x where {condition} -> $x\n").rules
    (cond,) = rule.conditions
    return printer.print_cond(cond)


# ---------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------

CORPUS = sorted(
    [*ROOT.glob("tests/corpus/pass/**/*.fxr"), *ROOT.glob("rules/**/*.fxr")]
)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(ROOT)))
def test_corpus_round_trip(path: Path) -> None:
    rule_file = parse(path.read_text(encoding="utf-8"), str(path))
    assert rule_file.items
    assert_round_trip(rule_file)


def test_corpus_is_not_empty() -> None:
    assert CORPUS, "no .fxr files found under tests/corpus/pass/"


# ---------------------------------------------------------------------------
# Exact canonical text
# ---------------------------------------------------------------------------


def test_layout_of_a_file() -> None:
    source = (
        "# header comment\n"
        "use   torch.nn.functional   as F\n"
        "default[exact]\n"
        "[changes]   call_module Dropout->call_module Identity   # comment\n"
        "rule   r1 'desc' [approx] :\n"
        "  call_function f( $x ,k = 1, ... ) where $x.ndim==2\n"
        "  where not(a or b) -> $x\n"
        "rule r2: $x, $y -> $y, $x\n"
        "call_method relu where is_one($x) where True -> call_function torch.relu\n"
    )
    assert fmt(source) == (
        "use torch.nn.functional as F\n"
        "default [exact]\n"
        "[changes] call_module Dropout -> call_module Identity\n"
        "\n"
        'rule r1 "desc" [approx]:\n'
        "    call_function f($x, k=1, ...)\n"
        "    where $x.ndim == 2\n"
        "    where not (a or b)\n"
        "    -> $x\n"
        "\n"
        "rule r2:\n"
        "    $x, $y\n"
        "    -> $y, $x\n"
        "\n"
        "call_method relu where is_one($x) where True -> call_function torch.relu\n"
    )


def test_empty_file() -> None:
    assert fmt("") == ""
    assert fmt("\n# only a comment\n\n") == ""


@pytest.mark.parametrize(
    "source, expected",
    [
        # bare calls, argument lists, keyword arguments, `...` after keywords
        ("call_module Linear", "call_module Linear"),
        ("call_function f()", "call_function f()"),
        ("call_function f(k=1, ...)", "call_function f(k=1, ...)"),
        ("call_function f(..., $x)", "call_function f(..., $x)"),
        ("call_function f(\n  $x,\n  $y,\n)", "call_function f($x, $y)"),
        # modules: attributes, an empty attribute block, builders
        ("call_module Linear{}", "call_module Linear{}"),
        ("call_module Linear { bias = False , } ($x)", "call_module Linear{bias=False}($x)"),
        ("call_module m.build(a, b)()", "call_module m.build(a, b)()"),
        ("call_module m.build()($x, k=1)", "call_module m.build()($x, k=1)"),
        # get_attr forms
        ("get_attr $p", "get_attr $p"),
        ("get_attr _", "get_attr _"),
        ("get_attr layer.weight", "get_attr layer.weight"),
        # values: tuples, lists, literals
        ("call_function f((1,), (1, 2,), [], [a, b.c])", "call_function f((1,), (1, 2), [], [a, b.c])"),
        ("call_function f(None, True, False, -1, - 2.5, 0x1F, 1e3, .5)",
         "call_function f(None, True, False, -1, -2.5, 31, 1000.0, 0.5)"),
        ("call_function f('it''s')", None),  # two adjacent strings are a syntax error
        ("call_function f('say \"hi\"\\n')", 'call_function f("say \\"hi\\"\\n")'),
        # alternation and binding
        ("call_function f($x) | call_method f($x)", "(call_function f($x) | call_method f($x))"),
        ("(a | (b | c))", "(a | (b | c))"),
        ("((a | b) as x) as y", "((a | b) as x) as y"),
        ("(call_function f($x) as y | _) as z", "(call_function f($x) as y | _) as z"),
        ("-5 as n", "-5 as n"),
        ("((($x)))", "$x"),
    ],
)
def test_expression_text(source: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(RuleFileError):
            parse(f"{source} -> $x\n")
        return
    (rule,) = parse(f"{source} -> $x\n").rules
    (pattern,) = rule.patterns
    assert printer.print_expr(pattern) == expected


@pytest.mark.parametrize(
    "source, expected",
    [
        ("a or b or c", "a or b or c"),
        ("(a or b) or c", "a or b or c"),
        ("a or (b or c)", "a or (b or c)"),
        ("a and b or c and d", "a and b or c and d"),
        ("(a or b) and (c or d)", "(a or b) and (c or d)"),
        ("a and (b and c)", "a and (b and c)"),
        ("not not a", "not not a"),
        ("not (a == b)", "not a == b"),
        ("(not a) == b", "(not a) == b"),
        ("a == (not b)", "a == (not b)"),
        ("(a < b) == c", "(a < b) == c"),
        ("a < (b < c)", "a < (b < c)"),
        ("a not  in b", "a not in b"),
        ("x in [1, 2.5, 'a', None, $y]", 'x in [1, 2.5, "a", None, $y]'),
        ("(a - b) - c", "a - b - c"),
        ("a - (b - c)", "a - (b - c)"),
        ("a - (b + c) * d", "a - (b + c) * d"),
        ("(a * b) // (c % d)", "a * b // (c % d)"),
        ("- (a + b)", "-(a + b)"),
        ("- - a", "--a"),
        ("-a.b", "-a.b"),
        ("(-a).b", "(-a).b"),
        ("a * -b", "a * -b"),
        ("(a + b)[0]", "(a + b)[0]"),
        ("f(a, b,)(c)[d + 1].e", "f(a, b)(c)[d + 1].e"),
        ("$x.shape[-1] == 1e999", "$x.shape[-1] == 1e999"),
        ("(1).real + (2.5).imag", "1 .real + 2.5.imag"),
        ("1 .real + 1e+16.imag + 0x10 .x", "1 .real + 1e+16.imag + 16 .x"),
        ("'s'.upper() == \"S\"", '"s".upper() == "S"'),
        ("[a, [b]][0][0]", "[a, [b]][0][0]"),
        ("(not a)", "not a"),
        ("f(not a, b or c)[x and y]", "f(not a, b or c)[x and y]"),
        # generators (issue 19): the only argument of a call
        ("all(d > 0 for d in $x.shape)", "all(d > 0 for d in $x.shape)"),
        ("any((a or b) for v in (c or d) if (e and f))", "any(a or b for v in c or d if e and f)"),
        ("sum(v for v in a in b if not v)", "sum(v for v in a in b if not v)"),
        ("all(all(i < j for i in range(j)) for j in $xs)", "all(all(i < j for i in range(j)) for j in $xs)"),
        ("f(for for if in in_ if if_)", "f(for for if in in_ if if_)"),  # keywords only where the grammar takes them
        # slices (issue 19): an index with colons
        ("$x.shape[1:]", "$x.shape[1:]"),
        ("$x.shape[ : -1]", "$x.shape[:-1]"),
        ("a[::2]", "a[::2]"),
        ("a[1::]", "a[1:]"),
        ("a[:]", "a[:]"),
        ("a[(b + 1):len(c) - 1:(d)][0]", "a[b + 1:len(c) - 1:d][0]"),
        ("a[b or c:]", "a[b or c:]"),
    ],
)
def test_condition_text(source: str, expected: str) -> None:
    assert cond_text(source) == expected
    assert cond_text(expected) == expected


def test_conditions_built_by_hand() -> None:
    a, b, c = A.CName("a"), A.CName("b"), A.CName("c")
    assert printer.print_cond(A.CBinary("or", a, A.CBinary("or", b, c))) == "a or (b or c)"
    assert printer.print_cond(A.CBinary("<", A.CBinary("<", a, b), c)) == "(a < b) < c"
    assert printer.print_cond(A.CBinary("*", a, A.CUnary("not", b))) == "a * (not b)"
    assert printer.print_cond(A.CUnary("-", A.CBinary("-", a, b))) == "-(a - b)"
    # a negative literal prints as the unary minus it reads back as
    assert printer.print_cond(A.CLiteral(-5)) == "-5"
    assert printer.print_cond(A.CAttr(A.CLiteral(-5), "real")) == "(-5).real"
    assert printer.print_cond(A.CBinary("-", a, A.CLiteral(-0.0))) == "a - -0.0"
    with pytest.raises(ValueError):
        printer.print_cond(A.CBinary("**", a, b))
    with pytest.raises(TypeError):
        printer.print_cond(A.Capture("x"))


# ---------------------------------------------------------------------------
# Literals
# ---------------------------------------------------------------------------

STRING_TERMINAL = re.compile(r'"([^"\\\n]|\\.)*"|\'([^\'\\\n]|\\.)*\'')


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", '""'),
        ("plain é 😀", '"plain é 😀"'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("'", '"\'"'),
        ("\n\r\t", '"\\n\\r\\t"'),
        ("\x00\x7f\xa0\u2028\U000e0001", '"\\x00\\x7f\\xa0\\u2028\\U000e0001"'),
        ("\ud800", '"\\ud800"'),
    ],
)
def test_string_literal(value: str, expected: str) -> None:
    assert printer.string_literal(value) == expected
    assert pyast.literal_eval(expected) == value


@given(st.text(st.characters(exclude_categories=())))
def test_string_literal_reads_back(value: str) -> None:
    text = printer.string_literal(value)
    assert STRING_TERMINAL.fullmatch(text)
    assert pyast.literal_eval(text) == value


def test_numbers() -> None:
    assert printer.literal(0.1) == "0.1"
    assert printer.literal(1e16) == "1e+16"
    assert printer.literal(-0.0) == "-0.0"
    assert printer.literal(math.inf) == "1e999"
    assert printer.literal(-math.inf) == "-1e999"
    with pytest.raises(ValueError):
        printer.literal(math.nan)
    with pytest.raises(TypeError):
        printer.literal(b"bytes")  # type: ignore[arg-type]


def test_overflowing_float_literal_reads_back_as_infinity() -> None:
    rule_file = parse("call_function f(1e999, -1e999) where x == 1e999 -> $x\n")
    text = assert_round_trip(rule_file)
    assert text == "call_function f(1e999, -1e999) where x == 1e999 -> $x\n"


def test_integer_too_long_for_str_prints_in_hex() -> None:
    value = 16 ** 5000 - 1  # about 6000 decimal digits, over Python's default str() limit
    rule_file = parse(f"call_function f(0x{'f' * 5000}, -0x{'f' * 5000}) -> $x\n")
    assert rule_file.rules[0].patterns[0].args == (A.Literal(value), A.Literal(-value))
    text = assert_round_trip(rule_file)
    assert f"0x{'f' * 5000}" in text


# ---------------------------------------------------------------------------
# Shapes the printer refuses
# ---------------------------------------------------------------------------


def test_rules_that_cannot_be_printed() -> None:
    x = A.Capture("x")
    with pytest.raises(ValueError):
        printer.print_rule(A.Rule(None, "desc", None, (x,), (), (x,)))
    with pytest.raises(ValueError):
        printer.print_rule(A.Rule("r", None, None, (), (), (x,)))
    with pytest.raises(ValueError):
        printer.print_rule(A.Rule("r", None, None, (x,), (), ()))
    with pytest.raises(TypeError):
        printer.print_expr(A.CName("x"))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Deep nesting
# ---------------------------------------------------------------------------


def _nest(template: str, inner: str, depth: int) -> str:
    for _ in range(depth):
        inner = template.format(inner)
    return inner


DEPTH = 240  # the parser refuses brackets nested more than 256 deep
COND_OPS = 190  # and conditions with more than 200 operators (brackets and `.` included)

DEEP_TEXTS = {
    "calls": "{} -> $x".format(_nest("call_function f({})", "$x", DEPTH)),
    "builders": "{} -> $x".format(_nest("call_module m.b({})($x)", "$x", DEPTH)),
    "lists": "call_function f({}) -> $x".format(_nest("[{}]", "$x", DEPTH - 1)),
    "tuples": "call_function f({}) -> $x".format(_nest("({},)", "$x", DEPTH - 1)),
    "binds": "{} as n -> $x".format(_nest("({} as n)", "$x", DEPTH - 1)),
    "alternatives": "{} -> $x".format(_nest("({} | _)", "$x", DEPTH)),
    "parentheses": "$x where {} -> $x".format(_nest("-({} + a)", "a", COND_OPS // 3)),
    "condition lists": "$x where {} -> $x".format(_nest("[{}]", "a", COND_OPS)),
    "condition calls": "$x where {} -> $x".format(_nest("f({})", "a", COND_OPS)),
    "and chain": "$x where " + " and ".join(["a"] * COND_OPS) + " -> $x",
    "not chain": "$x where " + "not " * COND_OPS + "a -> $x",
    "attribute chain": "$x where a" + ".b" * COND_OPS + " -> $x",
}


@pytest.mark.parametrize("text", DEEP_TEXTS.values(), ids=DEEP_TEXTS.keys())
def test_deep_nesting_round_trips(text: str) -> None:
    printed = assert_round_trip(parse(text + "\n"))
    assert printed == text + "\n"


def test_very_deep_hand_built_asts_print() -> None:
    # Far deeper than the parser accepts: printing is iterative, so depth costs no stack.
    depth = 20_000
    cond: A.Cond = A.CName("a")
    expr: A.Expr = A.Capture("x")
    for i in range(depth):
        cond = [A.CUnary("not", cond), A.CAttr(cond, "b"), A.CBinary("+", A.CName("c"), cond)][i % 3]
        expr = A.Call("call_function", A.Dotted(("f",)), (expr,))
    assert printer.print_cond(cond).count("not ") == depth // 3 + (depth % 3 > 0)
    assert printer.print_expr(expr).count("call_function f(") == depth


# ---------------------------------------------------------------------------
# Random ASTs
# ---------------------------------------------------------------------------
#
# The strategies build only what the grammar can express, which is what the
# builder produces: lists, tuples and `...` only as arguments; tuples with at
# least one item; alternatives with at least two options; a builder argument
# list only with an argument list; an unnamed rule without a description;
# non-negative condition literals (a negative one reads back as unary minus).

KEYWORDS = (
    "rule", "use", "as", "default", "where", "not", "and", "or", "in", "True", "False", "None",
    "call_function", "call_method", "call_module", "get_attr", "_",
)

names = st.one_of(
    st.sampled_from(["a", "x", "conv", "bn", "F", "torch", "_p", "é", "变量", "asx", "None_", "exact"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True),
).filter(lambda name: name not in KEYWORDS)
capture_names = st.one_of(names, st.sampled_from(KEYWORDS))  # `$rule` is a fine capture
dotted = st.lists(names, min_size=1, max_size=3).map(lambda parts: A.Dotted(tuple(parts)))
texts = st.text(max_size=12)

pattern_literals = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts
).map(A.Literal)
cond_literals = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=0),
    st.floats(min_value=0.0, allow_nan=False).filter(lambda f: math.copysign(1.0, f) > 0),
    texts,
).map(A.CLiteral)


def tuple_of(strategy, **kwargs):
    return st.lists(strategy, **kwargs).map(tuple)


@st.composite
def _calls(draw, attrs, args, keywords, builder_args):
    op = draw(st.sampled_from(("call_function", "call_method", "call_module")))
    target = A.Dotted((draw(names),)) if op == "call_method" else draw(dotted)
    module = op == "call_module"
    attributes = draw(attrs) if module else None
    if args is None or draw(st.booleans()):
        return A.Call(op, target, attrs=attributes)  # the bare form
    builder = draw(builder_args) if module else None
    return A.Call(op, target, draw(args), draw(keywords), attributes, builder)


def calls(values=None):
    """Calls whose arguments are drawn from ``values``; only the bare form without."""
    if values is None:
        return _calls(st.none(), None, None, None)
    keywords = tuple_of(st.builds(A.Keyword, names, values), max_size=2)
    args = tuple_of(values | st.just(A.Ellipsis_()) | st.builds(A.Variadic, capture_names), max_size=3)
    return _calls(st.none() | keywords, args, keywords, st.none() | tuple_of(values, max_size=2))


def extend_exprs(children):
    def containers(items):
        return st.one_of(
            tuple_of(items, max_size=3).map(A.ListExpr),
            tuple_of(items, min_size=1, max_size=3).map(A.TupleExpr),
        )

    # Lists and tuples nest two deep. (Not st.recursive: Hypothesis builds the repr
    # of nested recursive strategies eagerly, and it is huge.)
    values = st.one_of(children, containers(children | containers(children)))
    return st.one_of(
        tuple_of(children, min_size=2, max_size=3).map(A.Alt),
        st.builds(A.Bind, children, names),
        calls(values),
        st.builds(A.PatternUse, names, tuple_of(children, max_size=3)),  # a named pattern's use
    )


exprs = st.recursive(
    st.one_of(
        st.builds(A.Capture, capture_names),
        st.just(A.Wildcard()),
        pattern_literals,
        st.builds(A.Name, dotted),
        st.builds(A.GetAttr, st.one_of(st.builds(A.Capture, capture_names), st.just(A.Wildcard()), dotted)),
        calls(),
        st.builds(A.Computed, st.builds(A.CCapture, capture_names) | cond_literals),  # `{...}`
    ),
    extend_exprs,
    max_leaves=8,
)

conds = st.recursive(
    st.one_of(st.builds(A.CCapture, capture_names), st.builds(A.CName, names), cond_literals),
    lambda c: st.one_of(
        st.builds(A.CBinary, st.sampled_from(sorted(printer._BINARY_LEVELS)), c, c),
        st.builds(A.CUnary, st.sampled_from(("not", "-")), c),
        st.builds(A.CAttr, c, names),
        st.builds(A.CIndex, c, c),
        st.builds(lambda v, *parts: A.CIndex(v, A.CSlice(*parts)), c, st.none() | c, st.none() | c, st.none() | c),
        st.builds(A.CCall, c, tuple_of(c, max_size=3)),
        tuple_of(c, max_size=3).map(A.CList),
        st.builds(lambda func, *parts: A.CCall(func, (A.CGenerator(*parts),)), c, c, names, c, st.none() | c),
    ),
    max_leaves=10,
)

contracts = st.builds(A.Contract, names)


@st.composite
def rules(draw):
    name = draw(st.none() | names)
    return A.Rule(
        name=name,
        description=draw(st.none() | texts) if name is not None else None,
        contract=draw(st.none() | contracts),
        patterns=draw(tuple_of(exprs, min_size=1, max_size=2)),
        conditions=draw(tuple_of(conds, max_size=2)),
        replacements=draw(tuple_of(exprs, min_size=1, max_size=2)),
        examples=draw(tuple_of(examples(), max_size=2)),
    )


input_specs = st.builds(
    A.InputSpec, capture_names, st.none() | st.sampled_from(A.DTYPES),
    tuple_of(st.integers(0, 64), max_size=4), st.none() | st.integers(-3, 3) | st.sampled_from([0.5, -1.5]),
)


@st.composite
def examples(draw):
    return A.Example(
        count=draw(st.none() | st.integers(0, 5)),
        mode=draw(st.none() | st.sampled_from(A.EXAMPLE_MODES)),
        outputs=draw(tuple_of(exprs, min_size=1, max_size=2)),
        inputs=draw(tuple_of(input_specs, max_size=3)),
    )


rule_files = tuple_of(
    st.one_of(rules(), st.builds(A.Use, dotted, names), st.builds(A.DefaultContract, contracts),
              st.builds(A.UseFile, texts), st.builds(A.PatternDef, names, tuple_of(capture_names, max_size=3), exprs)),
    max_size=4,
).map(lambda items: A.RuleFile(PATH, items))


@given(rule_files)
def test_random_files_round_trip(rule_file: A.RuleFile) -> None:
    assert_round_trip(rule_file)


@given(rule_files, st.sampled_from([12, 30, 60]))
@pytest.mark.slow
def test_wrapping_long_lines_keeps_the_ast(rule_file: A.RuleFile, width: int) -> None:
    """Any line width: the broken lines parse to the same AST (newlines only inside brackets)."""
    old = printer.WIDTH
    printer.WIDTH = width
    try:
        assert_round_trip(rule_file)
    finally:
        printer.WIDTH = old


@given(conds)
def test_random_conditions_round_trip(cond: A.Cond) -> None:
    text = printer.print_cond(cond)
    (rule,) = parse(f"$x where {text} -> $x\n").rules
    assert shape(rule.conditions) == shape((cond,)), text


def test_an_empty_builder_argument_list_is_not_broken_at_any_width() -> None:
    """Found by the wrapping property: `a()` at width 12 printed as `a(\\n    ,\\n)`, which does not parse."""
    example = A.Example(count=None, mode=None, inputs=(), outputs=(
        A.Call(op="call_module", target=A.Dotted(("a",)), args=(A.Capture("a"),), kwargs=(), attrs=None,
               builder_args=()),))
    rule_file = A.RuleFile("<test>", (A.Rule(name=None, description=None, contract=None, patterns=(A.Capture("a"),),
                                             conditions=(), replacements=(A.Capture("a"),), examples=(example,)),))
    old = printer.WIDTH
    printer.WIDTH = 12
    try:
        assert "a()(" in printer.print_file(rule_file)
        assert_round_trip(rule_file)
    finally:
        printer.WIDTH = old
