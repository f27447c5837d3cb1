"""Conditions over users (issue 19): users(), user_targets(), used_only_by()."""

from __future__ import annotations

import torch
from torch import fx

import fxrules


class M(torch.nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        c = torch.relu(x * 2)
        return torch.sigmoid(a), c.transpose(0, 1), torch.neg(c), torch.relu(x + 1)


def targets_after(text: str) -> list:
    result = fxrules.apply_rules(fx.symbolic_trace(M()), fxrules.parse_rules(text))
    return [n.target for n in result.module.graph.nodes if n.op in ("call_function", "call_method")]


def test_users_counts_and_used_only_by_names_the_operations():
    found = targets_after("call_function torch.relu($x) as r where users(r) == 1 and used_only_by(r, torch.sigmoid)"
                          " -> call_function torch.tanh($x)\n")
    assert found.count(torch.tanh) == 1 and found.count(torch.relu) == 2


def test_user_targets_lists_methods_functions_and_the_output():
    found = targets_after("call_function torch.relu($x) as r where user_targets(r) == [\"transpose\", torch.neg]"
                          " -> call_function torch.exp($x)\n")
    assert found.count(torch.exp) == 1
    found = targets_after("call_function torch.relu($x) as r where used_only_by(r, \"output\")"
                          " -> call_function torch.exp($x)\n")
    assert found.count(torch.exp) == 1  # relu(x + 1) is returned as it is


def test_a_capture_bound_to_a_literal_has_no_users():
    found = targets_after("call_function operator.mul($x, $k) where users($k) == 0 -> $x\n")
    assert operator_mul_kept(found)


def operator_mul_kept(found: list) -> bool:
    import operator

    return operator.mul in found
