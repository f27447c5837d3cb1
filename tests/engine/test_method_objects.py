"""A replacement's method object (issue 19): a literal is refused when checked, a capture bound to
one when the rule is applied (the generated code `2.neg()` did not compile and was blamed on the model)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

import fxrules
from fxrules.errors import RewriteError, RuleFileError


class AddTwo(torch.nn.Module):
    def forward(self, x):
        return torch.add(x, 2), operator.add(3, x)


def test_a_literal_method_object_is_a_check_time_error():
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules("call_function torch.add($x, 2) -> call_function torch.sub($x, call_method neg(2))\n")
    assert [d.code for d in info.value.diagnostics] == ["bad-replacement"]


def test_a_capture_bound_to_a_literal_is_the_rules_error_not_the_models():
    rules = fxrules.parse_rules("call_function torch.add($x, $k) -> call_function torch.sub($x, call_method neg($k))\n")
    with pytest.raises(RewriteError, match=r"calls the method `neg` on \$k, which this match binds to 2"):
        fxrules.apply_rules(fx.symbolic_trace(AddTwo()), rules)


def test_a_forwarding_method_replacement_on_a_literal_first_argument():
    rules = fxrules.parse_rules("call_function operator.add -> call_method add\n")
    with pytest.raises(RewriteError, match="first argument of the matched node"):
        fxrules.apply_rules(fx.symbolic_trace(AddTwo()), rules)


def test_a_named_nodes_attribute_beyond_metadata_is_a_check_time_error():
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules('call_function torch.relu(call_function torch.neg($x) as n) where n.op == "x" -> $x\n')
    assert [d.code for d in info.value.diagnostics] == ["unknown-attribute"]
    fxrules.parse_rules("call_function torch.relu(call_module Linear($x) as n) where n.in_features == 2 -> $x\n")
    fxrules.parse_rules("call_function torch.add($x, get_attr $w as w) where w.ndim == 1 -> $x\n")
