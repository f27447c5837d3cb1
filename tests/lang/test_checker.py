"""Checker behaviour through the public API: diagnostics, contracts, names, RuleSet, loading.

The corpus (tests/lang/test_corpus.py) pins which code lands where for one mistake per
file; these tests pin everything around it: the exact rendering users see, the
effective contract of each rule, rule naming, the RuleSet API, what ``load_rules``
reads, and that one run reports every problem it can.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from fxrules import RuleFileError, RuleSet, load_rules, parse_rules
from fxrules.errors import CODES, Diagnostic

DROPOUT = "call_module Dropout($x) -> $x\n"


def diagnostics_of(text: str, source: str = "t.fxr", **kwargs) -> list[Diagnostic]:
    with pytest.raises(RuleFileError) as info:
        parse_rules(text, source, **kwargs)
    assert type(info.value) is RuleFileError
    return list(info.value.diagnostics)


def codes(text: str) -> list[tuple[str, int, int]]:
    return [(d.code, d.line, d.column) for d in diagnostics_of(text)]


# ---------------------------------------------------------------------------
# The rendered diagnostic from the issue
# ---------------------------------------------------------------------------

ISSUE_TEXT = (
    "# Dropout is a no-op at inference time.\n"
    "rule remove_dropout:\n"
    "    call_module Dropout($x) -> $y\n"
)


def test_issue_diagnostic_fields():
    (d,) = diagnostics_of(ISSUE_TEXT, "rules/cleanup/dropout.fxr")
    assert (d.path, d.line, d.column, d.end_line, d.end_column) == ("rules/cleanup/dropout.fxr", 3, 32, 3, 34)
    assert d.code == "unbound-capture"
    assert d.severity == "error"
    assert d.message == "the replacement uses `$y`, which the pattern does not bind"
    assert d.notes == ("the pattern binds: $x",)


def test_issue_diagnostic_rendering():
    with pytest.raises(RuleFileError) as info:
        parse_rules(ISSUE_TEXT, "rules/cleanup/dropout.fxr")
    lines = str(info.value).splitlines()
    assert lines[0] == ("rules/cleanup/dropout.fxr:3:32: error[unbound-capture]: "
                        "the replacement uses `$y`, which the pattern does not bind")
    source_line = "    call_module Dropout($x) -> $y"
    assert lines[1].strip() == source_line.strip()
    assert lines[1].endswith(source_line)
    caret = lines[2]
    assert caret.strip() == "^^"
    assert caret.index("^") == lines[1].index("$y"), "the caret must stand under `$y`"
    assert lines[3] == "note: the pattern binds: $x"
    assert len(lines) == 4
    assert info.value.render() == str(info.value)


def test_issue_diagnostic_through_the_cli(tmp_path, capsys, monkeypatch):
    from fxrules.tools.cli import main

    (tmp_path / "rules" / "cleanup").mkdir(parents=True)
    (tmp_path / "rules" / "cleanup" / "dropout.fxr").write_text(ISSUE_TEXT)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "rules/cleanup/dropout.fxr"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("rules/cleanup/dropout.fxr:3:32: error[unbound-capture]: "
                      "the replacement uses `$y`, which the pattern does not bind")
    assert out[2].index("^^") == out[1].index("$y")
    assert out[3] == "note: the pattern binds: $x"


def test_rule_file_error_survives_pickling():
    with pytest.raises(RuleFileError) as info:
        parse_rules(ISSUE_TEXT, "rules/cleanup/dropout.fxr")
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.diagnostics == info.value.diagnostics
    assert str(copy) == str(info.value)


# ---------------------------------------------------------------------------
# Contracts
# ---------------------------------------------------------------------------


def test_default_contract_is_approx():
    rules = parse_rules("rule a:\n    " + DROPOUT + DROPOUT.replace("Dropout", "Dropout2d"), "f.fxr")
    assert [r.contract for r in rules] == ["approx", "approx"]


def test_default_declaration_applies_to_later_rules_only():
    text = (
        "call_module Dropout($x) -> $x\n"        # 1: before the default: approx
        "default [changes]\n"                    # 2
        "call_module Dropout2d($x) -> $x\n"      # 3: changes
        "[exact] call_module Dropout3d($x) -> $x\n"  # 4: explicit wins
        "rule named:\n"                          # 5: named rules follow the default too
        "    call_module AlphaDropout($x) -> $x\n"
        "rule explicit [approx]:\n"              # 7
        "    call_module FeatureAlphaDropout($x) -> $x\n"
        "default [exact]\n"                      # 9: a later default replaces the earlier one
        "call_module Identity($x) -> $x\n"       # 10
    )
    rules = parse_rules(text, "f.fxr")
    assert {r.name: r.contract for r in rules} == {
        "f.fxr:1": "approx",
        "f.fxr:3": "changes",
        "f.fxr:4": "exact",
        "named": "changes",
        "explicit": "approx",
        "f.fxr:10": "exact",
    }


def test_default_does_not_leak_into_another_file(tmp_path):
    (tmp_path / "a.fxr").write_text("default [changes]\n" + DROPOUT)
    (tmp_path / "b.fxr").write_text(DROPOUT.replace("Dropout", "Dropout2d"))
    rules = load_rules(tmp_path)
    assert [r.contract for r in rules] == ["changes", "approx"]


def test_explicit_exact_contract():
    rules = parse_rules("rule r [exact]:\n    " + DROPOUT, "f.fxr")
    assert rules["r"].contract == "exact"
    rules = parse_rules('rule r "with a description" [exact]:\n    ' + DROPOUT, "f.fxr")
    assert rules["r"].contract == "exact"
    assert rules["r"].description == "with a description"


def test_bad_contract_suggests_the_closest_word():
    (d,) = diagnostics_of("rule r [exakt]:\n    " + DROPOUT)
    assert d.code == "bad-contract"
    assert "did you mean `exact`?" in d.notes


# ---------------------------------------------------------------------------
# Rule names and RuleSet
# ---------------------------------------------------------------------------


def test_unnamed_rules_are_named_file_and_line():
    text = "# comment\n" + DROPOUT + "\n" + DROPOUT.replace("Dropout", "Identity")
    rules = parse_rules(text, "rules/x.fxr")
    assert rules.names == ["rules/x.fxr:2", "rules/x.fxr:4"]
    assert rules["rules/x.fxr:4"].ast.name is None


def test_ruleset_api():
    text = (
        "rule a [exact]:\n    " + DROPOUT
        + "rule b:\n    call_module Dropout2d($x) -> $x\n"
        + "rule c [changes]:\n    call_module ReLU($x) -> call_module LeakyReLU{negative_slope=0.01}($x)\n"
    )
    rules = parse_rules(text, "f.fxr")
    assert isinstance(rules, RuleSet)
    assert rules.names == ["a", "b", "c"]
    assert len(rules) == 3 and "a" in rules and "z" not in rules
    assert rules["a"].contract == "exact"
    assert rules["b"].contract == "approx"
    assert rules["c"].contract == "changes"
    assert [r.source for r in rules] == ["f.fxr:1", "f.fxr:3", "f.fxr:5"]
    assert [r.index for r in rules] == [0, 1, 2]
    assert rules.sources["f.fxr"] == text
    with pytest.raises(KeyError):
        rules["z"]

    exact_or_changes = rules.select(contracts=["exact", "changes"])
    assert exact_or_changes.names == ["a", "c"]
    assert [r.index for r in exact_or_changes] == [0, 1]
    assert rules.select(names=["c", "a"]).names == ["a", "c"]  # rule order, not argument order
    assert rules.select(names=["a", "b"], contracts=["approx"]).names == ["b"]
    assert rules.select(contracts=[]).names == []
    with pytest.raises(KeyError):
        rules.select(names=["nope"])
    with pytest.raises(ValueError):
        rules.select(contracts=["fast"])


def test_ruleset_addition():
    left = parse_rules("rule a:\n    " + DROPOUT, "left.fxr")
    right = parse_rules("rule b:\n    call_module Dropout2d($x) -> $x\n", "right.fxr")
    both = left + right
    assert both.names == ["a", "b"]
    assert [r.index for r in both] == [0, 1]
    assert set(both.sources) == {"left.fxr", "right.fxr"}
    assert left.names == ["a"] and right.names == ["b"]  # the operands are unchanged


def test_ruleset_addition_rejects_duplicate_names():
    left = parse_rules("rule a:\n    " + DROPOUT, "left.fxr")
    right = parse_rules("rule a:\n    call_module Dropout2d($x) -> $x\n", "right.fxr")
    with pytest.raises(RuleFileError) as info:
        left + right
    (d,) = info.value.diagnostics
    assert (d.code, d.path, d.line, d.column) == ("duplicate-rule", "right.fxr", 1, 6)
    assert any("left.fxr:1" in note for note in d.notes)


def test_duplicate_rule_across_files_in_one_load(tmp_path):
    (tmp_path / "a.fxr").write_text("rule same:\n    " + DROPOUT)
    (tmp_path / "b.fxr").write_text("\nrule same:\n    call_module Dropout2d($x) -> $x\n")
    with pytest.raises(RuleFileError) as info:
        load_rules(tmp_path)
    (d,) = info.value.diagnostics
    assert (d.code, Path(d.path).name, d.line, d.column) == ("duplicate-rule", "b.fxr", 2, 6)


# ---------------------------------------------------------------------------
# load_rules: files, directories, several paths, missing paths
# ---------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_load_rules_directory_is_sorted_and_recursive(tmp_path):
    _write(tmp_path / "b.fxr", "rule in_b:\n    " + DROPOUT)
    _write(tmp_path / "a" / "z.fxr", "rule in_a_z:\n    " + DROPOUT)
    _write(tmp_path / "c" / "d" / "e.fxr", "rule in_c_d_e:\n    " + DROPOUT)
    _write(tmp_path / "a" / "notes.txt", "this is not a rule file ->")
    _write(tmp_path / "a" / "rules.fxr.bak", "neither is this ->")
    rules = load_rules(tmp_path)
    assert rules.names == ["in_a_z", "in_b", "in_c_d_e"]
    assert [Path(r.source.rsplit(":", 1)[0]).name for r in rules] == ["z.fxr", "b.fxr", "e.fxr"]


def test_load_rules_several_paths_keep_their_order(tmp_path):
    one = _write(tmp_path / "one.fxr", "rule one:\n    " + DROPOUT)
    two = _write(tmp_path / "two.fxr", "rule two:\n    " + DROPOUT)
    assert load_rules(two, one).names == ["two", "one"]
    assert load_rules([one, two]).names == ["one", "two"]
    assert load_rules(os.fspath(one)).names == ["one"]
    assert load_rules(one).names == ["one"]


def test_load_rules_empty_directory(tmp_path):
    assert len(load_rules(tmp_path)) == 0


def test_load_rules_missing_path(tmp_path):
    present = _write(tmp_path / "ok.fxr", DROPOUT)
    missing = tmp_path / "missing.fxr"
    with pytest.raises(RuleFileError) as info:
        load_rules(present, missing)
    (d,) = info.value.diagnostics
    assert d.code == "io-error"
    assert d.path == os.fspath(missing)


def test_load_rules_needs_a_path():
    with pytest.raises(TypeError):
        load_rules()


def test_parse_rules_needs_text():
    with pytest.raises(TypeError):
        parse_rules(b"call_module Dropout($x) -> $x\n")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Every problem is reported, not just the first
# ---------------------------------------------------------------------------


def test_all_errors_in_a_file_are_collected():
    text = (
        "rule a:\n"
        "    call_function torch.relux($x) -> $x\n"
        "rule b:\n"
        "    call_module Dropout($x) -> $y\n"
        "rule c [fast]:\n"
        "    call_method relux($x) -> $x\n"
        "call_module Linear{in_feature=3}($x) -> $z\n"
    )
    assert codes(text) == [
        ("unknown-target", 2, 19),
        ("unbound-capture", 4, 32),
        ("bad-contract", 5, 8),
        ("unknown-method", 6, 17),
        ("unknown-attribute", 7, 20),
        ("unbound-capture", 7, 41),
    ]


def test_rules_without_errors_are_not_hidden_by_others_in_the_report():
    # the checker keeps going after an error; its report lists each rule's problems once
    text = "rule bad:\n    call_module Dropout($x) -> $y\nrule good:\n    " + DROPOUT
    assert codes(text) == [("unbound-capture", 2, 32)]


def test_a_syntax_error_does_not_stop_other_files(tmp_path):
    broken = _write(tmp_path / "a_broken.fxr", "call_module Dropout($x) $x\n")
    wrong = _write(tmp_path / "b_wrong.fxr", "rule r:\n    call_module Dropout($x) -> $y\n")
    fine = _write(tmp_path / "c_fine.fxr", "rule fine:\n    " + DROPOUT)
    with pytest.raises(RuleFileError) as info:
        load_rules(broken, wrong, fine)
    found = [(Path(d.path).name, d.code, d.line, d.column) for d in info.value.diagnostics]
    assert found == [("a_broken.fxr", "unexpected-token", 1, 25), ("b_wrong.fxr", "unbound-capture", 2, 32)]
    # every file's text is kept so each diagnostic renders its source line
    rendered = str(info.value)
    assert "call_module Dropout($x) $x" in rendered and "call_module Dropout($x) -> $y" in rendered


def test_an_unreadable_file_does_not_stop_other_files(tmp_path):
    binary = tmp_path / "a.fxr"
    binary.write_bytes(b"call_module \x00 -> $x\n")
    wrong = _write(tmp_path / "b.fxr", "call_module Dropout($x) -> $y\n")
    with pytest.raises(RuleFileError) as info:
        load_rules(binary, wrong)
    assert sorted((Path(d.path).name, d.code) for d in info.value.diagnostics) == [
        ("a.fxr", "binary-input"), ("b.fxr", "unbound-capture")]


def test_errors_are_in_file_order():
    text = "call_module Dropout($x) -> $z\ncall_function torch.relux($x) -> $x\n"
    found = diagnostics_of(text)
    assert [(d.line, d.column) for d in found] == sorted((d.line, d.column) for d in found)


# ---------------------------------------------------------------------------
# Warnings
# ---------------------------------------------------------------------------


def test_warnings_do_not_raise(monkeypatch, capsys, tmp_path):
    """No check emits a warning yet; one injected into the checker's output must not be fatal."""
    import fxrules.lang.load as frontend

    real_check_file = frontend.check_file

    def check_file_with_warning(rule_file, resolver):
        rules, diagnostics = real_check_file(rule_file, resolver)
        span = rule_file.rules[0].span
        return rules, diagnostics + [Diagnostic.at(span, "identity-rewrite", "just a warning", severity="warning")]

    monkeypatch.setattr(frontend, "check_file", check_file_with_warning)
    rules = parse_rules("rule r:\n    " + DROPOUT, "w.fxr")
    assert rules.names == ["r"]
    assert [(w.code, w.severity, w.line) for w in rules.warnings] == [("identity-rewrite", "warning", 1)]

    # a warning next to an error: the error raises, the warning is not among the errors
    with pytest.raises(RuleFileError) as info:
        parse_rules("rule r:\n    call_module Dropout($x) -> $y\n", "w.fxr")
    assert [d.severity for d in info.value.diagnostics] == ["error"]

    from fxrules.tools.cli import main

    path = _write(tmp_path / "w.fxr", "rule r:\n    " + DROPOUT)
    assert main(["check", os.fspath(path)]) == 0
    captured = capsys.readouterr()
    assert "warning[identity-rewrite]: just a warning" in captured.out
    assert "0 errors, 1 warning" in captured.err + captured.out


