"""The direct loop from text to AST changes nothing but the time.

Both of the parser's loops call the one set of reductions (``fxrules.lang.reductions``):
``parser.parse_direct`` (its own scanner and LALR loop) must make exactly what
``parser.parse_lark`` (Lark's loop and lexer, the fallback, forced here on valid text) makes,
spans included, or report the same problem; and where Lark finds a syntax error the direct
loop must give up (:class:`fxrules.lang.parser.NotDirect`) so that Lark's loop words it.
Checked on the pass and fail corpora, the bundled library, the benchmark workloads,
generated files, and the parser fuzz tests' strategies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxrules
import fxrules.lang.ast as A
import fxrules.lang.reductions as reductions
import fxrules.lang.parser as parser
from fxrules.errors import RuleFileError
from fxrules.lang.source import Source, read
from tests.ast_shape import listing
from tests.lang.test_parser_fuzz import _nest, grammar_texts, token_soup

ROOT = Path(__file__).resolve().parents[2]


def diagnostics(exc: RuleFileError) -> list:
    return [(d.code, d.line, d.column, d.end_line, d.end_column, d.message) for d in exc.diagnostics]


def both_ways(text: str, path: str = "<both>") -> bool:
    """Parse ``text`` with both loops and check they agree; True if it parsed.

    A syntax error: the direct loop gives up. A problem the reductions find: both loops
    report the same diagnostic."""
    src = Source(path, text)
    try:
        reference = parser.parse_lark(src)
    except RuleFileError as exc:
        try:
            parser.parse_direct(src)
        except parser.NotDirect:
            pass
        except RuleFileError as direct_exc:
            assert diagnostics(direct_exc) == diagnostics(exc)
        else:
            raise AssertionError("the direct loop parsed what Lark's loop refused")
        with pytest.raises(RuleFileError) as caught:
            parser.parse(src)
        assert diagnostics(caught.value) == diagnostics(exc)
        return False
    direct = parser.parse_direct(src)
    assert listing(direct) == listing(reference)
    assert listing(parser.parse(src)) == listing(reference)
    return True


def _files() -> list[Path]:
    paths = sorted((ROOT / "tests" / "corpus").rglob("*.fxr"))
    return paths + sorted((ROOT / "fxrules" / "library").rglob("*.fxr"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@pytest.mark.slow
def test_every_corpus_and_library_file(path: Path):
    try:
        src = read(path)
    except RuleFileError:  # not text: the front end never parses it
        return
    built = both_ways(src.text, src.path)
    assert built or "fail" in path.parts


def test_the_pass_corpus_and_the_library_build_directly():
    """No fallback where nothing is wrong: the direct path is what the front end uses."""
    paths = [p for p in _files() if "fail" not in p.parts]
    assert len(paths) > 10
    for path in paths:
        parser.parse_direct(read(path))


def test_benchmark_workloads_and_generated_files():
    from benchmarks.run import parse_texts
    from benchmarks.workloads import WORKLOADS

    for name, workload in WORKLOADS.items():
        assert both_ways(workload.rules_text, name)
    assert both_ways(parse_texts(500), "generated")


VARIETY = '''
use torch.nn.functional as F
default [exact]

rule every_form "a description, with \\"escapes\\" \\u00e9" [approx]:
    call_module Conv2d{kernel_size=[3, 3], stride=(1, 1), padding=(1,), bias=True}(($x), ...) as conv, \\
    call_function F.relu(get_attr $w, get_attr _, get_attr a.b, [1, -2, 3.5, -4e3, 0x1F, "s", None, False],
                         key=(call_method view($y, -1) | call_method reshape($y, -1) as r), other=_)
    where not conv.training and ($x.shape[0] > 1 or ($x.ndim in [3, 4])) and -(1 + 2) * 3 // 4 % 5 - 6 / 7 <= 8
    where conv.kernel_size[0] not in [1,] and torch.float32 != $x.dtype and is_float($x) and ((True))
    where F.gelu(None) == False
    -> call_module fxrules.builders.fold_conv_bn(conv, $w)($x, ...), \\
       call_function torch.add((($x)), $y, alpha=(2))

rule multi_line:
    (call_function torch.relu(
        $x,  # a comment
    ) as a)
    -> call_function torch.relu(
        $x)
example 2 train: call_function torch.relu(call_function torch.neg($x)) given $x: float64[2, 3] = 1.5, $b: [4,] = -2
example: call_module ReLU{inplace=False}($x) given $x: [2]

[changes] call_method add($x, $y) -> call_method sub($x, \\
    $y)
call_function torch.neg($x) -> $x
'''


def test_every_form_of_the_language():
    """One file with every construct (names, literals, parentheses, conditions, examples, spans
    across lines), so each reduction of the direct path is checked against the reference."""
    assert both_ways(VARIETY)
    assert both_ways(VARIETY.replace("\n", "\r\n"))
    assert both_ways(VARIETY.rstrip("\n"))  # no newline at the end


@pytest.mark.parametrize("text", [
    "",
    "\n\n# only a comment\n",
    "# a comment without a newline",
    "$x -> $x",
    "\\\ncall_function f($x) -> $x\n",
    "example: call_function torch.relu($x) given $x: [2]\n",  # an example with no rule above it
    "rule r:\n    call_function f(a=1, $x) -> $x\n",  # a positional argument after a keyword
    "rule r:\n    call_function f(" + "9" * 5000 + ") -> $x\n",  # too many digits
    "rule r:\n    call_function f(\"\\d\") -> $x\n",  # an invalid escape
    "rule r:\n    call_function f($x) ->\n",  # a syntax error
    "rule r:\n    call_function f($x) -> $x ~\n",  # a character no terminal takes
    "example: call_function f($x) given $x: [" + "9" * 5000 + "]\n",  # too many digits in a shape
    "$x -> $x\nexample " + "9" * 5000 + ": call_function f($x) given $x: [2]\n",  # ... in a count
    "rule r:\n    call_function f($x) where $x.ndim == " + "9" * 5000 + " -> $x\n",  # ... in a condition
    "rule r:\n    call_function f($x) -> call_function g($x, -" + "9" * 5000 + ")\n",  # ... negative
    "rule r:\n    call_function f(" + "9" * 4000 + ", 0x" + "f" * 5000 + ") -> $x\n",  # just within; hex: no limit
    "$x -> $x\nexample 0x" + "f" * 5000 + ": call_function f($x) given $x: [0x" + "f" * 5000 + "]\n",
])
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
def test_edge_cases(text: str):
    """Where Lark's loop fails, it is with a RuleFileError (a located diagnostic), never
    another exception, and the direct loop gives up or reports the same."""
    src = Source("<edge>", text)
    try:
        parser.parse_lark(src)
    except RuleFileError as exc:
        assert all(d.path == "<edge>" and d.line >= 1 and d.column >= 1 for d in exc.diagnostics)
        assert not both_ways(text, "<edge>")
        with pytest.raises(RuleFileError):
            fxrules.parse_rules(text)
        return
    assert both_ways(text, "<edge>")


@pytest.mark.parametrize("text", [
    "call_function f(" + "1" * 700 + ") -> $x\n",
    "$x -> $x\nexample " + "1" * 700 + ": call_function f($x) given $x: [2]\n",
    "$x -> $x\nexample: call_function f($x) given $x: [" + "1" * 700 + "]\n",
])
def test_a_lower_python_digit_limit_is_the_limit(text: str):
    """Python's int/str limit can be lowered (to 640 at least): both paths keep to it."""
    import sys

    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        src = Source("<low>", text)
        for parse in (parser.parse_lark, parser.parse_direct):
            with pytest.raises(RuleFileError) as info:
                parse(src)
            (d,) = info.value.diagnostics
            assert d.code == "unexpected-token" and "the limit is 640" in d.message
    finally:
        sys.set_int_max_str_digits(before)
    assert both_ways(text)  # within the default limit


