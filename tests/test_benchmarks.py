"""The benchmark harness in its smoke mode: every tool gives the model's outputs and the same rewrite
and node counts on small graphs (what `python -m benchmarks.run --smoke` checks), here for the
workloads whose rewrites keep matched nodes or fold modules. Timings are not asserted."""

from __future__ import annotations

import pytest

run = pytest.importorskip("benchmarks.run")


def test_smoke_run_checks_every_tool_agrees(capsys):
    status = run.main(["--smoke", "--workloads", "relu_relu,linear_gelu_dropout,double_transpose,conv_bn",
                       "--tools", "fxrules,inductor,floor", "--parse", "", "--no-memory", "--no-warmup",
                       "--no-breakdown"])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "| ok |" in line]
    assert len(rows) == 4, out