# ---------------------------------------------------------------------------
# Positions: columns count characters, not bytes; BOM, CRLF and tabs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, position",
    [
        (b"call_module Dropout($x) -> $y\n", (1, 28)),
        (b"\xef\xbb\xbfcall_module Dropout($x) -> $y\n", (1, 28)),          # a BOM is not a column
        (b"rule r:\r\n    call_module Dropout($x) -> $y\r\n", (2, 32)),      # CRLF
        (b"rule r:\n\tcall_module Dropout($x) -> $y\n", (2, 29)),            # a tab is one column
        ("rule r:\n    call_module Dropout($x) -> $\u00e9\n".encode(), (2, 32)),  # a unicode capture
        ("rule gr\u00f6\u00dfe:\n    call_module Dropout($\u00e9) -> $y\n".encode(), (2, 32)),
        ("# \u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9\ncall_module Dropout($x) -> $y\n".encode(), (2, 28)),
        (b"call_module Dropout($x) \\\n    -> $y\n", (2, 8)),                 # a line continuation
    ],
)
def test_columns(tmp_path, data, position):
    path = tmp_path / "p.fxr"
    path.write_bytes(data)
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    (d,) = info.value.diagnostics
    assert d.code == "unbound-capture"
    assert (d.line, d.column) == position
    assert d.end_column == d.column + 2
    str(info.value)  # renders


