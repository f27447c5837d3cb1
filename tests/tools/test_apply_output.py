"""apply --diff shows the module tree too (a module swapped or rebuilt shows, not only a rename in
the code), and the rewrite time is reported apart from start-up (the rules' compiling, lazy imports)."""

from __future__ import annotations

import json

import pytest

from fxrules.tools.cli import main

torch = pytest.importorskip("torch")

TANH = 'rule tanh_gelu [approx]:\n    call_module GELU{approximate="none"}($x) -> call_module GELU{approximate="tanh"}($x)\n'


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "gelu.fxr").write_text(TANH, encoding="utf-8")
    (tmp_path / "gelu_models.py").write_text(
        "import torch\n\ndef net():\n    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.GELU(), "
        "torch.nn.Dropout()).eval()\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_diff_shows_a_module_rebuilt_with_other_arguments(project, capsys):
    assert main(["apply", "gelu.fxr", "cleanup", "--model", "gelu_models:net", "--input", "2x3", "--diff"]) == 0
    out = capsys.readouterr().out
    assert "--- modules before\n+++ modules after\n" in out
    assert "-1: GELU(approximate='none')\n" in out and "+1: GELU(approximate='tanh')" in out
    assert "-2: Dropout(p=0.5, inplace=False)" in out
    assert " 0: Linear(in_features=3, out_features=3, bias=True)" in out


def test_module_diff_in_json_and_when_nothing_changed(project, capsys):
    assert main(["apply", "cleanup", "--model", "gelu_models:net", "--input", "2x3", "--diff", "--format",
                 "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["module_diff"].startswith("--- modules before\n+++ modules after\n")
    assert main(["apply", "fold", "--model", "gelu_models:net", "--diff"]) == 0
    out = capsys.readouterr().out
    assert "the code did not change" in out and "the modules did not change" in out


def test_rewrite_time_is_reported_apart_from_start_up(project, capsys):
    """The first apply_rules in a process compiles the rules and imports torch's shape propagation
    (seconds); the reported rewrite time must not include that."""
    assert main(["apply", "gelu.fxr", "--model", "gelu_models:net", "--input", "2x3", "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["startup_seconds"] > 0 and payload["seconds"] < 1.0
    assert main(["apply", "gelu.fxr", "--model", "gelu_models:net", "--input", "2x3"]) == 0
    out = capsys.readouterr().out
    assert "time: rewrite " in out and " s of start-up (" in out
