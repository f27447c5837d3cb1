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