def test_unicode_names_are_fine():
    rules = parse_rules("rule gr\u00f6\u00dfe:\n    call_module Dropout($\u00e9) -> $\u00e9\n", "u.fxr")
    assert rules.names == ["gr\u00f6\u00dfe"]


# ---------------------------------------------------------------------------
# Syntax messages say what was really expected
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, must_say",
    [
        pytest.param("rule :\n    " + DROPOUT, "rule's name", id="rule-without-name"),
        pytest.param("rule 1st:\n    " + DROPOUT, "rule's name", id="rule-name-with-digit"),
        pytest.param("call_function ($x) -> $x\n", "target name", id="call-function-without-target"),
        pytest.param("call_method ($x) -> $x\n", "method name", id="call-method-without-name"),
        pytest.param("default changes\n", "`[`", id="default-without-brackets"),
        pytest.param("rule r:\n    call_module Dropout($x) where ) -> $x\n", "condition", id="where-then-paren"),
        pytest.param("call_function torch.add($x", "`)`", id="eof-inside-parens"),
        pytest.param("call_function torch.add($x, $y, alpha=) -> $x\n", "value", id="keyword-without-value"),
        pytest.param("call_module Linear{in_features=3 out_features=4}($x) -> $x\n", "`,`",
                     id="attributes-without-comma"),
        pytest.param("use torch.nn.functional G\n", "`as`", id="use-without-as"),
        pytest.param("rule drop: [exact]\n    " + DROPOUT, "pattern", id="contract-after-colon"),
        pytest.param("call_module Dropout($x) -> $x \\", "file ends", id="eof-after-line-continuation"),
    ],
)
def test_syntax_messages_name_what_was_expected(text, must_say):
    """A message must not claim `->` is missing where `->` cannot come next."""
    (d,) = diagnostics_of(text)
    assert d.code in ("unexpected-token", "unexpected-end")
    assert must_say in d.message, d.message
    assert "expected `->` after the pattern" not in d.message, d.message


