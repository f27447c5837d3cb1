"""The instruction counter (``benchmarks/instructions.py``): its child makes exactly the counted calls
through the toggle function, its parent reads callgrind's total and reports a failed child. valgrind
itself is not run here (minutes per tool)."""

from __future__ import annotations

import subprocess
import types

import pytest
from torch import fx

instructions = pytest.importorskip("benchmarks.instructions")


@pytest.mark.parametrize("tool", ["fxrules", "inplace", "inductor"])
def test_the_child_makes_each_counted_call_through_the_toggle(monkeypatch, tool):
    made = []
    real_call = instructions.operator.call

    def counted(fn, *args):
        made.append(isinstance(args[0], fx.GraphModule))
        return real_call(fn, *args)

    monkeypatch.setattr(instructions, "operator", types.SimpleNamespace(call=counted))
    instructions.child(tool, "module_pairs", 300, 2, None)
    assert made == [True, True]  # two counted calls, each on a graph module


def test_the_parent_reads_the_collected_total(monkeypatch):
    seen = {}

    def fake_run(command, cwd, env, capture_output, text):
        seen.update(command=command, env=env)
        return subprocess.CompletedProcess(command, 0, "", "==1== Events    : Ir\n==1== Collected : 123456\n")

    monkeypatch.setattr(instructions.subprocess, "run", fake_run)
    assert instructions.count("fxrules", "module_pairs", 300, 1, None, "/somewhere") == 123456
    assert "--toggle-collect=_operator_call" in seen["command"] and seen["env"]["PYTHONHASHSEED"] == "0"
    assert seen["env"]["PYTHONPATH"].startswith("/somewhere")


def test_a_failed_child_is_reported_with_its_output(monkeypatch):
    monkeypatch.setattr(instructions.subprocess, "run", lambda command, **_: subprocess.CompletedProcess(
        command, 1, "", "Traceback ...\nKeyError: 'unknown workload'\n"))
    with pytest.raises(RuntimeError, match="unknown workload"):
        instructions.count("fxrules", "nope", 300, 1, None, "/somewhere")


def test_unknown_tools_are_refused(capsys, monkeypatch):
    monkeypatch.setattr(instructions.shutil, "which", lambda name: "/usr/bin/valgrind")
    with pytest.raises(SystemExit):
        instructions.main(["--tools", "fxrules,sed"])
    assert "unknown tools: sed" in capsys.readouterr().err
