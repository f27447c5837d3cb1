"""In-place calls on a matched temporary (issue 19): MobileNetV3's hardswish.

``x * F.relu6(x + 3, inplace=True) / 6`` writes the sum ``x + 3`` in place. That write is
unobservable when the written value is a fresh temporary (no input, parameter, buffer or view
shares its storage) that nothing but the in-place call reads: the planner lets such a match be
rewritten. Every way the write could be seen outside the match is refused, with outputs kept.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrules
from fxrules.engine import planner
from fxrules.engine.planner import Effects
from fxrules.engine.refusals import RefusalCode

HARDSWISH = """
use torch.nn.functional as F
rule hardswish [approx]:
    call_function operator.truediv(
        call_function operator.mul($x, call_function F.relu6(call_function operator.add($x, 3), inplace=True)), 6)
    -> call_function F.hardswish($x)
"""

HARDSWISH_MODULE = """
rule hardswish_module [approx]:
    call_function operator.truediv(
        call_function operator.mul($x, call_module ReLU6{inplace=True}(call_function operator.add($x, 3))), 6)
    -> call_function F.hardswish($x)
"""

CLAMP_METHOD = """
rule hardswish_clamp_ [approx]:
    call_function operator.truediv(
        call_function operator.mul($x, call_method clamp_(call_function operator.add($x, 3), 0, 6)), 6)
    -> call_function F.hardswish($x)
"""


def rules(text: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(text, source="inplace.fxr")


def codes(result) -> list:
    return [r.code for r in result.report.rejected]


def targets(module) -> list:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


class HardSwish(nn.Module):
    def forward(self, x):
        return x * F.relu6(x + 3, inplace=True) / 6


class HardSwishModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x):
        return x * self.act(x + 3) / 6


class HardSwishClamp(nn.Module):
    def forward(self, x):
        return x * (x + 3).clamp_(0, 6) / 6


class HardSwishCommuted(nn.Module):
    """timm's spelling: the relu6 first, the sum `3 + x` (both commute: one rule covers them)."""

    def forward(self, x):
        return F.relu6(3 + x, inplace=True) * x / 6


@pytest.mark.parametrize("model_class, text", [(HardSwish, HARDSWISH), (HardSwishModule, HARDSWISH_MODULE),
                                               (HardSwishClamp, CLAMP_METHOD), (HardSwishCommuted, HARDSWISH)])
def test_an_in_place_call_on_a_private_temporary_is_rewritten(model_class, text):
    model = model_class()
    x = torch.randn(2, 8) * 4
    expected = model(x.clone())
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert sum(result.counts.values()) == 1 and codes(result) == []
    assert targets(result.module) == [F.hardswish]
    assert torch.allclose(result.module(x.clone()), expected, atol=1e-6)


# ---------------------------------------------------------------------------
# Where the write could be seen: refused, outputs kept
# ---------------------------------------------------------------------------


class TemporaryReadAfter(nn.Module):
    """The sum is read again after the write: its other user sees the clamped values."""

    def forward(self, x):
        t = x + 3
        return x * F.relu6(t, inplace=True) / 6 + t


class WritesAView(nn.Module):
    """The written value is a view of the input: the write reaches the caller's tensor."""

    def forward(self, x):
        return x * F.relu6(x.view(-1), inplace=True) / 6


class WritesTheInput(nn.Module):
    def forward(self, x):
        return x * F.relu6(x, inplace=True) / 6


class WritesAParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8) * 4, requires_grad=False)

    def forward(self, x):
        return x * F.relu6(self.w, inplace=True) / 6


class WritesABuffer(fx.GraphModule):
    """Built as a graph: symbolic_trace runs ``F.relu6`` on a buffer (a plain tensor, not a proxy) eagerly."""

    def __init__(self):
        root = nn.Module()
        root.register_buffer("b", torch.randn(8) * 4)
        graph = fx.Graph()
        x = graph.placeholder("x")
        written = graph.call_function(F.relu6, (graph.get_attr("b"),), {"inplace": True})
        graph.output(graph.call_function(operator.truediv, (graph.call_function(operator.mul, (x, written)), 6)))
        super().__init__(root, graph)