def test_missing_arrow_message():
    (d,) = diagnostics_of("call_module Dropout($x) $x\n")
    assert "expected `->`" in d.message
    assert "found `$x`" in d.message


def test_invalid_string_escape_is_located():
    (d,) = diagnostics_of('rule r "\\N{no such name}":\n    ' + DROPOUT)
    assert (d.line, d.column) == (1, 8)
    assert "codec" not in d.message, "the message should not leak Python's codec error"


# ---------------------------------------------------------------------------
# Deep input: a RuleFileError (too-deep) or success, never a crash
# ---------------------------------------------------------------------------

_WHERE = "rule deep:\n    call_function torch.relu($x) where "


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_WHERE + "not " * 1000 + "True -> $x\n", id="not-chain"),
        pytest.param(_WHERE + "-" * 1000 + "$x.ndim == 1 -> $x\n", id="negation-chain"),
        pytest.param(_WHERE + "$x" + ".ndim" * 1000 + " -> $x\n", id="attribute-chain"),
        pytest.param(_WHERE + "$x.shape" + "[0]" * 1000 + " -> $x\n", id="index-chain"),
        pytest.param(_WHERE + "len" + "(1)" * 1000 + " -> $x\n", id="call-chain"),
        pytest.param(_WHERE + " and ".join(["True"] * 3000) + " -> $x\n", id="and-chain"),
        pytest.param(_WHERE + " + ".join(["1"] * 3000) + " == $x.ndim -> $x\n", id="plus-chain"),
        pytest.param("(call_function torch.relu($x)" + " | call_function torch.neg($x)" * 3000 + ") -> $x\n",
                     id="alternation-chain"),
        pytest.param("call_function torch.relu(" + "(" * 5000 + "$x" + ")" * 5000 + ") -> $x\n", id="parens"),
        pytest.param("call_function torch.relu($x) -> call_function torch.cat(" + "[" * 5000 + "]" * 5000 + ")\n",
                     id="lists"),
    ],
)
def test_deep_input_never_crashes(text):
    try:
        parse_rules(text, "deep.fxr")
    except RuleFileError as exc:
        assert exc.diagnostics
        assert all(d.code in CODES for d in exc.diagnostics)


