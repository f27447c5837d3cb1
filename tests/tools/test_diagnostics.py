"""The diagnostics of issue 18: suggestions where a new user's typo lands, syntax errors that do not
hide the rest of the file, one-line command errors, explain reasons that say what failed, and
load_saved naming what is missing."""

from __future__ import annotations

import os
import sys

import pytest

import fxrules
from fxrules.tools.cli import main


def _check(tmp_path, text: str, capsys) -> str:
    path = tmp_path / "r.fxr"
    path.write_text(text, encoding="utf-8")
    main(["check", str(path)])
    return capsys.readouterr().out


def test_an_opcode_typo_gets_a_suggestion_and_the_other_rules_are_still_checked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = _check(tmp_path, "rule a:\n    call_methd relu($x) -> $x\n"
                           "rule b:\n    call_module Dropout($x) -> $y\n"
                           "rule c:\n    call_fuction torch.relu($x) -> $x\n"
                           "rule d:\n    call_function torch.relux($x) -> $x\n", capsys)
    assert "r.fxr:2:16: error[unexpected-token]" in out
    assert "note: `call_methd` is not an opcode: did you mean `call_method`?" in out
    assert "r.fxr:4:32: error[unbound-capture]" in out  # after the syntax error
    assert "note: `call_fuction` is not an opcode: did you mean `call_function`?" in out
    assert "r.fxr:8:19: error[unknown-target]" in out
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(tmp_path / "r.fxr")
    assert [d.code for d in info.value.diagnostics] == ["unexpected-token", "unbound-capture", "unexpected-token",
                                                        "unknown-target"]


def test_lines_keep_their_numbers_after_a_syntax_error(tmp_path, capsys):
    out = _check(tmp_path, "rule a:\n    call_module Dropout($x) $x\n\n# c\nrule b:\n    call_module Dropout($x) -> $z\n",
                 capsys)
    assert "r.fxr:2:29: error[unexpected-token]" in out and "r.fxr:6:32: error[unbound-capture]" in out


def test_a_case_only_difference_is_suggested_first(tmp_path, capsys):
    pytest.importorskip("torch")
    out = _check(tmp_path, "rule g:\n    call_module GeLU($x) -> $x\n", capsys)
    assert "note: did you mean `torch.nn.GELU`?" in out


def test_a_misspelt_predicate_gets_a_suggestion(tmp_path, capsys):
    out = _check(tmp_path, "rule p:\n    call_function operator.add($x, get_attr $b) where is_zer($b) -> $x\n", capsys)
    assert "error[unknown-predicate]" in out and "note: did you mean `is_zero`?" in out


def test_explain_without_inputs_is_one_line(capsys):
    pytest.importorskip("torch")
    assert main(["explain", "cleanup", "--model", "fxrules.zoo:redundant"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert "pass --input SHAPE" in err and "comes from " in err and "zoo.py:" in err
    assert "site-packages/torch" not in err


def test_explain_quotes_the_false_condition_and_names_module_types(capsys):
    pytest.importorskip("torch")
    assert main(["explain", "cleanup", "canonicalize", "--model", "fxrules.zoo:resnet", "--input", "2x3x16x16"]) == 0
    out = capsys.readouterr().out
    assert "the pattern matched, but the condition `$x.ndim == 2` is false" in out
    assert "(call_module layers.0.bn2: BatchNorm2d)" in out


def test_load_saved_says_which_code_is_missing(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch import fx

    from fxrules.tools.saving import SaveError, save_module

    (tmp_path / "custom_twice.py").write_text(
        "import torch\nclass Twice(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import custom_twice

    class Leaves(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, custom_twice.Twice) or super().is_leaf_module(m, qualname)

    model = torch.nn.Sequential(custom_twice.Twice())
    save_module(fx.GraphModule(model, Leaves().trace(model)), tmp_path / "saved")
    monkeypatch.delitem(sys.modules, "custom_twice")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    os.remove(tmp_path / "custom_twice.py")
    with pytest.raises(SaveError) as info:
        fxrules.load_saved(tmp_path / "saved")
    message = str(info.value)
    assert "it needs module `custom_twice`, which this process cannot import" in message
    assert "put its folder on sys.path" in message
