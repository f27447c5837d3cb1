"""Boolean-dispatch wrappers (issue 19): `F.max_pool2d` and friends are argument-normalised."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import fxrules
from fxrules.engine import signatures

WRAPPERS = [F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d,
            F.adaptive_max_pool3d, F.fractional_max_pool2d, F.fractional_max_pool3d]


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda f: f.__name__ if hasattr(f, "__name__") else str(f))
def test_each_wrapper_has_its_branches_signature(wrapper):
    (sig,) = signatures.for_function(wrapper)
    assert "return_indices" in sig.parameters and "input" in sig.parameters


class Pool(torch.nn.Module):
    def forward(self, x):
        return F.max_pool2d(torch.relu(x), 2)


def test_a_pattern_leaving_keywords_at_their_defaults_matches_the_traced_call():
    gm = fx.symbolic_trace(Pool())
    call = next(n for n in gm.graph.nodes if n.target is F.max_pool2d)
    assert "return_indices" in call.kwargs  # symbolic_trace records every keyword
    rules = fxrules.parse_rules("rule pool_relu [exact]:\n"
                                "    call_function F.max_pool2d(call_function torch.relu($x), 2)\n"
                                "    -> call_function torch.relu(call_function F.max_pool2d($x, 2))\n")
    result = fxrules.apply_rules(gm, rules)
    targets = [n.target for n in result.module.graph.nodes if n.op == "call_function"]
    assert targets == [F.max_pool2d, torch.relu]
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(result.module(x), Pool()(x))


def test_a_pattern_asking_for_indices_does_not_match_a_call_without():
    gm = fx.symbolic_trace(Pool())
    rules = fxrules.parse_rules("call_function F.max_pool2d($x, 2, return_indices=True) -> $x\n")
    result = fxrules.apply_rules(gm, rules)
    assert not result.report.applied
