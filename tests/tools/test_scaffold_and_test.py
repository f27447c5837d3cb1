"""``fxrules new`` writes a rule that checks clean and passes its examples; ``fxrules test`` runs only
the rules' own examples and fails on a wrong one."""

from __future__ import annotations

import json

import pytest

from fxrules.tools.cli import main
from fxrules.tools.scaffold import scaffold

torch = pytest.importorskip("torch")


def test_new_scaffolds_a_working_rule_and_never_overwrites(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules").mkdir()
    assert main(["new", "merge_relus", "--family", "fold"]) == 0
    path = tmp_path / "rules" / "fold" / "merge_relus.fxr"
    text = path.read_text()
    assert 'rule merge_relus "' in text and "[approx]" in text and "example:" in text and "example 0:" in text
    assert "wrote rules/fold/merge_relus.fxr" in capsys.readouterr().out
    assert main(["check", "rules"]) == 0
    assert main(["test", "rules"]) == 0
    assert "fxrules test: 2 examples of 1 rule: all passed" in capsys.readouterr().out
    assert main(["new", "merge_relus", "--family", "fold"]) == 2
    assert "exists already" in capsys.readouterr().err and path.read_text() == text
    assert main(["new", "1bad"]) == 2


def test_the_family_picks_the_contract():
    assert "[changes]" in scaffold("x", "swap").text and "[exact]" in scaffold("x", "cleanup").text
    assert scaffold("x", "", "somewhere").path == "somewhere/x.fxr"


def test_test_fails_on_a_wrong_example_and_says_where(tmp_path, capsys):
    (tmp_path / "r.fxr").write_text(
        "rule twice:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"
        "    example 2: call_function torch.relu(call_function torch.relu($x)) given $x: [2, 8]\n"
        "rule wrong [exact]:\n    call_function torch.sigmoid($x) -> call_function torch.tanh($x)\n"
        "    example: call_function torch.sigmoid($x) given $x: [2, 8]\n"
        "rule bare:\n    call_function torch.neg(call_function torch.neg($x)) -> $x\n", encoding="utf-8")
    assert main(["test", str(tmp_path / "r.fxr")]) == 1
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'r.fxr'}:3:5: FAIL rule `twice`: expected it to " in out and "rewritten 1 time" in out
    assert f"{tmp_path / 'r.fxr'}:6:5: FAIL rule `wrong`" in out
    assert "fxrules test: 2 examples of 3 rules: 2 failed; 1 rule without examples (bare)" in err
    assert main(["test", str(tmp_path / "r.fxr"), "--rule", "bare", "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["rules"] == [{"rule": "bare", "source": f"{tmp_path / 'r.fxr'}:7",
                                                           "examples": []}]
    assert main(["test", str(tmp_path / "r.fxr"), "--rule", "nope"]) == 2


def test_test_runs_the_library_examples(capsys):
    assert main(["test", "cleanup"]) == 0
    assert "all passed" in capsys.readouterr().out
