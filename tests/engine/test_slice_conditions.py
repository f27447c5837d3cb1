"""Slices in conditions and computed replacement values (issue 19): `$x.shape[1:]`, `$x.shape[:-1]`,
`$dims[::2]`, negative bounds. A slice's bounds are ints or None: a bound whose kind the checker knows
otherwise is `bad-condition`; one that is not an int at run time (a capture bound to 1.5) refuses that
match with `condition-raised`. A slice never makes a sequence longer, so it needs no budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxrules
from fxrules.engine.refusals import RefusalCode
from fxrules.errors import RuleFileError


def rules(text: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(text, source="slices.fxr")


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


SHAPE_TAIL = """
rule tail [changes]:
    call_function torch.relu($x)
    where $x.shape[1:] == (3, 4) and $x.shape[:-1] == [2, 3] and $x.shape[-2:] == $x.shape[1:]
    where $x.shape[::2] == (2, 4) and $x.shape[1:2] == [3] and $x.shape[:len($x.shape) - 2] == [2]
    -> call_function torch.tanh($x)
"""


@pytest.mark.parametrize("shape, fires", [((2, 3, 4), True), ((2, 3, 5), False), ((1, 3, 4), False),
                                          ((2, 3, 4, 1), False)])
def test_shape_slices_in_conditions(shape, fires):
    x = torch.randn(*shape)
    result = fxrules.apply_rules(Relu(), rules(SHAPE_TAIL), example_inputs=(x,))
    assert result.counts == ({"tail": 1} if fires else {})
    assert torch.equal(result.module(x), torch.tanh(x) if fires else torch.relu(x))


class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(-2)


def test_a_computed_replacement_value_with_slices():
    """x.flatten(-2) as the reshape it is: every dim but the last two, then their product."""
    text = """
    rule flatten_last_two_as_reshape [exact]:
        call_method flatten($x, -2)
        where $x.ndim >= 2
        -> call_method reshape($x, {tuple($x.shape[:-2]) + ($x.shape[-2] * $x.shape[-1],)})
    """
    x = torch.randn(2, 3, 4, 5)
    result = fxrules.apply_rules(Flatten(), rules(text), example_inputs=(x,))
    assert result.counts == {"flatten_last_two_as_reshape": 1}
    (reshape,) = [n for n in result.module.graph.nodes if n.op == "call_method"]
    assert reshape.target == "reshape" and tuple(reshape.args[1]) == (2, 3, 20)
    assert torch.equal(result.module(x), Flatten()(x))


class Permute(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 1, 3)


def test_slices_of_a_variadic_capture():
    """A permutation that keeps its first and last dims and swaps the two inner ones, read with slices."""
    text = """
    rule inner_swap [exact]:
        call_method permute($x, *$p)
        where is_literal($p) and len($p) == 4 and $p[:1] == [0] and $p[-1:] == [3] and $p[1:3] == [2, 1]
        -> call_method transpose($x, 1, 2)
    """
    x = torch.randn(2, 3, 4, 5)
    result = fxrules.apply_rules(Permute(), rules(text), example_inputs=(x,))
    assert result.counts == {"inner_swap": 1}
    assert torch.equal(result.module(x), Permute()(x))


def test_a_bound_that_is_not_an_int_at_run_time_is_a_refusal():
    class Add(nn.Module):
        def forward(self, x):
            return torch.add(x, 1.5)

    text = "rule r [changes]: call_function torch.add($x, $k) where $x.shape[$k:] == [4] -> call_function torch.sub($x, $k)"
    x = torch.randn(3, 4)
    result = fxrules.apply_rules(Add(), rules(text), example_inputs=(x,))
    assert result.counts == {}
    (refused,) = result.report.rejected
    assert refused.code == RefusalCode.CONDITION_RAISED and "slice indices must be integers" in refused.reason
    assert torch.equal(result.module(x), x + 1.5)


@pytest.mark.parametrize("cond, column", [
    ("$x.shape[1.5:] == [4]", 63),  # a float bound
    ("$x.shape[:\"a\"] == [4]", 64),  # a string bound
    ("$x.shape[::$x.dtype] == [4]", 65),  # a dtype step
    ("$x.ndim[1:] == [4]", 54),  # an int is not a sequence
])
def test_bounds_of_a_known_wrong_kind_are_bad_conditions(cond, column):
    text = f"rule r [changes]: call_function torch.relu($x) where {cond} -> call_function torch.tanh($x)"
    with pytest.raises(RuleFileError) as info:
        rules(text)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "bad-condition" and (diagnostic.line, diagnostic.column) == (1, column), diagnostic


def test_a_slice_of_a_shape_is_a_shape_to_the_checker():
    """`$x.shape[1:] * 1.5` always raises, as `$x.shape * 1.5` does."""
    text = "rule r [changes]: call_function torch.relu($x) where $x.shape[1:] * 1.5 == [] -> call_function torch.tanh($x)"
    with pytest.raises(RuleFileError) as info:
        rules(text)
    assert [d.code for d in info.value.diagnostics] == ["bad-condition"]


def test_an_unbound_capture_in_a_bound_is_reported():
    text = "rule r [changes]: call_function torch.relu($x) where $x.shape[$y:] == [4] -> call_function torch.tanh($x)"
    with pytest.raises(RuleFileError) as info:
        rules(text)
    assert [d.code for d in info.value.diagnostics] == ["unbound-capture"]
