"""Commutative matching (issue 19): one written order matches both, within the reviewed table."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

import fxrules
from fxrules.engine.program import PCall, compile_rules
from fxrules.lang.commutative import COMMUTATIVE, MAX_COMMUTING_DEPTH
from fxrules.lang.names import Resolver

RULES = '''
rule add_relu [changes]:
    call_function torch.add($x, call_function torch.relu($y)) -> call_function torch.sub($x, $y)
rule mul_exp [changes]:
    call_function operator.mul($x, call_function torch.exp($y)) -> call_function torch.sub($x, $y)
rule sub_relu [changes]:
    call_function torch.sub($x, call_function torch.relu($y)) -> call_function torch.mul($x, $y)
'''


def rewritten(module, rules, *inputs):
    gm = fx.symbolic_trace(module)
    result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES).select(names=rules),
                                 example_inputs=inputs or None)
    return result, [n.target for n in result.module.graph.nodes if n.op == "call_function"]


class Swapped(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(torch.relu(y), x)


class SwappedAlpha(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(torch.relu(y), x, alpha=2)


class SwappedSub(torch.nn.Module):
    def forward(self, x, y):
        return torch.sub(torch.relu(y), x)


class PythonMul(torch.nn.Module):
    def forward(self, x, y):
        return torch.exp(y) * x


def test_the_swapped_order_matches_and_binds_swapped():
    result, targets = rewritten(Swapped(), ["add_relu"])
    assert targets == [torch.sub]
    node = next(n for n in result.module.graph.nodes if n.op == "call_function")
    assert [a.name for a in node.args] == ["x", "y"]


def test_alpha_not_at_its_default_does_not_commute():
    _, targets = rewritten(SwappedAlpha(), ["add_relu"])
    assert torch.sub not in targets


def test_a_call_off_the_table_does_not_commute():
    _, targets = rewritten(SwappedSub(), ["sub_relu"])
    assert torch.mul not in targets


def test_operator_mul_commutes_only_with_a_tensor_or_number_known():
    _, targets = rewritten(PythonMul(), ["mul_exp"])  # no metadata: x and exp(y) may be anything
    assert torch.sub not in targets
    _, targets = rewritten(PythonMul(), ["mul_exp"], torch.randn(3), torch.randn(3))
    assert targets == [torch.sub]


def test_every_table_entry_resolves_and_names_its_operands():
    from fxrules.engine import signatures

    resolver = Resolver()
    for (op, path), commutes in COMMUTATIVE.items():
        if op == "call_method":
            sigs = signatures.for_method(path)
        else:
            resolution = resolver.resolve(path)
            assert resolution.ok, path
            sigs = signatures.for_function(resolution.value)
        assert any(commutes.first in s.parameters and commutes.second in s.parameters for s in sigs), path


def _commuting(pattern, depth=0, found=None):
    found = [] if found is None else found
    if isinstance(pattern, PCall):
        if pattern.commutes is not None:
            found.append(depth)
        for arg in pattern.args or ():
            _commuting(arg, depth + (pattern.commutes is not None), found)
    return found


def test_nested_commutative_calls_swap_only_to_the_bound():
    inner = "$x"
    for _ in range(MAX_COMMUTING_DEPTH + 3):
        inner = f"call_function torch.add({inner}, $y)"
    rules = fxrules.parse_rules(f"rule deep [changes]:\n    call_function torch.relu({inner}) -> $x\n")
    program = compile_rules(rules).programs[0]
    depths = _commuting(program.roots[0])
    assert len(depths) == MAX_COMMUTING_DEPTH and max(depths) == MAX_COMMUTING_DEPTH - 1


@pytest.mark.parametrize("order", [0, 1])
def test_nested_swaps_find_the_matching_combination(order):
    class Nested(torch.nn.Module):
        def forward(self, x, y, z):
            inner = torch.mul(torch.relu(y), z) if order else torch.mul(z, torch.relu(y))
            return torch.add(x, inner) if order else torch.add(inner, x)

    text = ("rule nested [changes]:\n"
            "    call_function torch.add($x, call_function torch.mul($z, call_function torch.relu($y)))\n"
            "    -> call_function torch.sub($x, $z)\n")
    gm = fx.symbolic_trace(Nested())
    result = fxrules.apply_rules(gm, fxrules.parse_rules(text))
    node = next(n for n in result.module.graph.nodes if n.op == "call_function")
    assert node.target is torch.sub and [a.name for a in node.args] == ["x", "z"]
    assert operator  # (imported for the table's paths)