# ---------------------------------------------------------------------------
# Integer literals: too many digits to convert is a located diagnostic, on both paths
# ---------------------------------------------------------------------------

_RELU_RELU = "call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"
_MODEL = "call_function torch.relu(call_function torch.relu($x))"
_DIGITS = "9" * 5000


def position(text: str, what: str, occurrence: int = 1) -> tuple[int, int]:
    """(line, column) of the ``occurrence``-th ``what`` in ``text``."""
    at = -1
    for _ in range(occurrence):
        at = text.index(what, at + 1)
    return text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_RELU_RELU + f"example {_DIGITS}: {_MODEL} given $x: [2]\n", id="example-count"),
        pytest.param(_RELU_RELU + f"example 2 train: {_MODEL} given $x: [2, {_DIGITS}]\n", id="shape"),
        pytest.param(_RELU_RELU + f"example: {_MODEL} given $x: float64[{_DIGITS}]\n", id="dtype-shape"),
        pytest.param(_RELU_RELU + f"example: {_MODEL} given $x: [2], $b: [2] = {_DIGITS}\n", id="fill"),
        pytest.param(f"call_function torch.add($x, {_DIGITS}) -> $x\n", id="pattern"),
        pytest.param(f"call_module Dropout{{p={_DIGITS}}}($x) -> $x\n", id="pattern-attribute"),
        pytest.param(f"call_function torch.relu($x) where $x.ndim == {_DIGITS} -> $x\n", id="condition"),
        pytest.param(f"call_function torch.neg($x) -> call_function torch.mul($x, -{_DIGITS})\n",
                     id="replacement-negative"),
        pytest.param(f"call_function torch.neg($x) -> call_function torch.mul($x, [1, ({_DIGITS},)])\n",
                     id="replacement-nested"),
        pytest.param(f"rule r:\n    call_function torch.relu($x) \\\n    -> call_module LeakyReLU{{negative_slope=\n"
                     f"        {_DIGITS}}}($x)\n", id="replacement-attribute-continued"),
    ],
)
def test_an_integer_with_too_many_digits_is_a_located_diagnostic(text):
    (d,) = diagnostics_of(text)
    assert (d.code, d.line, d.column) == ("unexpected-token", *position(text, _DIGITS))
    assert d.message == "an integer literal of 5000 digits; the limit is 4000"
    assert d.end_column == d.column + 5000  # the caret covers the digits
    str(RuleFileError([d], {"t.fxr": text}))  # renders