@pytest.mark.parametrize("condition", [
    "not " * 300 + "a",
    " + ".join(["a"] * 300),
    "a" + ".b" * 300,
    _nest("({})", "a", 300),
])
def test_limits_are_the_reference_s(condition: str):
    text = f"$x where {condition} -> $x\n"
    with pytest.raises(parser.NotDirect):
        parser.parse_direct(Source("<deep>", text))
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules(text)
    assert [d.code for d in info.value.diagnostics] == ["too-deep"]


def test_just_within_the_limits():
    operators = " + ".join(["a"] * (parser.MAX_CONDITION_OPERATORS // 2 + 1))  # PLUS and nothing else counted
    assert both_ways(f"$x where {operators} -> $x\n")
    deep = _nest("call_function f({})", "$x", parser.MAX_DEPTH - 1)
    assert both_ways(f"call_function g({deep}) -> $x\n")
    with pytest.raises(parser.NotDirect):
        parser.parse_direct(Source("<deep>", f"call_function g(call_function h({deep})) -> $x\n"))


@settings(max_examples=300, deadline=None)
@given(grammar_texts)
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
@pytest.mark.slow
def test_grammar_strings(text: str):
    both_ways(text)


@settings(max_examples=300, deadline=None)
@given(token_soup)
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
def test_token_soup(text: str):
    both_ways(text)


@settings(deadline=None)
@given(st.text())
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
def test_arbitrary_text(text: str):
    both_ways(text)


def _reference_tokens(text: str) -> tuple[list, int]:
    """The reference lexer's alternation, token by token: (terminal, start, end)s and where it stopped."""
    master = parser._get_parser().parser.lexer.master
    tokens, pos = [], 0
    while pos < len(text):
        m = master.match(text, pos)
        if m is None:
            break
        tokens.append((m.lastgroup, m.start(), m.end()))
        pos = m.end()
    return tokens, pos


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), token_soup, grammar_texts))
def test_the_scanner_tokenizes_as_the_lexer(text: str):
    """Trying NAME and WS first (and `_UNLEXABLE` last) changes no token (see parser._SCAN_FIRST)."""
    ours = [(m.lastgroup, m.start(), m.end()) for m in parser.tables().scanner.finditer(text)]
    theirs, stopped = _reference_tokens(text)
    assert ours[:len(theirs)] == theirs
    if stopped < len(text):
        assert ours[len(theirs)] == ("_UNLEXABLE", stopped, stopped + 1)


