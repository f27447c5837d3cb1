"""The API ``fxrules apply`` and ``explain`` render: ``capture``, ``apply_and_compare``, ``compare_outputs``.

The command line only parses arguments and renders these values (tests/tools/test_cli_apply.py checks
the rendering); here they are checked as a Python caller uses them.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fxrules
from fxrules import zoo
from fxrules.api import max_abs_difference

CLEANUP = fxrules.LIBRARY / "cleanup"
# No conditions on shapes: these apply without example inputs.
SIMPLE = """\
rule remove_dropout [exact]:
    call_module Dropout($x) as d where not d.training -> $x

rule double_transpose [exact]:
    call_method transpose(call_method transpose($x, $a, $b), $a, $b) -> $x
"""
BREAKS = "rule breaks [changes]:\n    call_function torch.relu($x) -> call_method view($x, 7, 7)\n"


def _image() -> tuple:
    return (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def cleanup():
    return fxrules.load_rules(CLEANUP)


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            return x * 2
        return x


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout()

    def forward(self, x, y):
        return {"a": self.drop(x), "b": [y.transpose(0, 1).transpose(0, 1), x + y]}


def test_apply_and_compare_holds_the_rewrite_outputs_code_and_timings(cleanup):
    model = zoo.redundant()
    notes: list[str] = []
    found = fxrules.apply_and_compare(model, cleanup, example_inputs=_image(), on_phase=notes.append)
    assert isinstance(found, fxrules.ApplyComparison)
    assert notes == ["tracing", "rewriting 19 nodes", "comparing outputs"]
    expected = fxrules.apply_rules(zoo.redundant(), cleanup, example_inputs=_image())
    assert found.result.counts == expected.counts and found.report is found.result.report
    assert found.module is found.result.module
    assert found.report.nodes_before == 19 == len(found.before.graph.nodes)
    # one output, a tensor: compared, equal up to float rounding, shape kept
    (only,) = found.outputs
    assert only.path == "" and only.shape_before == only.shape_after == (2, 10) and not only.shape_changed
    assert found.max_abs_difference == only.max_abs_difference < 1e-5
    with torch.no_grad():
        assert torch.equal(found.outputs_after, found.module(*_image()))
    # the code torch.fx generates, before and after, without trailing blanks
    assert "self.drop(" in found.code_before and "self.drop(" not in found.code_after
    assert found.code_after.endswith("\n") and not any(line != line.rstrip() for line in found.code_after.splitlines())
    assert found.timings.capture > 0 and found.timings.rewrite >= found.report.seconds > 0
    assert found.timings.compare > 0 and not found.exported
    with pytest.raises(AttributeError):
        found.outputs = None  # a frozen value


class WithConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout()

    def forward(self, x):
        return self.drop(x) + torch.tensor([1.0, 2.0])  # the tracer stores the constant on the traced module


def test_the_model_is_left_as_it_was(cleanup):
    model = zoo.redundant()
    code = torch.fx.symbolic_trace(zoo.redundant()).code
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fxrules.apply_and_compare(model, cleanup, example_inputs=_image())
    assert torch.fx.symbolic_trace(model).code == code
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    constant = WithConstant().eval()
    attributes = set(vars(constant))
    found = fxrules.apply_and_compare(constant, fxrules.parse_rules(SIMPLE), example_inputs=(torch.ones(3, 2),))
    assert found.result.counts == {"remove_dropout": 1} and found.equal
    assert set(vars(constant)) == attributes and not hasattr(constant, "_tensor_constant0")


class WritesItsInput(nn.Module):
    def forward(self, x):
        y = torch.relu(torch.relu(x))
        x.mul_(2)  # the caller's tensor, written in place
        return y


def test_each_run_of_the_comparison_gets_the_inputs_as_given():
    """A model that writes its input: the run before must not hand the run after doubled values (the
    comparison said 1.24e+03 for a rewrite that changes nothing). The caller's inputs are left as given."""
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    given = x.clone()
    found = fxrules.apply_and_compare(WritesItsInput(), fxrules.LIBRARY / "cleanup", example_inputs=(x,))
    assert found.result.counts == {"relu_idempotent": 1}
    assert found.max_abs_difference == 0.0
    assert torch.equal(x, given)


def test_without_inputs_nothing_is_compared():
    notes: list[str] = []
    found = fxrules.apply_and_compare(zoo.redundant(), fxrules.parse_rules(SIMPLE), on_phase=notes.append)
    assert found.outputs is None and found.outputs_after is None and found.example_inputs is None
    assert found.max_abs_difference is None and found.equal is None and found.timings.compare == 0.0
    assert notes == ["tracing", "rewriting 19 nodes"]


def test_keep_before_false_builds_no_graph_before():
    rules = fxrules.parse_rules(SIMPLE)
    notes: list[str] = []
    found = fxrules.apply_and_compare(zoo.redundant(), rules, keep_before=False, on_phase=notes.append)
    assert found.before is None and found.code_before is None and found.timings.capture == 0.0
    assert notes == ["tracing", "rewriting"]  # the engine traced: no node count before it did
    assert found.result.counts == fxrules.apply_rules(zoo.redundant(), rules).counts == \
        {"remove_dropout": 1, "double_transpose": 1}