class SameTemporaryTwice(nn.Module):
    """Both operands read the sum, one after the relu6 wrote it: x*x-style reuse of a written value."""

    def forward(self, x):
        t = x + 3
        return t * F.relu6(t, inplace=True) / 6


VIEW_RULE = """
use torch.nn.functional as F
rule r [changes]:
    call_function operator.truediv(
        call_function operator.mul($x, call_function F.relu6(call_method view($x, -1), inplace=True)), 6)
    -> call_function F.hardswish($x)
"""
INPUT_RULE = """
use torch.nn.functional as F
rule r [changes]:
    call_function operator.truediv(call_function operator.mul($x, call_function F.relu6($x, inplace=True)), 6)
    -> call_function F.hardswish($x)
"""
ATTR_RULE = """
use torch.nn.functional as F
rule r [changes]:
    call_function operator.truediv(call_function operator.mul($x, call_function F.relu6(get_attr $w, inplace=True)), 6)
    -> call_function F.hardswish($x)
"""
SHARED_RULE = """
use torch.nn.functional as F
rule r [changes]:
    call_function operator.truediv(
        call_function operator.mul(call_function operator.add($x, 3) as t, call_function F.relu6(t, inplace=True)), 6)
    -> call_function F.hardswish($x)
"""


@pytest.mark.parametrize("model_class, text, code", [
    (TemporaryReadAfter, HARDSWISH, RefusalCode.INTERIOR_USED_OUTSIDE),
    (WritesAView, VIEW_RULE, RefusalCode.DROPS_SIDE_EFFECT),
    (WritesTheInput, INPUT_RULE, RefusalCode.DROPS_SIDE_EFFECT),
    (WritesAParameter, ATTR_RULE, RefusalCode.DROPS_SIDE_EFFECT),
    (WritesABuffer, ATTR_RULE, RefusalCode.DROPS_SIDE_EFFECT),
    (SameTemporaryTwice, SHARED_RULE, RefusalCode.DROPS_SIDE_EFFECT),
], ids=["other-user", "view-of-input", "input", "parameter", "buffer", "read-twice-in-match"])
def test_a_write_that_could_be_seen_is_refused_and_outputs_kept(model_class, text, code):
    torch.manual_seed(0)
    model = model_class()
    x = torch.randn(8) * 4
    reference = model_class()
    reference.load_state_dict(model.state_dict())
    x_ref = x.clone()
    expected = reference(x_ref)
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x.clone(),))
    assert result.counts == {} and codes(result) == [code]
    x_run = x.clone()
    assert torch.equal(result.module(x_run), expected)
    assert torch.equal(x_run, x_ref)  # the write to the caller's tensor, when there is one, still happens
    for (name, value), (_, kept) in zip(reference.state_dict().items(), result.module.state_dict().items()):
        assert torch.equal(value, kept), name