def test_keywords_by_parser_state():
    """Words that are keywords elsewhere stay names where the parser does not accept the keyword."""
    text = ("rule where [exact]:\n    call_method where(call_function torch.where($x, $y, default=$z)) as rule\n"
            "    where rule.default -> call_function torch.where($x, $y, $z)\n")
    assert both_ways(text)


def test_the_front_end_takes_the_direct_path(monkeypatch):
    def no_lark(source):
        raise AssertionError("Lark's loop was taken")

    monkeypatch.setattr(parser, "parse_lark", no_lark)
    rules = fxrules.parse_rules("rule r:\n    call_function torch.relu(call_function torch.relu($x)) -> $x\n")
    assert rules.names == ["r"]
    with pytest.raises(RuleFileError) as info:  # a problem the reductions find: no second parse either
        fxrules.parse_rules("rule r:\n    call_function f(a=1, $x) -> $x\n", "k.fxr")
    assert [(d.code, d.line, d.column) for d in info.value.diagnostics] == [("unexpected-token", 2, 26)]


def test_the_front_end_reports_syntax_errors_through_lark(monkeypatch):
    calls = []
    real = parser.parse_lark

    def spy(source):
        calls.append(source.path)
        return real(source)

    monkeypatch.setattr(parser, "parse_lark", spy)
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules("rule r:\n    call_function f($x -> $x\n", "k.fxr")
    assert calls == ["k.fxr"]
    assert [d.code for d in info.value.diagnostics] == ["unexpected-token"]


