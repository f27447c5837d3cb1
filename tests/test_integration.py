"""fxrules.RulePass (a torch.fx PassBase in a PassManager) and fxrules.compile_backend (torch.compile).

On the bundled zoo: outputs of the rewritten / compiled model against the original model,
the rules that fired (per rule counts through the reports), the graphs themselves, and the
error paths. Dynamo captures functional graphs (modules inlined), so the backend tests use
rules on functions and methods; the pass tests also use module rules on symbolic traces.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult
from torch.fx.passes.infra.pass_manager import PassManager

import fxrules
from fxrules import zoo

ROOT = Path(__file__).resolve().parent.parent

RULES = fxrules.parse_rules('''
rule remove_dropout [exact]:
    call_module Dropout($x) as d
    where not d.training
    -> $x

rule fold_conv2d_bn [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)

rule remove_functional_dropout [exact]:
    call_function F.dropout($x, _, False) -> $x

rule canonical_relu [exact]:
    (call_function F.relu($x) | call_method relu($x) | call_module ReLU{inplace=False}($x))
    -> call_function torch.relu($x)

rule relu_idempotent [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)

rule double_transpose [exact]:
    call_method transpose(call_method transpose($x, $a, $b), $a, $b) -> $x

rule mul_one [exact]:
    call_function operator.mul($x, 1) -> $x

rule add_zero [exact]:
    call_function operator.add($x, 0) -> $x
''', "integration.fxr")


def run(model, inputs):
    with torch.no_grad():
        return model(*inputs)


def ops(module: fx.GraphModule) -> list:
    return [(n.op, n.target if n.op != "call_module" else type(module.get_submodule(n.target)))
            for n in module.graph.nodes]


def modules_of(name: str, kind: type) -> int:
    return sum(isinstance(m, kind) for m in zoo.ZOO[name]().modules())


# Expected rewrites per zoo model on a symbolic trace (module rules apply there): every Dropout
# module goes, every BatchNorm2d (each follows a Conv2d in the zoo) is folded.
TRACED = {
    "mlp": {"remove_dropout": modules_of("mlp", torch.nn.Dropout), "canonical_relu": 3},
    "resnet": {"fold_conv2d_bn": modules_of("resnet", torch.nn.BatchNorm2d), "canonical_relu": 5},
    "transformer": {"remove_dropout": modules_of("transformer", torch.nn.Dropout)},
    "redundant": {"fold_conv2d_bn": 1, "relu_idempotent": 1, "remove_dropout": 1, "double_transpose": 1,
                  "mul_one": 1, "add_zero": 1},
}
assert all(all(TRACED[name].values()) for name in TRACED)


@pytest.mark.parametrize("name", sorted(TRACED))
def test_rule_pass_in_a_pass_manager(name: str) -> None:
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    traced = fx.symbolic_trace(model)
    nodes_before = len(traced.graph.nodes)
    code_before = traced.code
    rule_pass = fxrules.RulePass(RULES)
    assert isinstance(rule_pass, PassBase)

    result = PassManager(passes=[rule_pass], steps=3)(traced)

    assert isinstance(result, PassResult) and result.modified
    rewritten = result.graph_module
    assert rewritten is traced  # rewritten in place, as torch.fx passes do (apply_rules(..., inplace=True))
    assert traced.code != code_before
    counts = {rule: n for rule, n in rule_pass.counts.items() if n}
    assert {k: v for k, v in counts.items() if k != "canonical_relu"} == \
        {k: v for k, v in TRACED[name].items() if k != "canonical_relu"}
    assert counts.get("canonical_relu", 0) >= TRACED[name].get("canonical_relu", 0)
    # PassManager runs to a fixpoint: the second step found nothing more and said so
    assert len(rule_pass.reports) == 2 and not rule_pass.reports[1].applied
    kinds = ops(rewritten)
    assert ("call_module", torch.nn.Dropout) not in kinds
    assert ("call_module", torch.nn.BatchNorm2d) not in kinds
    assert len(rewritten.graph.nodes) < nodes_before
    expected, actual = run(model, inputs), run(rewritten, inputs)
    tolerance = 1e-5 if "fold_conv2d_bn" in TRACED[name] else 0.0  # folding bn is [approx]; the rest [exact]
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


def test_rule_pass_returns_its_input_when_nothing_fires() -> None:
    traced = fx.symbolic_trace(zoo.methods())
    rule_pass = fxrules.RulePass(fxrules.parse_rules("call_function torch.tanh(call_function torch.tanh($x)) -> $x\n"))
    result = rule_pass(traced)
    assert result == PassResult(traced, False) and result.graph_module is traced
    assert rule_pass.counts == {} and len(rule_pass.reports) == 1


def test_rule_pass_uses_example_inputs_for_metadata() -> None:
    rules = fxrules.parse_rules("call_function torch.flatten($x, 1) where $x.ndim == 2 -> $x\n")
    traced = fx.symbolic_trace(zoo.redundant())
    with pytest.raises(fxrules.RewriteError, match="example_inputs"):  # no shapes: the condition cannot be read
        fxrules.RulePass(rules)(traced)
    rule_pass = fxrules.RulePass(rules, example_inputs=zoo.example_inputs("redundant"))
    result = rule_pass(traced)
    assert result.modified and sum(rule_pass.counts.values()) == 1  # the second flatten, of a 2-D value
    torch.testing.assert_close(run(result.graph_module, zoo.example_inputs("redundant")),
                               run(traced, zoo.example_inputs("redundant")), atol=0, rtol=0)


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------

# What fires in the graph dynamo captures (modules are inlined: Dropout is F.dropout(x, p, False, False),
# nn.ReLU is F.relu, conv/bn are functions, so module rules do not apply).
COMPILED = {
    "mlp": {"remove_functional_dropout": 2, "canonical_relu": 3},
    "resnet": {"canonical_relu": 5},
    "transformer": {"remove_functional_dropout": 3},
    "redundant": {"remove_functional_dropout": 1, "relu_idempotent": 1, "double_transpose": 1, "mul_one": 1,
                  "add_zero": 1},
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compile_backend_eager(name: str) -> None:
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    backend = fxrules.compile_backend(RULES, then="eager")
    compiled = torch.compile(model, backend=backend)
    actual = run(compiled, inputs)
    expected = run(model, inputs)
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)  # every rule that fires here is [exact]
    assert len(backend.reports) == 1  # one captured graph
    report = backend.reports[0]
    counts = {k: v for k, v in backend.counts.items() if v}
    assert counts.keys() == COMPILED[name].keys() and all(counts[k] >= v for k, v in COMPILED[name].items())
    assert report.nodes_after < report.nodes_before or name == "resnet"  # resnet: relu respelled, not removed
    # a second call reuses the compiled graph: no new capture, no new rewrite
    torch.testing.assert_close(run(compiled, inputs), expected, atol=0, rtol=0)
    assert len(backend.reports) == 1


def test_compile_backend_rewrites_every_captured_graph() -> None:
    class Broken(torch.nn.Module):
        def forward(self, x):
            x = torch.relu(torch.relu(x)) * 1
            print("graph break")  # dynamo splits the function here: two graphs
            return x.transpose(0, 1).transpose(0, 1) + 0

    backend = fxrules.compile_backend(RULES, then="eager")
    x = torch.randn(3, 4)
    compiled = torch.compile(Broken(), backend=backend)
    torch.testing.assert_close(run(compiled, (x,)), torch.relu(x), atol=0, rtol=0)
    assert len(backend.reports) == 2
    assert [r.counts for r in backend.reports] == [{"relu_idempotent": 1, "mul_one": 1},
                                                    {"double_transpose": 1, "add_zero": 1}]


def test_compile_backend_with_dynamic_shapes_is_sound() -> None:
    # Conditions read dynamo's own metadata (meta['example_value'], symbolic sizes), so a
    # decision on a dynamic size is guarded: the graph rewritten for 3 rows is not reused for 4.
    rules = fxrules.parse_rules("""