def test_an_unknown_in_place_call_is_never_a_private_write():
    """A function the engine does not know may write more than it declares: always refused."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    t = graph.call_function(operator.add, (x, 3))
    known = graph.call_function(F.relu6, (t,), {"inplace": True})
    graph.output(known)
    effects = Effects(lambda name: None)
    assert planner.is_private_temporary(t, known, effects)
    assert planner.writes_only_match_temporaries(known, effects)

    def opaque(v, inplace=False):
        return v

    graph2 = fx.Graph()
    x2 = graph2.placeholder("x")
    t2 = graph2.call_function(operator.add, (x2, 3))
    unknown = graph2.call_function(opaque, (t2,), {"inplace": True})
    graph2.output(unknown)
    assert not planner.writes_only_match_temporaries(unknown, Effects(lambda name: None))


def test_which_values_are_private_temporaries():
    graph = fx.Graph()
    x = graph.placeholder("x")
    w = graph.get_attr("w")
    fresh = graph.call_function(operator.add, (x, 3))
    view = graph.call_method("view", (x, -1))
    inplace = graph.call_method("add_", (graph.call_function(operator.mul, (x, 2)), 1))
    writers = {}
    for name, value in {"fresh": fresh, "view": view, "inplace": inplace, "x": x, "w": w}.items():
        writers[name] = graph.call_function(F.relu6, (value,), {"inplace": True})
    graph.output(tuple(writers.values()))
    effects = Effects(lambda name: None, lambda name: torch.zeros(3))
    private = {name: planner.is_private_temporary(value, writers[name], effects)
               for name, value in {"fresh": fresh, "view": view, "inplace": inplace, "x": x, "w": w}.items()}
    assert private == {"fresh": True, "view": False, "inplace": False, "x": False, "w": False}
    extra = graph.call_function(torch.neg, (fresh,))  # a second reader
    assert not planner.is_private_temporary(fresh, writers["fresh"], effects)
    graph.erase_node(extra)
    assert planner.is_private_temporary(fresh, writers["fresh"], effects)


# ---------------------------------------------------------------------------
# torch.export graphs: operators whose schema writes (aten.relu6_, aten.detach_)
# ---------------------------------------------------------------------------
#
# torch calls every operator with a mutable schema impure, for its writes alone; the planner counts
# those writes argument by argument, so an aten in-place call on a private temporary is removable as
# the traced spellings above are. The case export makes everywhere: a tensor constant written in
# forward (`torch.tensor(2.0)`) is lifted and read as `detach_(lift_fresh_copy(c))`, a fresh copy
# detached in place that nothing else reads.

aten = torch.ops.aten

ATEN_HARDSWISH = """
rule aten_hardswish [approx]:
    call_function aten.div.Tensor(
        call_function aten.mul.Tensor($x, call_function aten.relu6_.default(call_function aten.add.Tensor($x, 3))), 6)
    -> call_function aten.hardswish.default($x)
"""

LIFTED = """
rule read_lifted_constant "x * (a fresh copy of c, detached in place) is x * c" [exact]:
    call_function aten.mul.Tensor(
        $x, call_function aten.detach_.default(call_function aten.lift_fresh_copy.default($c)))
    where is_constant($c)
    -> call_function aten.mul.Tensor($x, $c)
"""

DETACH_IN_PLACE = """
rule detach_out_of_place "x * t.detach_() is x * t.detach() where t is a temporary" [exact]:
    call_function aten.mul.Tensor($x, call_function aten.detach_.default($t))
    -> call_function aten.mul.Tensor($x, call_function aten.detach.default($t))
"""

RELU_IN_PLACE = """
rule relu_out_of_place [exact]:
    call_function aten.mul.Tensor($x, call_function aten.relu_.default($t))
    -> call_function aten.mul.Tensor($x, call_function aten.relu.default($t))