def test_the_first_problem_in_the_text_is_reported_and_a_syntax_error_wins():
    """The reductions record problems and go on; the first in the text is reported (at one
    position, a misplaced argument before a bad literal in it), and only if the text parses."""
    big = "9" * 5000
    cases = {
        f'call_function f("\\d", {big}) -> $x\n': (1, 17, "invalid escape"),
        f'call_function f({big}, "\\d") -> $x\n': (1, 17, "digits"),
        f"call_function f(a=1, {big}) -> $x\n": (1, 22, "positional"),
        f"call_function f(a=1, -{big}) -> $x\n": (1, 22, "positional"),
        f"call_function f({big}) -> $x\ncall_function f($x ->\n": (2, 20, "expected"),
    }
    for text, (line, column, words) in cases.items():
        for parse in (parser.parse, parser.parse_lark):
            with pytest.raises(RuleFileError) as info:
                parse(Source("<p>", text))
            (d,) = info.value.diagnostics
            assert (d.line, d.column) == (line, column) and words in d.message, (text[:40], d)


def test_rules_are_numbered_by_the_checker_across_files(tmp_path):
    (tmp_path / "a.fxr").write_text("rule a:\n    call_function torch.relu($x) -> $x\n"
                                    "rule b:\n    call_function torch.neg($x) -> $x\n")
    (tmp_path / "b.fxr").write_text("rule c:\n    call_function torch.abs($x) -> $x\n")
    rules = fxrules.load_rules(tmp_path)
    assert [(r.name, r.index) for r in rules] == [("a", 0), ("b", 1), ("c", 2)]
    assert [(r.name, r.index) for r in rules.select(names=["c", "a"])] == [("a", 0), ("c", 1)]


def test_reductions_cover_the_grammar():
    """Every grammar rule has its reduction (or hands its child up), so a new rule in the grammar
    fails here rather than silently sending every file down the reference path."""
    lark_parser = parser._get_parser()
    for rule in lark_parser.rules:
        reductions.reduction(rule)  # raises AttributeError for a tree name without its r_ method
    names = {str(rule.alias or rule.origin.name) for rule in lark_parser.rules}
    methods = {name[2:] for name in vars(reductions.Reductions) if name.startswith("r_")}
    assert methods - names == {"literal_condition"}


def test_nothing_in_a_rule_file_is_evaluated(monkeypatch):
    """Strings are the only literals read with ``ast.literal_eval``; names stay names."""
    calls = []
    real = reductions._literal_value

    def spy(literal):
        calls.append(literal)
        return real(literal)

    monkeypatch.setattr(reductions, "_literal_value", spy)
    text = 'rule r "d":\n    call_function os.system("rm", __import__) -> $x\n'
    rule_file = parser.parse_direct(Source("<e>", text))
    assert calls == ['"d"', '"rm"']
    assert parser.parse_lark(Source("<e>", text)) == rule_file
    assert calls == ['"d"', '"rm"'] * 2
    call = rule_file.rules[0].patterns[0]
    assert call.args[1] == A.Name(A.Dotted(("__import__",)))
    assert re.fullmatch(r"[\w.]+", call.target.text)


@pytest.mark.slow
def test_lark_is_imported_only_when_its_loop_runs():
    """Cold start (issue 17): loading the library and applying it, and `fxrules check`, parse on the
    shipped tables with the direct loop and import no Lark (40-60 ms); a syntax error, which Lark's
    loop words, imports it then and gets the same located diagnostic as ever."""
    import subprocess
    import sys

    script = (
        "import sys, torch, fxrules\n"
        "from fxrules import zoo\n"
        "from fxrules.tools.cli import main\n"
        "out = fxrules.apply_rules(zoo.mlp(), fxrules.LIBRARY / 'cleanup')\n"
        "assert main(['check', '-q', str(fxrules.LIBRARY)]) == 0\n"
        "print('lark' in sys.modules)\n"
        "from fxrules.errors import RuleFileError\n"
        "try:\n"
        "    fxrules.parse_rules('rule broken [exact]: call_function torch.relu($x -> $x\\n')\n"
        "except RuleFileError as exc:\n"
        "    print(exc.diagnostics[0].code, exc.diagnostics[0].line, 'lark' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False", "unexpected-token 1 True"], out.stdout
