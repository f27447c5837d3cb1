"""Tests of ``fxrules fmt`` (fxrules/tools/fmt.py): canonical layout through the printer, every comment kept.

* exact outputs for the comment rules (gaps, trailing comments, comment lines inside a
  rule, items left as written, blank lines the printer asks for);
* the corpora (tests/corpus/pass, rules/, and the fail corpus's files that parse):
  the formatted file parses to the same AST, keeps every comment, and formats to itself;
* the same properties on Hypothesis variations of the corpora (comments, blank lines and
  spacing sprinkled in) and on random ASTs printed and commented;
* the command through a subprocess: in-place rewrite, --check, --diff, standard input,
  files with errors left untouched, exit codes, atomic writes keeping permissions and links.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import fxrules.tools.fmt as fmt
from fxrules.errors import RuleFileError
from fxrules.lang.load import parse_source
from fxrules.lang.source import Source
from tests.lang.test_parser_fuzz import grammar_texts
from tests.lang.test_printer import rule_files

ROOT = Path(__file__).resolve().parents[2]
PASS = sorted([*ROOT.glob("tests/corpus/pass/**/*.fxr"), *ROOT.glob("rules/**/*.fxr")])
FAIL = sorted(ROOT.glob("tests/corpus/fail/**/*.fxr"))


def ast_of(text: str, path: str = "<t>"):
    return parse_source(Source(path, text)).items


def assert_formats_safely(text: str) -> str:
    """Format, then check the promises: same rules, same comments in order, idempotent."""
    out = fmt.format_text(text, "<t>")
    assert ast_of(out) == ast_of(text), out
    assert fmt.comments(out) == fmt.comments(text)
    assert fmt.format_text(out, "<t>") == out, out
    assert out == "" or (out.endswith("\n") and not out.endswith("\n\n") and not out.startswith("\n"))
    return out


# ---------------------------------------------------------------------------
# Exact outputs
# ---------------------------------------------------------------------------


def test_layout_without_comments_is_the_printers() -> None:
    source = (
        "use   torch.nn.functional   as F\n"
        "rule   r1 'desc' [approx] :\n"
        "  call_function f( $x ,k = 1 ) where $x.ndim==2 -> $x\n"
        "call_method relu->call_function torch.relu\n"
    )
    assert fmt.format_text(source) == (
        "use torch.nn.functional as F\n"
        "\n"
        'rule r1 "desc" [approx]:\n'
        "    call_function f($x, k=1)\n"
        "    where $x.ndim == 2\n"
        "    -> $x\n"
        "\n"
        "call_method relu -> call_function torch.relu\n"
    )


def test_comments_between_items_stay_in_place() -> None:
    source = (
        "\n\n# header\n"
        "#   second header line   \n"
        "\n\n\n"
        "use torch.nn.functional as F\n"
        "# about the next rule\n"
        "call_module Dropout ->   call_module Identity\n"
        "rule r:\n"
        "    $x -> $x\n"
        "    # indented under r: stays with r\n"
        "# about s (not indented): goes with s\n"
        "rule s: call_function f($x) -> $x\n"
        "\n\n# trailing comment of the file\n\n\n"
    )
    assert fmt.format_text(source) == (
        "# header\n"
        "#   second header line\n"
        "\n"
        "use torch.nn.functional as F\n"
        "# about the next rule\n"
        "call_module Dropout -> call_module Identity\n"
        "\n"  # the printer puts a blank line before a named rule
        "rule r:\n"
        "    $x\n"
        "    -> $x\n"
        "    # indented under r: stays with r\n"
        "\n"
        "# about s (not indented): goes with s\n"
        "rule s:\n"
        "    call_function f($x)\n"
        "    -> $x\n"
        "\n"
        "# trailing comment of the file\n"
    )


def test_trailing_comments_reattach_to_the_same_line() -> None:
    source = (
        "use torch.nn.functional    as F        # an alias\n"
        "                                       # aligned under it\n"
        "call_module Linear  ->  call_module Identity  # any Linear\n"
        'call_function f("a # not a comment", "# nor this") -> $x # but this is\n'
        "call_function f($x,$y,$z)->$x # grown\n"
        "call_function f('quoted') -> $x  # the printer requotes: this line stays as written\n"
    )
    assert fmt.format_text(source) == (
        "use torch.nn.functional as F           # an alias\n"  # the column is kept
        "                                       # aligned under it\n"
        "call_module Linear -> call_module Identity    # any Linear\n"
        'call_function f("a # not a comment", "# nor this") -> $x  # but this is\n'  
        "call_function f($x, $y, $z) -> $x  # grown\n"  # two spaces when the code grew past the comment
        "call_function f('quoted') -> $x  # the printer requotes: this line stays as written\n"
    )


def test_comments_inside_a_canonical_rule_stay_on_their_lines() -> None:
    source = (
        "rule r [exact]:   # header comment\n"
        "  # about the pattern\n"
        "      call_module Dropout($x)   as d     # the pattern\n"
        "\n"
        "  where not d.training\n"
        "# about the replacement\n"
        "    -> $x  # the replacement\n"
    )
    assert fmt.format_text(source) == (
        "rule r [exact]:   # header comment\n"
        "    # about the pattern\n"
        "    call_module Dropout($x) as d         # the pattern\n"  # at the column it was written at
        "    where not d.training\n"
        "    # about the replacement\n"
        "    -> $x  # the replacement\n"
    )


def test_a_rule_whose_lines_change_keeps_its_comments_by_staying_as_written() -> None:
    rule = (
        "rule mul_one:\n"
        "    call_function operator.mul($x, 1) -> $x   # literal arguments match by value   \n"
        "rule spread:\n"
        "    (call_function f($x)   # the first spelling\n"
        "     | call_method f($x))\n"
        "    -> $x\n"
    )
    out = assert_formats_safely(rule)
    assert out == (
        "rule mul_one:\n"
        "    call_function operator.mul($x, 1) -> $x   # literal arguments match by value\n"
        "\n"
        "rule spread:\n"
        "    (call_function f($x)   # the first spelling\n"
        "     | call_method f($x))\n"
        "    -> $x\n"
    )


@pytest.mark.parametrize("text, expected", [
    # an item kept as written (a comment inside) that ends in a continuation: the continuation goes
    ("[ a ] $a as a \n# a comment\n -> $a \\\n \n ", "[ a ] $a as a\n# a comment\n -> $a\n"),
    # a line holding only a continuation is no part of an item
    ("default [ a ] \n# a comment\n \\\n ", "default [a]\n# a comment\n"),
    ("use a as b # c\n\\\nuse c as d\n", "use a as b  # c\nuse c as d\n"),
    # a continuation inside an item with a comment: the lines differ from the printer's, kept as written
    ("rule r: $x \\\n  -> $x  # c\n", "rule r: $x \\\n  -> $x  # c\n"),
])
def test_line_continuations(text: str, expected: str) -> None:
    assert assert_formats_safely(text) == expected


def test_empty_and_comment_only_files() -> None:
    assert fmt.format_text("") == ""
    assert fmt.format_text("\n\n  \n") == ""
    assert fmt.format_text("\n# only a comment   \n\n") == "# only a comment\n"


def test_line_endings_and_byte_order_mark() -> None:
    assert fmt.format_text("use a.b as c\r\n# note\r\ncall_method relu -> $x\r\n") == (
        "use a.b as c\n# note\ncall_method relu -> $x\n"
    )
    assert fmt.format_text("use a.b as c") == "use a.b as c\n"  # a final newline is added


def test_rules_with_examples_are_printed_through_the_printer() -> None:
    source = (
        "# examples stay with their rule\n"
        "rule remove_dropout [exact]:\n"
        "    call_module Dropout($x) as d where not d.training -> $x\n"
        "    example:   call_module Dropout{p=0.5}(call_function torch.relu($x)) given $x:[2,8]\n"
        "    example 2: call_module Dropout{p=0.1}(call_module Dropout{p=0.2}($x))   given $x: float64[2, 8]\n"
        "    example 0 train: call_module Dropout{p=0.5}(\n"
        "        $x,\n"
        "    ) given $x: [2, 8]\n"
        "[exact] call_function torch.add($x, get_attr $b) where is_zero($b) -> $x\n"
        "    example 0 : call_function torch.add($x, get_attr $b) given $x: [2, 8], $b: [8] = 0.5\n"
    )
    out = assert_formats_safely(source)
    assert out == (
        "# examples stay with their rule\n"
        "rule remove_dropout [exact]:\n"
        "    call_module Dropout($x) as d\n"
        "    where not d.training\n"
        "    -> $x\n"
        "    example: call_module Dropout{p=0.5}(call_function torch.relu($x)) given $x: [2, 8]\n"
        "    example 2: call_module Dropout{p=0.1}(call_module Dropout{p=0.2}($x)) given $x: float64[2, 8]\n"
        "    example 0 train: call_module Dropout{p=0.5}($x) given $x: [2, 8]\n"
        "\n"
        "[exact] call_function torch.add($x, get_attr $b) where is_zero($b) -> $x\n"
        "    example 0: call_function torch.add($x, get_attr $b) given $x: [2, 8], $b: [8] = 0.5\n"
    )
    (rule, _) = ast_of(out)
    assert [e.count for e in rule.examples] == [None, 2, 0]


def test_syntax_errors_are_refused_with_a_location() -> None:
    with pytest.raises(RuleFileError) as info:
        fmt.format_text("use a.b as c\nrule r:\n    call_function f($x -> $x\n", "bad.fxr")
    assert info.value.diagnostics[0].location.startswith("bad.fxr:3:")


def test_a_printer_bug_is_caught_before_anything_is_written(monkeypatch) -> None:
    # Simulate a printer that drops a condition: the check against the parsed AST refuses.
    real = fmt.print_item

    def lossy(item):
        return real(item).replace("\n    where not d.training", "")

    monkeypatch.setattr(fmt, "print_item", lossy)
    with pytest.raises(fmt.FormatError, match="would change the rules"):
        fmt.format_text("rule r:\n    call_module Dropout($x) as d\n    where not d.training\n    -> $x\n")


# ---------------------------------------------------------------------------
# The corpora
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", PASS, ids=lambda p: str(p.relative_to(ROOT)))
def test_corpus_formats_safely(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    out = assert_formats_safely(text)
    assert len(fmt.comments(out)) == len(fmt.comments(text))


@pytest.mark.parametrize("path", FAIL, ids=lambda p: p.name)
@pytest.mark.slow
def test_fail_corpus_is_refused_or_formats_safely(path: Path) -> None:
    data = path.read_bytes()
    try:
        source = Source(str(path), data.decode("utf-8"))
        parse_source(source)
    except (UnicodeDecodeError, RuleFileError):
        with pytest.raises((RuleFileError, UnicodeDecodeError)):
            fmt.format_text(data.decode("utf-8"), str(path))
        return
    assert_formats_safely(source.text)  # only checker errors: the file is still formatted losslessly


# ---------------------------------------------------------------------------
# Hypothesis: corpora with comments, blank lines and spacing sprinkled in
# ---------------------------------------------------------------------------

comment_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                       max_size=12).map(lambda t: "#" + t)
spaces = st.text(" \t", max_size=6)


@st.composite
def sprinkled(draw, text: str) -> str:
    """``text`` with comment lines, trailing comments, blank lines and spaces added at random."""
    out: list[str] = []
    for line in text.split("\n"):
        if draw(st.integers(0, 5)) == 0:
            out.append(draw(spaces) + draw(comment_text))
        if draw(st.integers(0, 6)) == 0:
            out.append(draw(spaces))
        line = draw(spaces) + line if line.strip() and draw(st.booleans()) else line
        if line.strip() and not line.rstrip().endswith("\\") and draw(st.integers(0, 3)) == 0:
            line = line + draw(spaces) + " " + draw(comment_text)
        out.append(line + (draw(spaces) if draw(st.integers(0, 4)) == 0 else ""))
    return "\n".join(out)


CORPUS_TEXTS = [p.read_text(encoding="utf-8") for p in PASS]


@settings(max_examples=max(10, settings().max_examples * 3 // 5))  # 60 under the ci profile
@given(st.data())
@pytest.mark.slow
def test_sprinkled_corpus_formats_safely(data) -> None:
    text = data.draw(st.sampled_from(CORPUS_TEXTS))
    varied = data.draw(sprinkled(text))
    try:
        ast_of(varied)
    except RuleFileError:
        assume(False)  # e.g. a comment after a line continuation
    assert ast_of(varied) == ast_of(text)
    out = assert_formats_safely(varied)
    assert len(fmt.comments(out)) == len(fmt.comments(varied))


@settings(max_examples=max(10, settings().max_examples * 3 // 5))  # 60 under the ci profile
@given(rule_files, st.data())
def test_random_files_with_comments_format_safely(rule_file, data) -> None:
    from fxrules.lang.printer import print_file

    text = print_file(rule_file)
    varied = data.draw(sprinkled(text))
    assert_formats_safely(varied)
    if not fmt.comments(varied):  # no comments: the printer's lines (blank lines between items may be kept)
        assert [line for line in fmt.format_text(varied).split("\n") if line] == \
            [line for line in text.split("\n") if line]


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

UGLY = "# keep me\nuse   torch.nn.functional as F\nrule r:   call_module Dropout($x)->$x\n"
PRETTY = "# keep me\nuse torch.nn.functional as F\n\nrule r:\n    call_module Dropout($x)\n    -> $x\n"
BROKEN = "# keep me too\nrule r:\n    call_module Dropout($x -> $x\n"


def fxrules(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fxrules", *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.slow
def test_cli_fmt(tmp_path: Path) -> None:
    ugly, pretty, broken = tmp_path / "ugly.fxr", tmp_path / "pretty.fxr", tmp_path / "sub" / "broken.fxr"
    broken.parent.mkdir()
    ugly.write_text(UGLY)
    pretty.write_text(PRETTY)
    broken.write_text(BROKEN)
    os.chmod(ugly, 0o640)
    real, link, binary = tmp_path / "real.fxr", tmp_path / "link.fxr", tmp_path / "bin.fxr"
    real.write_text(UGLY)
    link.symlink_to(real)
    binary.write_bytes(b"rule r:\x00\n")
    before = broken.stat().st_mtime_ns

    # --check: reports, writes nothing, exit 1
    r = fxrules("fmt", "--check", "ugly.fxr", "pretty.fxr", cwd=tmp_path)
    assert r.returncode == 1, r
    assert "would reformat ugly.fxr" in r.stderr and "pretty.fxr" not in r.stderr.replace("files", "")
    assert r.stdout == ""
    assert ugly.read_text() == UGLY

    # --diff: a unified diff on stdout, nothing written
    r = fxrules("fmt", "--diff", "ugly.fxr", cwd=tmp_path)
    assert r.returncode == 1
    assert "--- ugly.fxr\n+++ ugly.fxr (formatted)\n" in r.stdout
    assert "-rule r:   call_module Dropout($x)->$x\n" in r.stdout and "+    -> $x\n" in r.stdout
    assert ugly.read_text() == UGLY

    # a directory: every *.fxr under it; the broken file is refused with a located error and untouched
    r = fxrules("fmt", ".", cwd=tmp_path)
    assert r.returncode == 1, r
    assert "bin.fxr:1:8: error[binary-input]" in r.stderr
    assert binary.read_bytes() == b"rule r:\x00\n"
    assert link.is_symlink() and real.read_text() == PRETTY  # written through the link, which stays
    assert "sub/broken.fxr:3:" in r.stderr and "error[" in r.stderr
    assert "sub/broken.fxr: not formatted: it has errors" in r.stderr
    assert "reformatted ugly.fxr" in r.stderr
    assert "Traceback" not in r.stderr
    assert ugly.read_text() == PRETTY
    assert stat.S_IMODE(ugly.stat().st_mode) == 0o640  # permissions kept by the atomic replace
    assert broken.read_text() == BROKEN and broken.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bin.fxr", "broken.fxr", "link.fxr", "pretty.fxr",
                                                          "real.fxr", "sub", "ugly.fxr"]  # no temporary files left

    # idempotent through the command: a second run and --check find nothing to do
    r = fxrules("fmt", "--check", "ugly.fxr", "pretty.fxr", cwd=tmp_path)
    assert r.returncode == 0, r
    assert "2 files already formatted" in r.stderr

    # a missing path is a usage error
    r = fxrules("fmt", "nope.fxr", cwd=tmp_path)
    assert r.returncode == 2 and "nope.fxr: error[io-error]" in r.stderr


@pytest.mark.slow
def test_cli_fmt_stdin(tmp_path: Path) -> None:
    r = fxrules("fmt", "-", cwd=tmp_path, stdin=UGLY)
    assert r.returncode == 0 and r.stdout == PRETTY
    r = fxrules("fmt", "-", cwd=tmp_path, stdin=BROKEN)
    assert r.returncode == 1 and r.stdout == "" and "<stdin>:3:" in r.stderr


@pytest.mark.filterwarnings("ignore:invalid escape sequence")  # "\d" in a string literal
@settings(max_examples=max(10, settings().max_examples * 3 // 5))
@given(grammar_texts)
@pytest.mark.slow
def test_grammar_generated_texts_format_safely(text: str) -> None:
    """Texts drawn from the grammar itself (line continuations, CRLF, comments in newlines...)."""
    try:
        ast_of(text)
    except RuleFileError:
        with pytest.raises(RuleFileError):
            fmt.format_text(text, "<t>")
        return
    assert_formats_safely(text)
