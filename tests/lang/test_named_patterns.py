"""Named patterns (issue 19): syntax, printing, checking, expansion and `use "FILE"`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fxrules
import fxrules.lang.ast as A
from fxrules.errors import RuleFileError
from fxrules.lang.check import named as N
from fxrules.lang.load import parse_source
from fxrules.lang.printer import print_file
from fxrules.lang.source import Source
from tests.lang.test_parse_speed import both_ways

TEXT = '''use torch.nn.functional as Fn
use "lib/ops.fxr"

pattern matmul($a, $b) = call_function torch.matmul($a, $b) | call_method matmul($a, $b)
pattern none() = call_function torch.relu
pattern mm2($x, $y,) = (matmul($x, $y) | call_function operator.matmul($x, $y))

rule r [changes]:
    call_function Fn.softmax(matmul($q, call_method transpose($k, -2, -1)) as s, -1)
    -> call_function torch.sigmoid(s)
'''


def parsed(text: str, path: str = "<t>") -> A.RuleFile:
    return parse_source(Source(path, text))


def codes(error: RuleFileError) -> list:
    return [(d.code, d.line, d.column) for d in error.diagnostics]


def test_both_parse_loops_make_the_same_ast():
    assert both_ways(TEXT)


def test_the_ast_of_definitions_uses_and_files():
    items = parsed(TEXT).items
    assert items[1] == A.UseFile("lib/ops.fxr")
    definition = items[2]
    assert isinstance(definition, A.PatternDef) and definition.params == ("a", "b")
    assert isinstance(definition.body, A.Alt) and len(definition.body.options) == 2
    assert items[3].params == () and items[4].params == ("x", "y")
    use = items[5].patterns[0].args[0].expr
    assert isinstance(use, A.PatternUse) and use.name == "matmul" and len(use.args) == 2


def test_printing_round_trips_and_is_idempotent():
    file = parsed(TEXT)
    text = print_file(file)
    assert parsed(text) == file
    assert print_file(parsed(text)) == text
    assert 'use "lib/ops.fxr"' in text and "pattern matmul($a, $b) = (call_function" in text


def test_a_long_body_is_wrapped_inside_its_parentheses():
    options = " | ".join(f"call_function torch.{f}($x)" for f in ("relu", "sigmoid", "tanh", "exp", "log", "neg"))
    file = parsed(f"pattern act($x) = {options}\n")
    text = print_file(file)
    assert all(len(line) <= 100 for line in text.splitlines()) and text.count("\n") > 1
    assert parsed(text) == file


def test_syntax_error_after_pattern_is_worded():
    with pytest.raises(RuleFileError) as info:
        parsed("pattern ($x) = call_function torch.relu($x)\n")
    assert "after `pattern`" in info.value.diagnostics[0].message


# ---------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------


def rule_set(text: str):
    return fxrules.parse_rules(text)


def test_an_argument_for_a_repeated_parameter_is_written_once_and_referenced():
    rules = rule_set("pattern square($x) = call_function operator.mul($x, $x)\n"
                     "rule r [changes]:\n    square(call_function torch.relu($y)) -> $y\n")
    (root,) = rules["r"].pattern_roots
    first, second = root.args
    assert isinstance(first, A.Bind) and N.HIDDEN in first.name
    assert second == A.Name(A.Dotted((first.name,)))


def test_each_use_has_hidden_names_of_its_own():
    rules = rule_set("pattern square($x) = call_function operator.mul($x, $x)\n"
                     "pattern quad($x) = square(square($x))\n"
                     "rule r [changes]:\n"
                     "    call_function torch.add(quad(call_function torch.relu($y)), quad(call_function torch.exp($y)))"
                     " -> $y\n")
    names = []
    stack = list(rules["r"].pattern_roots)
    while stack:
        expr = stack.pop()
        if isinstance(expr, A.Bind):
            names.append(expr.name)
        stack.extend(N._children(expr))
    assert len(names) == len(set(names)) == 4


def test_a_capture_argument_is_substituted_in_every_place():
    rules = rule_set("pattern square($x) = call_function operator.mul($x, $x)\n"
                     "rule r [changes]:\n    square($y) -> $y\n")
    assert rules["r"].pattern_roots[0].args == (A.Capture("y"), A.Capture("y"))


def test_body_names_are_absolute_so_they_mean_the_same_in_every_file():
    rules = rule_set("use torch.nn.functional as G\n"
                     "pattern act($x) = call_function G.gelu($x) | call_module GELU($x) | call_function abs($x)\n"
                     "rule r [changes]:\n    act($x) -> $x\n")
    targets = [o.target.text for o in rules["r"].pattern_roots[0].options]
    assert targets == ["torch.nn.functional.gelu", "torch.nn.GELU", "builtins.abs"]


def test_an_alias_hiding_a_body_module_is_an_error(tmp_path: Path):
    (tmp_path / "ops.fxr").write_text("pattern act($x) = call_function torch.relu($x)\n")
    main = tmp_path / "main.fxr"
    main.write_text('use "ops.fxr"\nuse torch.nn as torch\nact($x) -> $x\n')
    with pytest.raises(RuleFileError) as info:
        fxrules.load_rules(main)
    assert codes(info.value) == [("bad-pattern", 3, 1)]


def test_expansion_that_would_be_too_large_is_refused_before_it_is_made():
    lines = ["pattern p0($x) = call_function torch.relu($x) | call_function torch.exp($x)"]
    for i in range(1, 20):
        lines.append(f"pattern p{i}($x) = p{i - 1}(p{i - 1}($x))")
    with pytest.raises(RuleFileError) as info:
        rule_set("\n".join(lines) + "\n")
    found = [d.code for d in info.value.diagnostics]
    assert found[0] == "too-large" and set(found) == {"too-large", "unknown-pattern"}  # later ones build on it


def test_a_pattern_cannot_use_itself():
    with pytest.raises(RuleFileError) as info:
        rule_set("pattern p($x) = call_function torch.relu(p($x))\n")
    assert codes(info.value) == [("unknown-pattern", 1, 42)]


def test_an_ellipsis_in_a_body_counts_at_the_use():
    with pytest.raises(RuleFileError) as info:
        rule_set("pattern lin($x) = call_function torch.nn.functional.linear($x, ...)\n"
                 "rule r [changes]:\n    call_function torch.add(lin($x), call_function torch.relu($y, ...))"
                 " -> call_function torch.relu($x, ...)\n")
    assert [d.code for d in info.value.diagnostics] == ["ellipsis-misuse"]


# ---------------------------------------------------------------------------
# use "FILE"
# ---------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_use_reads_the_definitions_of_a_file_below(tmp_path: Path):
    write(tmp_path / "lib" / "ops.fxr", "pattern act($x) = call_function torch.relu($x)\n"
                                        "call_function torch.exp($x) -> $x\n")
    main = write(tmp_path / "main.fxr", 'use "lib/ops.fxr"\nrule r [changes]:\n    act($x) -> $x\n')
    rules = fxrules.load_rules(main)
    assert rules.names == ["r"]  # the used file's rules are not loaded


@pytest.mark.parametrize("written", ["/etc/passwd.fxr", "../x.fxr", "lib/../x.fxr", "./x.fxr", "x.txt",
                                     "lib\\\\x.fxr", "lib//x.fxr"])
def test_use_refuses_paths_that_leave_the_directory(tmp_path: Path, written: str):
    write(tmp_path / "x.fxr", "pattern act($x) = call_function torch.relu($x)\n")
    main = write(tmp_path / "sub" / "main.fxr", f'use "{written}"\n')
    with pytest.raises(RuleFileError) as info:
        fxrules.load_rules(main)
    assert codes(info.value) == [("bad-use", 1, 1)]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links")
def test_use_refuses_a_symbolic_link_out_of_the_directory(tmp_path: Path):
    outside = write(tmp_path / "outside.fxr", "pattern act($x) = call_function torch.relu($x)\n")
    (tmp_path / "sub").mkdir()
    os.symlink(outside, tmp_path / "sub" / "link.fxr")
    main = write(tmp_path / "sub" / "main.fxr", 'use "link.fxr"\n')
    with pytest.raises(RuleFileError) as info:
        fxrules.load_rules(main)
    assert codes(info.value) == [("bad-use", 1, 1)]
    assert "out of this file's directory" in info.value.diagnostics[0].message


def test_a_cycle_of_uses_is_reported(tmp_path: Path):
    write(tmp_path / "a.fxr", 'use "b.fxr"\npattern pa($x) = call_function torch.relu($x)\n')
    write(tmp_path / "b.fxr", 'use "a.fxr"\npattern pb($x) = call_function torch.exp($x)\n')
    with pytest.raises(RuleFileError) as info:
        fxrules.load_rules(tmp_path / "a.fxr")
    assert codes(info.value) == [("bad-use", 1, 1)]


def test_errors_in_a_used_file_are_reported_at_the_use(tmp_path: Path):
    write(tmp_path / "ops.fxr", "pattern act($x) = call_function torch.nope($x)\n")
    main = write(tmp_path / "main.fxr", 'use "ops.fxr"\n')
    with pytest.raises(RuleFileError) as info:
        fxrules.load_rules(main)
    assert codes(info.value) == [("bad-use", 1, 1)]
    assert "unknown-target" in info.value.diagnostics[0].notes[0]


def test_a_file_read_from_text_cannot_use_files():
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules('use "ops.fxr"\n')
    assert codes(info.value) == [("bad-use", 1, 1)]
