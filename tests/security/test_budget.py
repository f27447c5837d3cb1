"""Bounded evaluation: the runs fxrules makes (verify, apply_rules' shape propagation) are measured first.

A replacement can ask for any amount of memory in a few bytes. Literal sizes are refused when the
file is checked (``allocation-budget``, tests/corpus/fail/allocation_budget_*.fxr and below); sizes
computed from the data pass the checker, and are refused when fxrules would run them: verify gives
the rule the grade ``error`` with the refusal's code, naming the node and the size; apply_rules never
computes a new node's value on real tensors, and its real-tensor fallback sizes each op first.
Each hostile case runs in a process of its own under RLIMIT_AS (tests/security/forkserver.py): an
allocation that got through would be a MemoryError there, not an out-of-memory machine.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import fx

import fxrules
from fxrules.engine.budget import FLOOR_BYTES, Budget, BudgetCode, RealRunGuard, Unsized, measure
from fxrules.engine.errors import AllocationRefused
from tests.security.forkserver import ForkServer
from tests.security.test_hostile import PRELUDE, _codes

GIB = 1 << 30


def _run(body: str, timeout: float = 180):
    return ForkServer.ask({"kind": "code", "code": PRELUDE + textwrap.dedent(body)}, timeout)


def _check(path, timeout: float = 60):
    return ForkServer.ask({"kind": "check", "args": [str(path)]}, timeout)


# sizes computed from the data (so the checker cannot see them), each far over the budget
COMPUTED = {
    "zeros": "call_function torch.add($x, call_method sum(call_function torch.zeros("
             "call_function operator.mul(call_method size($x, 0), 2000000000))))",
    "expand": "call_function torch.add($x, call_method sum(call_method contiguous(call_method expand("
              "call_method reshape($x, -1, 1), -1, call_function operator.mul(call_method size($x, 0), 1000000000)))))",
    "repeat": "call_function torch.add($x, call_method sum(call_method repeat(call_method reshape($x, -1), "
              "call_function operator.mul(call_method size($x, 0), 1000000000))))",
    "full": "call_function torch.add($x, call_method sum(call_function torch.full("
            "[call_function operator.mul(call_method size($x, 0), 1000000000)], 1.0)))",
    # eight values of 48 MB, each under the budget of one value; together over what may be alive at once
    "live": "call_function torch.add($x, call_method sum(call_function torch.cat(["
            + ", ".join(["call_function torch.zeros(12000000)"] * 8) + "])))",
}


@pytest.mark.parametrize("name", sorted(COMPUTED))
@pytest.mark.slow
def test_verify_refuses_a_run_over_the_budget(tmp_path, name):
    rules = tmp_path / "big.fxr"
    rules.write_text(f"rule big [changes]: call_function torch.relu($x) -> {COMPUTED[name]}\n"
                     f"    example: call_function torch.relu($x) given $x: [2, 3]\n", encoding="utf-8")
    assert _check(rules).returncode == 0  # the sizes are computed: the checker cannot see them
    run = _run(f"""
        limit(1 << 30)
        report = fxrules.verify({str(rules)!r}, max_examples=5, seed=0, database=None)
        verdict = report["big"]
        print("grade", verdict.grade, verdict.refusal)
        print("note", verdict.hosts_note)
    """)
    assert "grade error allocation-budget" in run.stdout, run.stdout + run.stderr
    assert "node %" in run.stdout and "over the budget" in run.stdout
    assert "MemoryError" not in run.stdout + run.stderr


@pytest.mark.slow
def test_verify_refuses_what_fake_tensors_cannot_size(tmp_path):
    # bincount's output length is the largest value + 1: the data decides it, fake tensors cannot
    rules = tmp_path / "bincount.fxr"
    rules.write_text("rule b [changes]: call_function torch.relu($x) -> call_function torch.add($x, call_method sum("
                     "call_function torch.bincount(call_method long(call_function torch.add("
                     "call_function torch.mul(call_function torch.abs($x), 0.0), 10000000000.0)))))\n"
                     "    example: call_function torch.relu($x) given $x: [2, 3]\n", encoding="utf-8")
    assert _check(rules).returncode == 0
    run = _run(f"""
        limit(1 << 30)
        verdict = fxrules.verify({str(rules)!r}, max_examples=5, seed=0, database=None)["b"]
        print("grade", verdict.grade, verdict.refusal, verdict.hosts_note)
    """)
    assert "grade error allocation-unknown" in run.stdout, run.stdout + run.stderr
    assert "bincount" in run.stdout


@pytest.mark.slow
def test_apply_rules_computes_no_new_value_on_real_tensors(tmp_path):
    rules = tmp_path / "big.fxr"
    rules.write_text(f"rule big [changes]: call_function torch.relu($x) -> {COMPUTED['zeros']}\n", encoding="utf-8")
    run = _run(f"""
        limit(1 << 30)
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_function(torch.relu, (x,)))
        m = torch.fx.GraphModule(torch.nn.Module(), g)
        result = fxrules.apply_rules(m, {str(rules)!r}, example_inputs=(torch.randn(2, 3),))
        print("applied", result.report.counts)
    """)
    assert "applied {'big': 1}" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_apply_rules_real_fallback_sizes_each_op_first():
    # the model's fake run fails (nonzero: a data-dependent shape), so shape propagation runs it on
    # real tensors; the op that would take 8 GB is refused before it runs, and the model is untouched
    run = _run("""
        import operator
        limit(1 << 30)
        g = torch.fx.Graph()
        x = g.placeholder("x")
        nz = g.call_function(torch.nonzero, (x,))
        n = g.call_method("size", (x, 0))
        big = g.call_function(torch.zeros, (g.call_function(operator.mul, (n, 1000000000)),))
        g.output((nz, g.call_method("sum", (big,))))
        m = torch.fx.GraphModule(torch.nn.Module(), g)
        code = m.code
        try:
            fxrules.apply_rules(m, fxrules.LIBRARY, example_inputs=(torch.randn(2, 3),))
            print("applied")
        except fxrules.ModelError as exc:
            print("refused", type(exc).__name__, exc.code, exc.node)
            print(exc)
        print("untouched", m.code == code)
    """)
    assert "refused AllocationRefused allocation-budget" in run.stdout, run.stdout + run.stderr
    assert "allocation-budget zeros" in run.stdout and "untouched True" in run.stdout


LITERAL = [
    "call_function torch.add($x, call_method sum(call_function torch.zeros(100000, 100000)))",
    "call_method resize_($x, 100000, 100000)",
    "call_method contiguous(call_method expand($x, 100000, 100000))",
    "call_method repeat($x, 100000, 100000)",
    "call_function torch.add($x, call_method sum(call_function torch.full([100000, 100000], 1.0)))",
    "call_function torch.add($x, call_method sum(call_function torch.empty(100000, 100000)))",
    "call_function torch.add($x, call_method sum(call_function torch.arange(0, 100000000000)))",
    "call_function torch.add($x, call_method sum(call_function torch.ones(call_method size($x, 0), 100000, 100000)))",
    "call_function torch.add($x, call_method sum(call_function torch.rand(100000, 100000)))",
    "call_function torch.add($x, call_method sum(call_function torch.linspace(0, 1, 100000000000)))",
    "call_function torch.add($x, call_method sum(call_function torch.eye(100000)))",
    "call_method view($x, 100000, 100000)",
    "call_method reshape($x, [100000, 100000])",
    "call_function torch.add($x, call_method sum(call_function aten.full.default([100000, 100000], 1.0)))",
]


@pytest.mark.parametrize("replacement", LITERAL)
@pytest.mark.slow
def test_literal_sizes_over_the_budget_are_refused_when_checked(tmp_path, replacement):
    rules = tmp_path / "literal.fxr"
    rules.write_text(f"rule r [changes]: call_function torch.relu($x) -> {replacement}\n", encoding="utf-8")
    result = _check(rules)
    assert result.returncode == 1 and "allocation-budget" in _codes(result.stdout), result.stdout


# ---------------------------------------------------------------------------
# The budget itself (in process: fake tensors allocate nothing)
# ---------------------------------------------------------------------------


def _graph(build) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(build(g, x))
    return fx.GraphModule(torch.nn.Module(), g)


def test_the_budget_numbers():
    small = Budget.for_verification(torch.nn.Linear(2, 2), (torch.randn(2, 2),))
    assert (small.value_bytes, small.live_bytes) == (FLOOR_BYTES, 4 * FLOOR_BYTES) == (64 << 20, 256 << 20)
    example = Budget.for_verification(torch.nn.Module(), (torch.randn(1 << 22),))  # 16 MiB: 16x is 256 MiB
    assert example.value_bytes == 256 << 20
    huge = Budget.for_verification(torch.nn.Module(), (torch.empty(1 << 28, device="meta"),))
    assert huge.value_bytes == GIB  # the cap
    model = Budget.for_model(torch.nn.Module(), (torch.empty(1 << 28, device="meta"),))
    assert model.value_bytes == 64 << 30  # 64x, no cap: the caller's model


def test_measure_counts_views_once_and_frees_dead_values():
    # each 16 MB value dies after its use: 40 of them in a chain are never alive together
    def chain(g, x):
        value = g.call_function(torch.zeros, (4000000,))
        for _ in range(40):
            value = g.call_function(torch.add, (value, 1))
            value = g.call_method("view", (value, -1))
        return g.call_method("sum", (value,))

    footprint = measure(_graph(chain), (torch.randn(2),), Budget.for_verification(torch.nn.Module(), ()))
    assert footprint.complete and footprint.largest_value == 16_000_000
    assert footprint.peak_live <= 2 * 16_000_000 + 64


def test_measure_names_the_node_and_the_size():
    gm = _graph(lambda g, x: g.call_function(torch.zeros, (100000, 100000)))
    with pytest.raises(AllocationRefused) as caught:
        measure(gm, (torch.randn(2),), Budget.for_verification(gm, ()))
    assert caught.value.code == BudgetCode.OVER and caught.value.nbytes == 40_000_000_000
    assert caught.value.node == "zeros" and caught.value.limit == 64 << 20
    assert "%zeros" in str(caught.value) and "37.3 GiB" in str(caught.value)
    assert "While executing" not in str(caught.value)


def test_an_ordinary_error_in_the_fake_run_leaves_the_rest_to_the_guard():
    gm = _graph(lambda g, x: g.call_function(torch.mm, (x, x)))  # [2, 3] @ [2, 3]: a shape error
    footprint = measure(gm, (torch.randn(2, 3),), Budget.for_verification(gm, ()))
    assert not footprint.complete and "mm" in footprint.failure
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied|same reduction dim|size mismatch"):
        with RealRunGuard(Budget.for_verification(gm, ()), Unsized.REFUSE):
            gm(torch.randn(2, 3))


def test_the_guard_refuses_before_the_op_runs_and_counts_unsized_ops_after():
    budget = Budget.for_verification(torch.nn.Module(), ())
    with pytest.raises(AllocationRefused, match="allocation-budget"):
        with RealRunGuard(budget, Unsized.RUN_AND_COUNT):
            torch.zeros(100000, 100000)
    with pytest.raises(AllocationRefused, match="allocation-unknown"):
        with RealRunGuard(budget, Unsized.REFUSE):
            torch.nonzero(torch.ones(3))
    with RealRunGuard(budget, Unsized.RUN_AND_COUNT) as guard:
        assert torch.nonzero(torch.ones(3)).shape == (3, 1)
    assert guard.ledger.largest == 24


def test_allocation_refused_is_a_model_error_and_pickles():
    import pickle

    error = AllocationRefused("too big", code="allocation-budget", node="zeros", nbytes=10, limit=5)
    assert isinstance(error, fxrules.ModelError)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.code, again.node, again.nbytes, again.limit) == (str(error), "allocation-budget",
                                                                                "zeros", 10, 5)
