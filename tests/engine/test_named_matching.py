"""Named patterns in the engine (issue 19): alternatives indexed by each root key, shared parameters."""

from __future__ import annotations

import operator

import torch
from torch import fx

import fxrules
from fxrules.engine.program import compile_rules

RULES = '''
pattern matmul($a, $b) = call_function torch.matmul($a, $b) | call_method matmul($a, $b) | call_function operator.matmul($a, $b)
pattern square($x) = call_function operator.mul($x, $x)

rule mm_to_bmm [changes]:
    matmul($a, $b) -> call_function torch.bmm($a, $b)

rule relu_square [exact]:
    square(call_function torch.relu($x) as r) -> call_function torch.pow(r, 2)
'''


class Spellings(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b), a.matmul(b), a @ b


class Squares(torch.nn.Module):
    def forward(self, x):
        r = torch.relu(x)
        return r * r, torch.relu(x) * torch.relu(x)


def test_each_alternative_of_a_root_use_is_indexed_by_its_key():
    compiled = compile_rules(fxrules.parse_rules(RULES))
    keys = {key for key, programs in compiled.by_key.items() if programs[0].name == "mm_to_bmm"}
    assert keys == {("call_function", torch.matmul), ("call_method", "matmul"), ("call_function", operator.matmul)}


def test_every_spelling_is_rewritten():
    gm = fx.symbolic_trace(Spellings())
    result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES).select(names=["mm_to_bmm"]))
    targets = [n.target for n in result.module.graph.nodes if n.op in ("call_function", "call_method")]
    assert targets == [torch.bmm] * 3
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    for got, want in zip(result.module(a, b), Spellings()(a, b)):
        torch.testing.assert_close(got, want)


def test_a_repeated_parameter_matches_one_node_only():
    gm = fx.symbolic_trace(Squares())
    result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES).select(names=["relu_square"]))
    assert len(result.report.applied) == 1  # r * r, not relu(x) * relu(x) (two nodes)
    x = torch.randn(4)
    for got, want in zip(result.module(x), Squares()(x)):
        torch.testing.assert_close(got, want)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        scores = torch.softmax(torch.matmul(q, k.transpose(-2, -1)), -1)
        return (torch.matmul(torch.nn.functional.dropout(scores, 0.1, training=False), v),
                torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)), -1), v))


def test_an_optional_part_matches_with_and_without_it():
    from pathlib import Path

    rules = fxrules.load_rules(Path(__file__).parents[1] / "corpus" / "pass" / "optional_parts.fxr")
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    result = fxrules.apply_rules(fx.symbolic_trace(Attention()), rules, example_inputs=(q, k, v))
    assert len(result.report.applied) == 2
    for got, want in zip(result.module(q, k, v), Attention()(q, k, v)):
        torch.testing.assert_close(got, want)
