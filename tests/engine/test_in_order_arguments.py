"""The matcher's shortcut for call patterns whose arguments bind to their signature in order
(program._in_order): a node with as many arguments, all positional, is compared argument by argument
instead of bound. Whatever the spelling of a node, the shortcut must decide as binding does; explaining
always binds (for its messages), so the two are compared by matching with and without explaining."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import fxrules
from fxrules.engine.matcher import GraphView, Match, match_program
from fxrules.engine.program import PCall, compile_rules


def _program(pattern: str):
    (program,) = compile_rules(fxrules.parse_rules(f"rule r: {pattern} -> $x", source="t.fxr")).programs
    return program


@pytest.mark.parametrize("pattern, in_order", [
    ("call_function F.gelu($x)", True),
    ("call_function torch.add($x, $y)", False),  # commutes: its operands may be exchanged
    ("call_function torch.sub($x, $y)", True),
    ("call_function torch.sub($x, $y, alpha=2)", False),  # a keyword
    ("call_function torch.sub($x, ...)", False),  # `...`
    ("call_function torch.sum($x, 1)", True),
    ("call_method transpose($x, 0, 1)", True),
])
def test_which_patterns_take_the_shortcut(pattern, in_order):
    root = _program(pattern).roots[0]
    assert isinstance(root, PCall) and root.in_order is in_order


def _node(target, args, kwargs=None) -> fx.Node:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    args = tuple({"X": x, "Y": y}.get(a, a) if isinstance(a, str) and a in "XY" else a for a in args)
    kwargs = {k: ({"X": x, "Y": y}.get(v, v) if isinstance(v, str) else v) for k, v in (kwargs or {}).items()}
    node = g.call_function(target, args, kwargs) if callable(target) else g.call_method(target, args, kwargs)
    g.output(node)
    return node


PATTERNS = ["call_function F.gelu($x)", "call_function F.gelu($x, 'tanh')", "call_function torch.sub($x, $y)",
            "call_function torch.sub($x, $x)", "call_function torch.sum($x, 1)", "call_function torch.sum($x, 1, False)",
            "call_method transpose($x, 0, 1)", "call_function torch.sub($x, 2)"]

NODES = [
    (F.gelu, ("X",)), (F.gelu, ("X", "none")), (F.gelu, ("X",), {"approximate": "none"}), (F.gelu, ("X", "tanh")),
    (F.gelu, (), {"input": "X"}), (torch.sub, ("X", "Y")), (torch.sub, ("X", "X")), (torch.sub, ("X", "Y", 1)),
    (torch.sub, ("X",), {"other": "Y"}), (torch.sub, ("X", "Y"), {"alpha": 1}), (torch.sub, ("X", "Y"), {"alpha": 2}),
    (F.gelu, ("X",), {"approximate": "tanh"}), (torch.sub, ("X", 2)),
    (torch.sub, ("X", 2.0)), (torch.sum, ("X", 1)), (torch.sum, ("X", 1, False)), (torch.sum, ("X", 1, True)),
    (torch.sum, ("X",), {"dim": 1}), ("transpose", ("X", 0, 1)), ("transpose", ("X", 1, 0)), (operator.add, ("X", "Y")),
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_shortcut_decides_as_binding_does(pattern):
    program = _program(pattern)
    view = GraphView({}.get)
    decided = 0
    for spec in NODES:
        node = _node(*spec)
        quick = match_program(program, node, view, explain=False)
        bound = match_program(program, node, view, explain=True)
        assert isinstance(quick, Match) == isinstance(bound, Match), (pattern, spec)
        if isinstance(quick, Match):
            decided += 1
            assert quick.bindings.captures == bound.bindings.captures
    assert decided  # each pattern matches some spelling