"""


class TimesLiftedConstant(nn.Module):
    def forward(self, x):
        return x * torch.tensor(2.5)


def _exported(model, *inputs):
    return torch.export.export(model, inputs)


def test_an_exported_in_place_operator_on_a_private_temporary_is_rewritten():
    x = torch.randn(2, 8) * 4
    program = _exported(HardSwish(), x)
    assert aten.relu6_.default in targets(program.module())
    expected = program.module()(x.clone())
    result = fxrules.apply_rules(program, rules(ATEN_HARDSWISH))
    assert result.counts == {"aten_hardswish": 1} and codes(result) == []
    assert targets(result.module) == [aten.hardswish.default]
    assert torch.allclose(result.module(x.clone()), expected, atol=1e-6)


@pytest.mark.parametrize("text, name", [(LIFTED, "read_lifted_constant"), (DETACH_IN_PLACE, "detach_out_of_place")])
def test_a_lifted_constant_is_read_through_its_fresh_copy(text, name):
    x = torch.randn(3, 4)
    program = _exported(TimesLiftedConstant(), x)
    before = targets(program.module())
    assert aten.lift_fresh_copy.default in before and aten.detach_.default in before
    expected = program.module()(x)
    result = fxrules.apply_rules(program, rules(text))
    assert result.counts == {name: 1} and codes(result) == []
    after = targets(result.module)
    assert aten.detach_.default not in after
    if name == "read_lifted_constant":
        assert after == [aten.mul.Tensor]  # the copy is gone too: mul reads the constant itself
    assert torch.equal(result.module(x), expected)


class _Graph(fx.GraphModule):
    """An exported-style graph built by hand: `c` a constant, `t` what `detach_` writes, and what else reads."""

    def __init__(self, build):
        root = nn.Module()
        root.c = torch.tensor(2.5)
        graph = fx.Graph()
        x = graph.placeholder("x")
        graph.output(build(graph, x, graph.get_attr("c")))
        super().__init__(root, graph)


def _copy_read_again(graph, x, c):
    """The fresh copy has a second reader: it sees the copy after the detach (and may see its data)."""
    copy = graph.call_function(aten.lift_fresh_copy.default, (c,))
    product = graph.call_function(aten.mul.Tensor, (x, graph.call_function(aten.detach_.default, (copy,))))
    return (product, graph.call_function(aten.add.Tensor, (copy, 1)))


def _view_of_copy_written(graph, x, c):
    """The in-place call writes a view of the copy: no temporary of its own (torch refuses to detach a
    view in place, so the write here is relu_)."""
    copy = graph.call_function(aten.lift_fresh_copy.default, (c,))
    view = graph.call_function(aten.alias.default, (copy,))
    return graph.call_function(aten.mul.Tensor, (x, graph.call_function(aten.relu_.default, (view,))))


def _input_detached(graph, x, c):
    """The detach writes the caller's tensor (`x.detach_()`: the caller sees its tensor detached)."""
    return graph.call_function(aten.mul.Tensor, (x, graph.call_function(aten.detach_.default, (x,))))


def _constant_detached(graph, x, c):
    """The detach writes the module's constant itself, no copy between."""
    return graph.call_function(aten.mul.Tensor, (x, graph.call_function(aten.detach_.default, (c,))))


@pytest.mark.parametrize("build, text, code", [
    (_copy_read_again, DETACH_IN_PLACE, RefusalCode.DROPS_SIDE_EFFECT),
    (_copy_read_again, LIFTED, RefusalCode.INTERIOR_USED_OUTSIDE),
    (_view_of_copy_written, RELU_IN_PLACE, RefusalCode.DROPS_SIDE_EFFECT),
    (_input_detached, DETACH_IN_PLACE, RefusalCode.DROPS_SIDE_EFFECT),
    (_constant_detached, DETACH_IN_PLACE, RefusalCode.DROPS_SIDE_EFFECT),
], ids=["copy-read-again", "copy-read-again-matched", "view-of-copy", "input", "constant"])
def test_a_detach_in_place_that_could_be_seen_is_refused(build, text, code):
    model = _Graph(build)
    x = torch.randn(3, 4, requires_grad=True)
    expected = _Graph(build)(x.detach().clone().requires_grad_())
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x.detach().clone().requires_grad_(),))
    assert result.counts == {} and codes(result) == [code]
    assert targets(result.module) == targets(model)  # untouched
    got = result.module(x.detach().clone().requires_grad_())
    for a, b in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        assert torch.equal(a, b)


def test_torch_impurity_less_the_writes_a_schema_declares():
    from fxrules.engine import fxaccess

    for op in (aten.detach_.default, aten.relu6_.default, aten.copy_.default, aten.add.out):
        assert fxaccess.function_is_impure(op, (), {})  # torch: impure for its writes
        assert not fxaccess.function_is_impure_besides_writes(op, (), {})
    assert fxaccess.function_is_impure_besides_writes(aten._print.default, ("x",), {})  # an effect torch registers
    assert fxaccess.function_is_impure_besides_writes(torch.ops.inductor.accumulate_grad_.default, (), {})
    assert not fxaccess.function_is_impure_besides_writes(aten.add.Tensor, (), {})