def test_export_compares_with_the_unlifted_module():
    rules = fxrules.parse_rules("rule aten_relu_idempotent [exact]:\n    call_function aten.relu.default("
                                "call_function aten.relu.default($x)) -> call_function aten.relu.default($x)\n")
    found = fxrules.apply_and_compare(zoo.redundant(), rules, example_inputs=_image(), export=True,
                                      keep_before=False)
    assert found.exported and found.before is not None  # an export keeps its unlifted module
    assert found.result.counts == {"aten_relu_idempotent": 1} and found.equal is True
    assert "torch.ops.aten.relu.default" in found.code_before
    with pytest.raises(ValueError, match="needs example_inputs"):
        fxrules.apply_and_compare(zoo.redundant(), rules, export=True)


def test_nested_outputs_are_compared_one_by_one():
    rules = fxrules.parse_rules("rule remove_dropout [exact]:\n    call_module Dropout($x) as d where not "
                                "d.training -> $x\n")
    inputs = (torch.ones(2, 3), torch.ones(2, 3))
    found = fxrules.apply_and_compare(Pair().eval(), rules, example_inputs=inputs)
    assert [d.path for d in found.outputs] == ["['a']", "['b'][0]", "['b'][1]"]
    assert found.equal is True and found.max_abs_difference == 0.0


def test_compare_outputs_reports_shape_changes_values_and_structure():
    a, b = torch.zeros(2, 3), torch.zeros(3, 2)
    (changed,) = fxrules.compare_outputs(a, b)
    assert changed.shape_changed and changed.max_abs_difference == math.inf and not changed.equal
    (close,) = fxrules.compare_outputs(a, a + 0.25)
    assert close.max_abs_difference == 0.25 and not close.shape_changed
    assert [(d.path, d.max_abs_difference, d.shape_before) for d in fxrules.compare_outputs((a, 3), (a, 4))] == \
        [("[0]", 0.0, (2, 3)), ("[1]", math.inf, None)]
    (short,) = fxrules.compare_outputs([a, a], [a])  # the structures differ: one entry for the whole
    assert short.path == "" and short.max_abs_difference == math.inf
    (nan,) = fxrules.compare_outputs(torch.tensor([float("nan")]), torch.tensor([0.0]))
    assert math.isnan(nan.max_abs_difference)
    assert fxrules.compare_outputs([], []) == () and max_abs_difference(()) == 0.0
    (empty,) = fxrules.compare_outputs(torch.zeros(0), torch.zeros(0))
    assert empty.equal


def test_a_rewrite_that_breaks_the_model_raises_with_the_result(capfd):
    class Net(nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    with pytest.raises(fxrules.ComparisonError, match=r"the rewritten module does not run on the example inputs "
                                                      r"\(the original does\): RuntimeError: shape") as info:
        fxrules.apply_and_compare(Net(), fxrules.parse_rules(BREAKS), example_inputs=(torch.randn(2, 3),))
    assert isinstance(info.value, fxrules.FxrulesError)
    assert info.value.result.counts == {"breaks": 1}
    assert "Traceback" not in capfd.readouterr().err  # torch's print of the generated code's traceback: dropped


def test_models_that_cannot_be_captured_or_run_are_model_errors(cleanup):
    with pytest.raises(fxrules.ModelError, match=r"^Branchy does not trace with torch.fx \(TraceError: .*\); "
                                                 r"try export=True with example_inputs$"):
        fxrules.apply_and_compare(Branchy(), cleanup)
    with pytest.raises(fxrules.ModelError, match=r"^torch.export failed: "):
        fxrules.apply_and_compare(Branchy(), cleanup, example_inputs=(torch.randn(3),), export=True)
    with pytest.raises(fxrules.ModelError, match=r"^the model does not run on the example inputs: RuntimeError"):
        fxrules.apply_and_compare(zoo.redundant(), cleanup, example_inputs=(torch.randn(2, 5),))
    with pytest.raises(fxrules.ModelError, match="expected an nn.Module"):
        fxrules.capture(42)


def test_capture_records_stack_traces_and_says_what_the_engine_needs():
    inputs = _image()
    traced = fxrules.capture(zoo.redundant(), example_inputs=inputs, stack_traces=True)
    assert isinstance(traced, fxrules.Capture) and traced.subject is traced.before and not traced.exported
    assert traced.nodes == 19 and traced.engine_inputs == inputs
    assert any("zoo.py" in (n.meta.get("stack_trace") or "") for n in traced.before.graph.nodes)
    plain = fxrules.capture(zoo.redundant())
    assert not any(n.meta.get("stack_trace") for n in plain.before.graph.nodes)
    exported = fxrules.capture(zoo.redundant(), example_inputs=inputs, export=True)
    assert isinstance(exported.subject, torch.export.ExportedProgram) and exported.engine_inputs is None
    assert isinstance(exported.before, torch.fx.GraphModule)
