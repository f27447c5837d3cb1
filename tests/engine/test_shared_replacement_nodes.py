"""Shared replacement nodes (issue 19): `CALL as name` in a replacement is built once, used by name."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

import fxrules
from fxrules.errors import RuleFileError
from fxrules.lang.load import parse_source
from fxrules.lang.printer import print_file
from fxrules.lang.source import Source

RULE = """rule narrow_pair_to_split [exact]:
    call_function torch.narrow($x, 0, 0, 2), call_function torch.narrow($x, 0, 2, 2)
    -> call_function operator.getitem(call_function torch.split($x, 2) as s, 0), call_function operator.getitem(s, 1)
"""


class Halves(torch.nn.Module):
    def forward(self, x):
        return torch.narrow(x, 0, 0, 2) * 2, torch.narrow(x, 0, 2, 2) + 1


def test_two_outputs_use_one_split_node():
    result = fxrules.apply_rules(fx.symbolic_trace(Halves()), fxrules.parse_rules(RULE))
    targets = [n.target for n in result.module.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.split) == 1 and targets.count(operator.getitem) == 2
    x = torch.randn(4, 3)
    for got, want in zip(result.module(x), Halves()(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_printed_back_the_same():
    file = parse_source(Source("<t>", RULE))
    assert parse_source(Source("<t>", print_file(file))) == file


@pytest.mark.parametrize("text, code", [
    ("call_function torch.relu($x) -> call_function torch.neg($x) as n\n", "bad-replacement"),  # never used
    ("call_function torch.relu($x) as r -> call_function torch.add(call_function torch.neg($x) as r, r)\n",
     "bad-replacement"),  # names a pattern node
    ("call_function torch.relu($x) -> call_function torch.add($x as n, n)\n", "bad-replacement"),  # not a call
    ("call_function torch.relu($x) -> call_function torch.add(call_function torch.neg(n) as n, $x)\n",
     "unbound-name"),  # used inside its own definition
])
def test_misuses_are_reported(text, code):
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules(text)
    assert code in [d.code for d in info.value.diagnostics]


# -- a shared node is checked as the same call without `as` is -------------------------------------------

class ReluThenAdd(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + x


def _codes(result) -> list:
    return [r.code.value for r in result.report.rejected]


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_call_that_writes_its_input_is_refused(shared):
    """``add_($x, 1)`` would change ``$x`` for the rest of the graph; naming the call (to use it twice)
    must not hide the write from the planner."""
    call = "call_method add_($x, 1)"
    value = f"call_function torch.add({call} as s, s)" if shared else f"call_function torch.add({call}, {call})"
    rules = fxrules.parse_rules(f"rule w [changes]: call_function torch.relu($x) -> {value}")
    x = torch.ones(3)
    result = fxrules.apply_rules(fx.symbolic_trace(ReluThenAdd()), rules)
    assert result.counts == {} and _codes(result) == ["replacement-writes-input"]
    assert torch.equal(result.module(x.clone()), ReluThenAdd()(x.clone()))


class DrawThenRelu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.bernoulli(x))


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_call_that_draws_anew_is_refused(shared):
    """Under [exact] a replacement may keep the draws it matched, not make new ones: ``bernoulli(neg($x))``
    is a new draw, named or not."""
    call = "call_function torch.bernoulli(call_function torch.neg($x))"
    value = f"call_function torch.add({call} as s, s)" if shared else f"call_function torch.relu({call})"
    rules = fxrules.parse_rules(
        f"rule d [exact]: call_function torch.relu(call_function torch.bernoulli($x)) -> {value}")
    result = fxrules.apply_rules(fx.symbolic_trace(DrawThenRelu()), rules)
    assert result.counts == {} and "changes-random-draws" in _codes(result)


class ScaledWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return self.w * 1, x


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_view_of_a_parameter_returned_is_refused(shared):
    """The model returns a fresh tensor; a replacement returning a view of its parameter (through a split
    the replacement names or not) would hand the caller the model's state."""
    split = "call_function torch.split(get_attr $w, 4)"
    first = f"call_function operator.getitem({split} as s, 0)" if shared else f"call_function operator.getitem({split}, 0)"
    again = "call_function operator.getitem(s, 0)" if shared else f"call_function operator.getitem({split}, 0)"
    rules = fxrules.parse_rules(
        f"rule v [changes]: call_function operator.mul(get_attr $w, 1) -> call_method expand_as({first}, {again})")
    result = fxrules.apply_rules(fx.symbolic_trace(ScaledWeight()), rules)
    assert result.counts == {}, result.module.code
    assert "output-alias-introduced" in _codes(result)


class TwoOutputsOneStrided(torch.nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        b = torch.sigmoid(x)
        return a, b.view(-1)  # `view` depends on b's strides


@pytest.mark.parametrize("shared", [False, True])
def test_a_root_replaced_by_a_shared_layout_choosing_call_is_refused_without_metadata(shared):
    """Without metadata an [exact] rule may not replace a root whose strides a later node reads by a call
    that chooses its layout by its input's (``reshape``): replacing it by the shared node that call
    builds (a later use, ``s``) must be refused as the call itself is."""
    call = "call_method reshape(call_method transpose($x, 0, 1), 4, 3)"
    second = "s" if shared else call
    first = f"call_function torch.add({call} as s, 0)" if shared else "call_function torch.relu($x)"
    rules = fxrules.parse_rules(
        f"rule l [exact]: call_function torch.relu($x), call_function torch.sigmoid($x) -> {first}, {second}")
    result = fxrules.apply_rules(fx.symbolic_trace(TwoOutputsOneStrided()), rules)
    assert result.counts == {}, result.module.code
    assert "layout-changed" in _codes(result)
