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