def test_four_thousand_digits_and_any_hexadecimal_literal_are_fine():
    (rule,) = parse_rules(f"call_function torch.add($x, {'9' * 4000}, 0x{'f' * 6000}) -> $x\n")
    assert rule.ast.patterns[0].args[1].value == int("9" * 4000)
    assert rule.ast.patterns[0].args[2].value == 16 ** 6000 - 1


def test_a_lower_python_digit_limit_is_the_limit():
    import sys

    text = _RELU_RELU + f"example {'1' * 641}: {_MODEL} given $x: [2]\n"
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        (d,) = diagnostics_of(text)
    finally:
        sys.set_int_max_str_digits(before)
    assert (d.code, d.line, d.column) == ("unexpected-token", 2, 9)
    assert d.message == "an integer literal of 641 digits; the limit is 640"


# ---------------------------------------------------------------------------
# Example counts, shapes and fills: bounded when the file is checked
# ---------------------------------------------------------------------------


def test_an_example_count_is_bounded():
    from fxrules.lang.check.examples import MAX_EXAMPLE_COUNT

    assert MAX_EXAMPLE_COUNT == 10_000
    parse_rules(_RELU_RELU + f"example {MAX_EXAMPLE_COUNT}: {_MODEL} given $x: [2]\n")
    for count in (str(MAX_EXAMPLE_COUNT + 1), "1" + "0" * 12, "9" * 4000, "0x" + "f" * 6000):
        text = _RELU_RELU + f"example {count} train: {_MODEL} given $x: [2]\n"
        (d,) = diagnostics_of(text)
        assert (d.code, d.line, d.column, d.end_column) == ("bad-example", 2, 1, 8)  # at `example`
        assert d.message == "an example may ask for at most 10000 rewrites"
        str(RuleFileError([d], {"t.fxr": text}))  # renders (no count in the message: it may be too long to print)