rule sum_of_three [approx]:
    call_function torch.sum($x, 0) where $x.shape[0] == 3
    -> call_function operator.add(call_function operator.add(call_function operator.getitem($x, 0),
                                                              call_function operator.getitem($x, 1)),
                                  call_function operator.getitem($x, 2))

rule relu_idempotent [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
""")
    backend = fxrules.compile_backend(rules, then="eager")

    def f(x):
        return torch.sum(torch.relu(torch.relu(x)), 0)

    compiled = torch.compile(f, backend=backend, dynamic=True)
    for rows in (3, 4, 5, 3):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert backend.reports[0].counts == {"sum_of_three": 1, "relu_idempotent": 1}
    assert all(r.counts == {"relu_idempotent": 1} for r in backend.reports[1:])
    assert len(backend.reports) == 3  # 3 rows, then 4, then 5; 3 rows again reuses the first graph

    # a rule that reads no metadata keeps the graph dynamic: one capture for every size
    torch._dynamo.reset()
    relu_only = fxrules.compile_backend(rules.select(names=["relu_idempotent"]), then="eager")
    compiled = torch.compile(f, backend=relu_only, dynamic=True)
    for rows in (3, 4, 5):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x), f(x), atol=0, rtol=0)
    assert len(relu_only.reports) == 1


@pytest.mark.slow
def test_compile_backend_inductor() -> None:
    model = zoo.redundant()
    inputs = zoo.example_inputs("redundant")
    backend = fxrules.compile_backend(RULES)  # then="inductor" is the default
    compiled = torch.compile(model, backend=backend)
    torch.testing.assert_close(run(compiled, inputs), run(model, inputs), atol=1e-5, rtol=1e-5)
    assert {k for k, v in backend.counts.items() if v} == set(COMPILED["redundant"])


def test_compile_backend_then_callable_sees_the_rewritten_graph() -> None:
    seen = []

    def then(graph_module, example_inputs):
        seen.append([n.target for n in graph_module.graph.nodes if n.op == "call_function"])
        return graph_module.forward

    backend = fxrules.compile_backend(RULES, then=then)
    x = torch.randn(2, 3)
    compiled = torch.compile(lambda t: torch.relu(torch.relu(t)) + 0, backend=backend)
    torch.testing.assert_close(compiled(x), torch.relu(x), atol=0, rtol=0)
    assert seen == [[torch.relu]]


def test_compile_backend_errors(monkeypatch) -> None:
    with pytest.raises(ValueError, match="no torch.compile backend named 'nope'"):
        fxrules.compile_backend(RULES, then="nope")
    with pytest.raises(ValueError, match="on_error"):
        fxrules.compile_backend(RULES, then="eager", on_error="ignore")
    with pytest.raises(fxrules.RuleFileError, match="missing.fxr"):
        fxrules.compile_backend(str(ROOT / "missing.fxr"))

    import fxrules.integration as integration

    def failing(*args, **kwargs):
        raise fxrules.ModelError("simulated failure")

    monkeypatch.setattr(integration, "apply_rules", failing)
    x = torch.randn(2, 3)

    def f(t):
        return torch.relu(torch.relu(t)) * 1

    skipping = fxrules.compile_backend(RULES, then="eager", on_error="skip")
    with pytest.warns(RuntimeWarning, match="simulated failure"):
        out = torch.compile(f, backend=skipping)(x)
    torch.testing.assert_close(out, torch.relu(x), atol=0, rtol=0)  # the graph ran unrewritten
    assert len(skipping.errors) == 1 and skipping.reports == []

    torch._dynamo.reset()
    raising = fxrules.compile_backend(RULES, then="eager")
    with pytest.raises(Exception) as info:
        torch.compile(f, backend=raising)(x)
    chain, error = [], info.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, fxrules.ModelError) for e in chain)


@pytest.mark.slow
def test_lazy_exports_do_not_import_torch_early() -> None:
    code = ("import sys, fxrules\n"
            "assert 'torch' not in sys.modules\n"
            "assert fxrules.RulePass.__module__ == 'fxrules.integration'\n"
            "assert callable(fxrules.compile_backend) and 'torch' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------
# docs/comparison.md: its scripts print what the page says they print
# ---------------------------------------------------------------------------


def test_comparison_doc_scripts_print_what_the_page_shows() -> None:
    import contextlib
    import io
    import re

    page = (ROOT / "docs" / "comparison.md").read_text(encoding="utf-8")
    outputs = re.findall(r"```text[^\n]*\n(.*?)```", page, flags=re.S)
    scripts = re.findall(r"<summary>(\w+\.py)[^<]*</summary>\s*```python[^\n]*\n(.*?)```", page, flags=re.S)
    assert [name for name, _ in scripts] == ["demo.py", "safety.py"] and len(outputs) == 2
    for (name, code), expected in zip(scripts, outputs):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})  # the page's own code, in-process
        assert printed.getvalue() == expected, f"{name} now prints:\n{printed.getvalue()}"
