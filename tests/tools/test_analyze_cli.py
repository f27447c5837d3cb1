"""The ``fxrules analyze`` command: exit codes (0 no findings, 1 findings, 2 usage), the text, json
and github formats, --static without torch, --against models, and --reproduce replaying a witness.

Tests call ``fxrules.tools.cli.main`` in process; the torch-blocked run is in tests/lang/test_analysis.py.
"""

from __future__ import annotations

import json
import re
import os
import shlex

import pytest

from fxrules.tools.cli import main

LOOP = """\
rule to_operator "torch.mul by 2 is operator.mul" [exact]:
    call_function torch.mul($x, 2)
    -> call_function operator.mul($x, 2)

rule to_torch "operator.mul by 2 is torch.mul" [exact]:
    call_function operator.mul($x, 2)
    -> call_function torch.mul($x, 2)
"""

SHADOWED = """\
rule general "relu of anything" [exact]:
    call_function torch.relu($x)
    -> call_function F.relu($x)

rule specific "never reached" [exact]:
    call_function torch.relu(call_function torch.neg($y))
    -> call_function torch.relu($y)
"""

UNSATISFIABLE = """\
rule impossible "no tensor is both" [exact]:
    call_function torch.exp($x)
    where $x.ndim > 2 and $x.ndim < 3
    -> $x
"""

CLEAN = """\
rule double_neg "-(-x) is x" [exact]:
    call_function torch.neg(call_function torch.neg($x))
    -> $x
"""

DEAD = """\
rule tanh_twice "the zoo's redundant model has no tanh" [exact]:
    call_function torch.tanh(call_function torch.tanh($x))
    -> call_function torch.tanh($x)

rule remove_dropout "eval dropout is the identity" [exact]:
    call_module Dropout($x) as d
    where not d.training
    -> $x
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the replay commands name the paths as given

    def write(name: str, text: str) -> str:
        (tmp_path / name).write_text(text, encoding="utf-8")
        return name

    return write


def test_a_clean_rule_set_exits_0(files, capsys):
    assert main(["analyze", files("clean.fxr", CLEAN)]) == 0
    out, err = capsys.readouterr()
    assert "no findings" in out and "Traceback" not in out + err


def test_static_findings_exit_1_in_compiler_style(files, capsys):
    assert main(["analyze", "--static", files("shadow.fxr", SHADOWED), files("unsat.fxr", UNSATISFIABLE)]) == 1
    out, err = capsys.readouterr()
    assert "shadow.fxr:5:6: warning[shadowed]: rule `specific` never fires" in out
    assert "unsat.fxr:1:6: warning[unsatisfiable]" in out
    assert "    rule specific" in out and "^^^^^^^^" in out  # the source line, underlined
    assert "1 shadowed, 1 unsatisfiable" in err


def test_a_loop_exits_1_and_its_replay_command_reproduces_it(files, capsys):
    path = files("loop.fxr", LOOP)
    assert main(["analyze", path, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == 1 and data["ok"] is False and data["counts"]["loop"] == 1
    [finding] = data["findings"]
    assert finding["code"] == "loop" and finding["location"] == "loop.fxr:1:6"
    assert [r["name"] for r in finding["rules"]] == ["to_operator", "to_torch"]
    command = finding["witness"]["command"]
    argv = shlex.split(command)
    assert argv[:2] == ["fxrules", "analyze"] and "--reproduce" in argv
    assert main(argv[1:]) == 1
    out, _ = capsys.readouterr()
    assert "the witness reproduced the finding" in out and "warning[loop]" in out


def test_a_witness_that_does_not_reproduce_exits_1_and_says_so(files, capsys):
    path = files("loop.fxr", LOOP)
    assert main(["analyze", path, "--format", "json"]) == 1
    command = json.loads(capsys.readouterr().out)["findings"][0]["witness"]["command"]
    files("loop.fxr", LOOP.replace("-> call_function torch.mul($x, 2)", "-> call_function torch.mul($x, 2.0)"))
    assert main(shlex.split(command)[1:]) == 1
    out, _ = capsys.readouterr()
    assert "did not reproduce" in out


def test_github_format_annotates_each_finding(files, capsys):
    assert main(["analyze", "--static", "--format", "github", files("shadow.fxr", SHADOWED)]) == 1
    out, _ = capsys.readouterr()
    [line] = out.splitlines()
    assert line.startswith("::warning file=shadow.fxr,line=5,col=6,title=shadowed::rule `specific` never fires")


def test_dead_rules_against_a_zoo_model(files, capsys):
    path = files("dead.fxr", DEAD)
    code = main(["analyze", path, "--only", "dead", "--against", "fxrules.zoo:redundant", "--input", "2x3x16x16",
                 "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(f["code"], f["rules"][0]["name"]) for f in data["findings"]] == [("dead", "tanh_twice")]
    assert data["models"] == ["fxrules.zoo:redundant"]


@pytest.mark.parametrize("argv", [
    ["analyze"],
    ["analyze", "x.fxr", "--only", "nonsense"],
    ["analyze", "x.fxr", "--static", "--only", "loop"],
    ["analyze", "x.fxr", "--max-examples", "0"],
    ["analyze", "x.fxr", "--input", "2x3"],
    ["analyze", "x.fxr", "--reproduce", "@reproduce_failure('6', b'')"],
    ["analyze", "x.fxr", "--only", "loop", "--rule", "nope", "--reproduce", "@reproduce_failure('6', b'')"],
    ["analyze", "x.fxr", "--only", "loop", "--rule", "double_neg", "--reproduce", "garbage"],
    ["analyze", "missing.fxr"],
])
def test_usage_errors_exit_2(argv, files, capsys):
    files("x.fxr", CLEAN)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err


def test_the_bundled_library_analyses_statically_clean(capsys):
    library = os.path.join(os.path.dirname(__file__), "..", "..", "rules")
    assert main(["analyze", "--static", library]) == 0
    assert re.search(r"\d+ rules: no findings", capsys.readouterr().out)


def test_the_static_pre_commit_hook_needs_no_torch():
    """fxrules-analyze runs `fxrules analyze --static` with lark only; the full one is opt-in with torch."""
    import yaml

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, ".pre-commit-hooks.yaml"), encoding="utf-8") as handle:
        hooks = {hook["id"]: hook for hook in yaml.safe_load(handle)}
    static, full = hooks["fxrules-analyze"], hooks["fxrules-analyze-full"]
    assert static["entry"] == "fxrules analyze --static" and not static.get("additional_dependencies")
    assert static["require_serial"] is True
    assert full["entry"] == "fxrules analyze"
    assert any(d.startswith("torch") for d in full["additional_dependencies"])
    assert "hypothesis" in full["additional_dependencies"]
