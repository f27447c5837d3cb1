"""The benchmark harness in its smoke mode: every tool gives the model's outputs and the same rewrite
and node counts on small graphs (what `python -m benchmarks.run --smoke` checks), here for the
workloads whose rewrites keep matched nodes or fold modules, the torch.export graph, the graph of modules only,
and the graph whose input every block reads. Timings are not asserted."""

from __future__ import annotations

import pytest

run = pytest.importorskip("benchmarks.run")


@pytest.mark.slow
def test_smoke_run_checks_every_tool_agrees(capsys):
    status = run.main(["--smoke", "--workloads", "relu_relu,linear_gelu_dropout,double_transpose,conv_bn,aten_cleanup,module_pairs,"
                       "shared_input,relu_cascade,transpose_chain",
                       "--tools", "fxrules,inplace,inductor,floor", "--parse", "", "--no-memory", "--no-warmup",
                       "--no-breakdown"])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "| ok |" in line]
    assert len(rows) == 9, out
    for row in rows:  # both modes of fxrules made the same rewrites as inductor
        cells = [c.strip() for c in row.split("|")]
        fx, ip, rp, ind = cells[-3].split("/")
        assert fx == ip == ind and rp == "-", row
    goals = out[out.index("Issue 17's goals"):]
    goal_rows = [line for line in goals.splitlines() if line.startswith("| ") and line[2:].split(" |")[0] in
                 ("relu_relu", "linear_gelu_dropout", "double_transpose", "conv_bn", "aten_cleanup",
                  "module_pairs", "shared_input", "relu_cascade", "transpose_chain")]
    assert len(goal_rows) == 9, goals
    assert all(("ok" in row or "MISS" in row) for row in goal_rows), goals


def test_goal_cells_say_whether_the_ratio_meets_the_bound():
    assert run._goal(1.1, 1.0, 1.0, True) == "1.10x ok"
    assert run._goal(0.9, 1.0, 1.0, True) == "0.90x MISS"
    assert run._goal(1.2, 1.0, 1.15, False) == "1.20x MISS"
    assert run._goal(1.1, 1.0, 1.15, False) == "1.10x ok"
    assert run._goal(None, 1.0, 1.0, True) == "-"


def test_the_inputs_benchmark_times_each_case_and_counts_its_rewrites(capsys):
    from benchmarks import inputs

    inputs.main(["--workloads", "relu_relu:300,dropout:300", "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| relu") or
            line.startswith("| dropout")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[2:7])
        copying, from_file, with_inputs, in_place, nothing = (int(n) for n in cells[7].split("/"))
        assert copying == from_file == with_inputs == in_place > 0 and nothing == 0
