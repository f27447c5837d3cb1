"""What a condition reads of a dtype (issue 19): `itemsize`, `is_floating_point`, `is_complex`,
`is_signed`, of `$x.dtype`, of a captured dtype literal (`$d`), or of a tensor (`$x.itemsize`, its
dtype's). A value that is not a dtype nor has one (an int literal) has none: the condition is false,
no refusal."""

from __future__ import annotations

import torch
from torch import nn

import fxrules

ROUND_TRIP = """
rule round_trip [exact]:
    call_method to(call_method to($x, $d1), $d2)
    where $x.dtype.is_floating_point and $d1.is_floating_point and not $d1.is_complex and $d1.is_signed
    where $d2 == $x.dtype and $x.itemsize < $d1.itemsize
    -> $x
"""


class Casts(nn.Module):
    def forward(self, x):
        return (x.to(torch.float32).to(torch.float16) + 1,  # widened and back: x
                x.to(torch.int32).to(torch.float16) + 2,  # through an int: not a float
                x.to(torch.bfloat16).to(torch.float16) + 3,  # as wide, not wider: rounds
                x.to(torch.float64).to(torch.float32) + 4)  # back to another dtype


def test_dtype_attributes_in_conditions():
    x = torch.randn(16).half() * 100
    result = fxrules.apply_rules(Casts(), fxrules.parse_rules(ROUND_TRIP), example_inputs=(x,))
    assert result.counts == {"round_trip": 1}
    got, want = result.module(x), Casts()(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    methods = [n.target for n in result.module.graph.nodes if n.op == "call_method"]
    assert methods.count("to") == 6  # the three other chains stay


def test_a_value_without_a_dtype_makes_the_condition_false():
    class Add(nn.Module):
        def forward(self, x):
            return torch.add(x, 2)

    rules = fxrules.parse_rules("rule r [changes]: call_function torch.add($x, $k) where $k.itemsize == 8 "
                                "-> call_function torch.sub($x, $k)")
    x = torch.randn(3)
    result = fxrules.apply_rules(Add(), rules, example_inputs=(x,))
    assert result.counts == {} and not result.report.rejected
    assert torch.equal(result.module(x), x + 2)


def test_a_parameter_reads_its_dtype():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3, dtype=torch.float64), requires_grad=False)

        def forward(self, x):
            return torch.mul(x, self.w)

    rules = fxrules.parse_rules("rule r [changes]: call_function torch.mul($x, get_attr $w) where $w.itemsize == 8 "
                                "-> call_function torch.add($x, get_attr $w)")
    x = torch.randn(3, dtype=torch.float64)
    result = fxrules.apply_rules(Scale(), rules, example_inputs=(x,))
    assert result.counts == {"r": 1}
    assert torch.equal(result.module(x), x + 1)