@pytest.mark.parametrize(
    "shape",
    ["[1" + "0" * 30 + "]", "[0x" + "f" * 6000 + "]", "[" + "9" * 4000 + ", 2]", "[4097]", "[4096, 1025]",
     "[" + ", ".join(["1"] * 9) + "]", "[2, 2, 2, 2, 2, 2, 2, " + "9" * 4000 + "]"],
    ids=["10**30", "hex", "4000-digits", "4097", "over-4M", "9-dimensions", "8-dimensions-huge"],
)
def test_an_example_shape_is_bounded_at_check_time(shape):
    text = _RELU_RELU + f"example: {_MODEL} given $x: float32{shape}\n"
    (d,) = diagnostics_of(text)
    assert (d.code, d.line, d.column) == ("bad-example", *position(text, "$x:"))
    assert "at most 8 dimensions, 4096 per dimension and 4M elements" in d.message


def test_the_largest_example_shapes_check_clean():
    parse_rules(_RELU_RELU + f"example: {_MODEL} given $x: [4096, 1024]\n"
                + f"example: {_MODEL} given $x: [" + ", ".join(["2"] * 8) + "]\n")


def test_an_integer_fill_fits_in_64_bits():
    model = "call_function torch.relu(call_function torch.relu(get_attr $b))"
    parse_rules(_RELU_RELU + f"example: {model} given $b: int64[2] = {2 ** 63 - 1}\n"
                + f"example: {model} given $b: int64[2] = -{2 ** 63}\n")
    for fill in (str(2 ** 63), f"-{2 ** 63 + 1}", "9" * 4000, "0x" + "f" * 6000):
        text = _RELU_RELU + f"example: {model} given $b: int64[2] = {fill}\n"
        (d,) = diagnostics_of(text)
        assert (d.code, d.line, d.column) == ("bad-example", *position(text, "$b:"))
        assert d.message == "an input's integer fill value must fit in 64 bits"


# ---------------------------------------------------------------------------
# A keyword given twice: found by name (keywords with equal values are equal keywords)
# ---------------------------------------------------------------------------

_EXAMPLE_RULE = "rule r [exact]:\n    " + _RELU_RELU


