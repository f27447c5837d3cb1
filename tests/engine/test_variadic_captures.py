"""Variadic captures (issue 19): `*$xs` binds the rest of an argument list or a list; `*$xs` splices it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import fx

import fxrules
from fxrules.lang.load import parse_source
from fxrules.lang.printer import print_file
from fxrules.lang.source import Source
from tests.lang.test_parse_speed import both_ways

PASS = Path(__file__).parents[1] / "corpus" / "pass" / "variadic_captures.fxr"


class M(torch.nn.Module):
    def forward(self, x, y, z):
        return (x.permute(0, 2, 1).permute(0, 2, 1), x.permute(1, 0, 2).permute(1, 0, 2),
                torch.cat([torch.relu(y), z, y], 1))


def test_parsed_both_ways_and_printed_back():
    text = PASS.read_text()
    assert both_ways(text)
    file = parse_source(Source("<t>", text))
    assert parse_source(Source("<t>", print_file(file))) == file


def test_any_length_is_bound_and_spliced():
    result = fxrules.apply_rules(fx.symbolic_trace(M()), fxrules.load_rules(PASS))
    assert [a.rule for a in result.report.applied] == ["permute_swap_last_twice", "cat_relu_first_to_last"]
    cat = next(n for n in result.module.graph.nodes if n.target is torch.cat)
    assert [a.name for a in cat.args[0]] == ["z", "y", "relu"]
    x, y, z = torch.randn(2, 3, 4), torch.randn(2, 3), torch.randn(2, 5)
    got, want = result.module(x, y, z), M()(x, y, z)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[2], torch.cat([z, y, torch.relu(y)], 1))


def test_fixed_items_before_the_variadic_must_be_there():
    rules = fxrules.parse_rules("call_method permute($x, $a, $b, $c, $d, *$rest) -> $x\n")
    result = fxrules.apply_rules(fx.symbolic_trace(M()), rules)
    assert not result.report.applied  # every permute has three dimensions, and `$d` needs a fourth
    rules = fxrules.parse_rules("call_method permute($x, $a, $b, $c, *$rest) where len($rest) == 0 -> $x\n")
    assert len(fxrules.apply_rules(fx.symbolic_trace(M()), rules).report.applied) == 4  # the rest may be empty
