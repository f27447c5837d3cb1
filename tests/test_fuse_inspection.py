"""Users that only inspect a match's interior node (fxrules/engine/inspection.py, docs/semantics.md).

An implied metadata assertion (export's ``aten._assert_tensor_metadata``) is dropped; a metadata read
(``getattr(x, "dtype")``, ``x.size(d)``, ``aten.sym_size.int``) is re-pointed to a root with the same
metadata when it comes after the match; anything else still refuses the match
(``interior-used-outside``). The rule used: ``neg(neg(x)) -> x`` ([exact]), whose inner neg is the
interior node.
"""

from __future__ import annotations

import builtins

import pytest
import torch
from torch import fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.testing import assert_close

import fxrules
from fxrules.engine.refusals import RefusalCode

aten = torch.ops.aten
RULES = fxrules.parse_rules('rule double_neg "-(-x) is x" [exact]:\n'
                            '    call_function torch.neg(call_function torch.neg($x)) -> $x\n')


def _module(build) -> fx.GraphModule:
    """A graph ``x -> neg -> neg -> output`` with ``build(graph, x, inner, outer)`` adding users of
    the inner neg; returns the GraphModule."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    inner = graph.call_function(torch.neg, (x,))
    outer = graph.call_function(torch.neg, (inner,))
    extra = build(graph, x, inner, outer)
    graph.output((outer, *extra) if extra else outer)
    return fx.GraphModule(torch.nn.Module(), graph)


def _apply(module, x):
    return fxrules.apply_rules(module, RULES, example_inputs=(x,))


def _interior_refusal(result) -> bool:
    return any(r.code == RefusalCode.INTERIOR_USED_OUTSIDE for r in result.report.rejected)


def test_an_implied_metadata_assertion_is_dropped():
    def build(graph, x, inner, outer):
        with graph.inserting_after(inner):
            graph.call_function(aten._assert_tensor_metadata.default, (inner,),
                                {"dtype": torch.float32, "device": torch.device("cpu"), "layout": torch.strided})
        return ()

    x = torch.randn(3, 4)
    module = _module(build)
    result = _apply(module, x)
    assert result.counts == {"double_neg": 1}
    assert not any(n.target == aten._assert_tensor_metadata.default for n in result.module.graph.nodes)
    assert_close(result.module(x), module(x), rtol=0, atol=0)


def test_an_assertion_the_metadata_does_not_imply_refuses():
    """Recorded metadata says float32; the assertion says float64 (it would fail when run): not implied."""
    def build(graph, x, inner, outer):
        with graph.inserting_after(inner):
            graph.call_function(aten._assert_tensor_metadata.default, (inner,), {"dtype": torch.float32})
        return ()

    module = _module(build)
    FakeTensorProp(module).propagate(torch.randn(3, 4))
    assertion = next(n for n in module.graph.nodes if n.target == aten._assert_tensor_metadata.default)
    assertion.kwargs = {"dtype": torch.float64}
    result = fxrules.apply_rules(module, RULES)
    assert not result.counts
    assert _interior_refusal(result)


def test_an_assertion_of_the_device_is_compared_with_the_recorded_device():
    def build(graph, x, inner, outer):
        with graph.inserting_after(inner):
            graph.call_function(aten._assert_tensor_metadata.default, (inner,), {"device": torch.device("cpu")})
        return ()

    x = torch.randn(3, 4)
    assert _apply(_module(build), x).counts == {"double_neg": 1}
    module = _module(build)
    FakeTensorProp(module).propagate(x)
    assertion = next(n for n in module.graph.nodes if n.target == aten._assert_tensor_metadata.default)
    assertion.kwargs = {"device": torch.device("meta")}
    assert not fxrules.apply_rules(module, RULES).counts


def test_without_metadata_an_assertion_is_not_implied():
    def build(graph, x, inner, outer):
        with graph.inserting_after(inner):
            graph.call_function(aten._assert_tensor_metadata.default, (inner,), {"dtype": torch.float32})
        return ()

    result = fxrules.apply_rules(_module(build), RULES)  # no example inputs: no metadata
    assert not result.counts
    assert _interior_refusal(result)


@pytest.mark.parametrize("read", ["dtype", "shape", "size", "size_dim", "sym_size", "numel", "dim"])
def test_a_metadata_read_after_the_match_is_repointed(read):
    def build(graph, x, inner, outer):
        with graph.inserting_after(outer):
            if read in ("dtype", "shape"):
                node = graph.call_function(builtins.getattr, (inner, read))
            elif read == "size":
                node = graph.call_method("size", (inner,))
            elif read == "size_dim":
                node = graph.call_method("size", (inner, 1))
            elif read == "sym_size":
                node = graph.call_function(aten.sym_size.int, (inner, 0))
            else:
                node = graph.call_method(read, (inner,))
        return (node,)

    x = torch.randn(3, 4)
    module = _module(build)
    result = _apply(module, x)
    assert result.counts == {"double_neg": 1}
    assert len([n for n in result.module.graph.nodes if n.target is torch.neg]) == 0
    (out, value), (expected_out, expected_value) = result.module(x), module(x)
    assert_close(out, expected_out, rtol=0, atol=0)
    assert value == expected_value


def test_a_read_of_a_value_the_replacement_does_not_share_refuses():
    """relu(neg(x)).sum(-1) -> ...: the interior neg has x's shape, the root another; a size read of
    the interior cannot be answered by the root."""
    rules = fxrules.parse_rules('rule fold [changes]:\n'
                                '    call_method sum(call_function torch.neg($x), -1) -> call_method sum($x, -1)\n')

    def build(graph, x, inner, outer):
        return ()

    graph = fx.Graph()
    x = graph.placeholder("x")
    inner = graph.call_function(torch.neg, (x,))
    total = graph.call_method("sum", (inner, -1))
    size = graph.call_method("size", (inner, 1))
    graph.output((total, size))
    module = fx.GraphModule(torch.nn.Module(), graph)
    result = fxrules.apply_rules(module, rules, example_inputs=(torch.randn(3, 4),))
    assert not result.counts
    assert _interior_refusal(result)


def test_a_read_before_the_root_refuses():
    """A read of the interior node that comes before the root cannot read the replacement's value."""
    def build(graph, x, inner, outer):
        with graph.inserting_after(inner):
            node = graph.call_function(builtins.getattr, (inner, "dtype"))
        return (node,)

    result = _apply(_module(build), torch.randn(3, 4))
    assert not result.counts
    assert _interior_refusal(result)


def test_a_computing_user_still_refuses():
    def build(graph, x, inner, outer):
        with graph.inserting_after(outer):
            node = graph.call_function(torch.relu, (inner,))
        return (node,)

    result = _apply(_module(build), torch.randn(3, 4))
    assert not result.counts
    assert _interior_refusal(result)