@pytest.mark.parametrize(
    "text, code, keyword, what",
    [
        pytest.param("call_function torch.nn.functional.relu($x, inplace=False, inplace=False) -> $x\n",
                     "bad-pattern", "inplace=", "keyword argument", id="pattern-same-value"),
        pytest.param("call_function torch.nn.functional.relu($x, inplace=False, inplace=True) -> $x\n",
                     "bad-pattern", "inplace=", "keyword argument", id="pattern-other-value"),
        pytest.param("call_function torch.relu(call_function torch.add($x, $y, alpha=$a, alpha=$a)) -> $x\n",
                     "bad-pattern", "alpha=", "keyword argument", id="pattern-nested-same-capture"),
        pytest.param("call_method add($x, $y, alpha=1, alpha=1) -> $x\n",
                     "bad-pattern", "alpha=", "keyword argument", id="pattern-method"),
        pytest.param("call_function torch.add($x, $y, alpha=1, alpha=1, ...) -> $x\n",
                     "bad-pattern", "alpha=", "keyword argument", id="pattern-with-ellipsis"),
        pytest.param("call_module Dropout{p=0.5, p=0.5}($x) -> $x\n",
                     "bad-pattern", "p=", "attribute", id="pattern-attribute"),
        pytest.param("call_module Dropout{p=_, p=_}($x) -> $x\n",
                     "bad-pattern", "p=", "attribute", id="pattern-attribute-wildcard"),
        pytest.param("call_module Dropout{p=0.5,\n    p=0.5}($x) -> $x\n",
                     "bad-pattern", "p=", "attribute", id="pattern-attribute-next-line"),
        pytest.param("call_function torch.relu($x) -> call_function torch.nn.functional.relu($x, inplace=False, "
                     "inplace=False)\n", "bad-replacement", "inplace=", "keyword argument", id="replacement"),
        pytest.param("rule r [changes]: call_module ReLU($x) -> call_module Dropout{p=0.5, p=0.5}($x)\n",  # a new
                     # Dropout draws random numbers: [changes] (random-state otherwise)
                     "bad-replacement", "p=", "constructor argument", id="replacement-constructor"),
        pytest.param(_EXAMPLE_RULE + "    example: call_function torch.relu(call_function torch.nn.functional.relu("
                     "$x, inplace=False, inplace=False)) given $x: [2]\n",
                     "bad-example", "inplace=", "keyword argument", id="example"),
        pytest.param(_EXAMPLE_RULE + "    example: call_module ReLU(call_module ReLU{inplace=False, inplace=False}"
                     "($x)) given $x: [2]\n", "bad-example", "inplace=", "constructor argument",
                     id="example-constructor"),
    ],
)
def test_a_keyword_given_twice_is_reported_at_the_second(text, code, keyword, what):
    (d,) = diagnostics_of(text)
    line, column = position(text, keyword, 2)
    assert (d.code, d.line, d.column) == (code, line, column)
    assert d.message == f"{what} `{keyword[:-1]}` is given twice"
    first_line, first_column = position(text, keyword, 1)
    assert d.notes == (f"first given at t.fxr:{first_line}:{first_column}",)


def test_a_keyword_given_three_times_is_reported_twice():
    text = "call_function torch.nn.functional.relu($x, inplace=False, inplace=False, inplace=False) -> $x\n"
    assert codes(text) == [("bad-pattern", *position(text, "inplace=", 2)),
                           ("bad-pattern", *position(text, "inplace=", 3))]


def test_distinct_keywords_and_the_same_keyword_in_different_lists_are_fine():
    parse_rules("call_function torch.add(call_function torch.add($x, $y, alpha=1), $z, alpha=1) -> $x\n"
                "call_module Dropout{p=0.5}(call_module Dropout{p=0.5}($x)) -> $x\n"
                "call_function torch.nn.functional.gelu($x, approximate=\"none\") "
                "-> call_function torch.nn.functional.gelu($x, approximate=\"tanh\")\n")
