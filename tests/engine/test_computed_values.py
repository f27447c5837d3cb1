"""Computed values in replacements (issue 19): `{...}` evaluated by the conditions' evaluator."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import fxrules
from fxrules.errors import RewriteError, RuleFileError
from fxrules.lang.load import parse_source
from fxrules.lang.printer import print_file
from fxrules.lang.source import Source
from tests.lang.test_parse_speed import both_ways


class Clamp(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(torch.relu(x), min=-2.5)


class Widen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.l(x)


def apply(module, text, *inputs):
    return fxrules.apply_rules(fx.symbolic_trace(module), fxrules.parse_rules(text), example_inputs=inputs or None)


def test_parsed_both_ways_and_printed_back():
    text = ("call_function torch.clamp($x, min=$lo) -> call_function torch.clamp($x, min={max($lo, 0)}, "
            "max={-$lo * 2 + 1})\n")
    assert both_ways(text)
    file = parse_source(Source("<t>", text))
    assert parse_source(Source("<t>", print_file(file))) == file


def test_a_value_computed_from_a_captured_literal():
    result = apply(Clamp(), "call_function torch.clamp($x, min=$lo) where $lo < 0 "
                            "-> call_function torch.clamp($x, min={max($lo, 0)})\n")
    clamp = next(n for n in result.module.graph.nodes if n.target is torch.clamp)
    assert clamp.kwargs == {"min": 0.0}


def test_a_value_from_metadata_and_module_attributes():
    # [changes]: the wider Linear changes the output's shape, which the guards refuse under [approx]
    text = ("rule widen [changes]: call_module Linear($x) as l where l.out_features == 3 -> "
            "call_module Linear{in_features={l.in_features}, out_features={l.out_features + $x.shape[0] - 1}}($x)\n")
    result = apply(Widen(), text, torch.randn(2, 4))
    module = dict(result.module.named_modules())[next(n.target for n in result.module.graph.nodes
                                                       if n.op == "call_module")]
    assert (module.in_features, module.out_features) == (4, 4)
    dtype = apply(Widen(), "rule widen [changes]: call_module Linear($x) as l -> call_method to(call_module l($x), {$x.dtype})\n"
                           .replace("Linear($x) as l", "Linear($x) as l where l.out_features == 3 and $x.ndim == 2")
                           .replace("call_module l($x), {", "call_module Linear{in_features=4, out_features=5}($x), {"),
                  torch.randn(2, 4))
    to = next(n for n in dtype.module.graph.nodes if n.op == "call_method")
    assert to.args[1] is torch.float32


def test_a_value_that_is_not_a_constant_is_the_rules_error():
    with pytest.raises(RewriteError, match="not a constant a graph can hold"):
        apply(Clamp(), "call_function torch.clamp(call_function torch.relu($x), min=$lo) "
                       "-> call_function torch.clamp($x, min={$x})\n", torch.randn(3))


def test_the_condition_budget_bounds_a_computed_value():
    with pytest.raises(RewriteError, match="at most"):
        apply(Clamp(), "call_function torch.clamp($x, min=$lo) "
                       "-> call_function torch.clamp($x, min={[0] * 100000})\n")


def test_a_python_function_on_computed_values_only_is_refused():
    with pytest.raises(RuleFileError) as info:
        fxrules.parse_rules("call_function torch.relu($x) where $x.ndim == 2 "
                            "-> call_function torch.add($x, call_function builtins.sum(call_function builtins.range({1000000 * 1000000})))\n")
    assert {d.code for d in info.value.diagnostics} == {"not-allowed"}
