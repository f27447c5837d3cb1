"""Fake values of long view chains (``engine.driver._shallow_view``): a view that is ``VIEW_DEPTH`` views deep
is propagated as one ``as_strided`` of its base, which is the same tensor to everything the engine reads.

A fake view op costs time in proportion to how deep its input is (torch chains each view's replay
function through every view above it): a chain of 4,000 transposes took 8 s to propagate."""

from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st
from torch import fx, nn

import fxrules
from fxrules.engine import driver, fxaccess

VIEWS = {
    "t": lambda g, v: g.call_method("t", (v,)),
    "transpose": lambda g, v: g.call_method("transpose", (v, 0, 1)),
    "view": lambda g, v: g.call_method("view", (v, -1, 2)),  # (4, 4) values: 8 x 2 and back
    "back": lambda g, v: g.call_method("view", (v, 4, 4)),
    "unsqueeze_squeeze": lambda g, v: g.call_method("squeeze", (g.call_method("unsqueeze", (v, 0)), 0)),
    "as_int": lambda g, v: g.call_method("view", (v, torch.int32)),  # reinterprets the dtype
    "as_float": lambda g, v: g.call_method("view", (v, torch.float32)),
    "neg": lambda g, v: g.call_function(torch.neg, (v,)),  # a fresh value: the chain starts again
    "detach": lambda g, v: g.call_method("detach", (v,)),
    "expand": lambda g, v: g.call_method("expand", (g.call_method("unsqueeze", (v, 0)), 2, -1, -1)),
    "select": lambda g, v: g.call_function(torch.select, (v, 0, 0)),
}


def chain(kinds: list) -> fx.GraphModule:
    graph = fx.Graph()
    value = graph.placeholder("x")
    outs = []
    for kind in kinds:
        if kind in ("expand", "select"):  # changes the rank: returned, not chained
            outs.append(VIEWS[kind](graph, value))
            continue
        value = VIEWS[kind](graph, value)
        if kind == "as_int":
            value = VIEWS["as_float"](graph, value)
    graph.output((value, *outs))
    return fx.GraphModule(nn.Module(), graph)


def facts(graph: fx.Graph) -> list:
    """Per node: its value's shape, strides, offset, dtype, conjugate bit, requires_grad, and which of the
    earlier nodes' values share its storage (by index)."""
    rows, keys = [], []
    for node in graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        key = fxaccess.storage_key(value)
        rows.append((node.name, tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                     value.is_conj(), value.requires_grad, [i for i, k in enumerate(keys) if k == key]))
        keys.append(key)
    return rows


def propagated(gm: fx.GraphModule, x: torch.Tensor) -> fx.Graph:
    """The graph with its values (``meta['val']``) as a run with ``example_inputs=(x,)`` propagates them."""
    return driver.prepare(gm, tracer=None, concrete_args=None, example_inputs=(x,)).graph


@given(kinds=st.lists(st.sampled_from(sorted(VIEWS)), min_size=1, max_size=40), grad=st.booleans())
@example(kinds=["transpose"] * 7 + ["as_int", "transpose"], grad=False)  # the dtype view at the depth
@example(kinds=["transpose"] * 12 + ["select", "expand"], grad=True)
def test_shallow_views_are_the_same_values_to_the_engine(kinds, grad):
    """Random chains of views (dtype reinterpreted and back, detached, broken by fresh values, expanded and
    selected beside): every value's facts with VIEW_DEPTH 8 are the facts of the plain chain (or both runs
    fail alike, where a view's strides do not allow it)."""
    x = torch.randn(4, 4, requires_grad=grad)
    kept = driver.VIEW_DEPTH
    try:
        driver.VIEW_DEPTH = 1 << 30
        plain = facts(propagated(chain(kinds), x))
    except fxrules.ModelError as exc:  # a view the strides do not allow (after a transpose): the same either way
        plain = str(exc)
    finally:
        driver.VIEW_DEPTH = kept
    try:
        shallow = facts(propagated(chain(kinds), x))
    except fxrules.ModelError as exc:
        shallow = str(exc)
    assert shallow == plain


def test_a_long_chain_is_propagated_from_its_base_every_view_depth_views(monkeypatch):
    calls = []
    real = torch.Tensor.as_strided
    monkeypatch.setattr(torch.Tensor, "as_strided", lambda self, *a: calls.append(1) or real(self, *a))
    gm = chain(["transpose"] * 40)
    out = propagated(gm, torch.randn(4, 4))
    assert len(calls) == 40 // driver.VIEW_DEPTH
    last = [n for n in out.nodes if n.op == "call_method"][-1].meta["val"]
    assert last.shape == (4, 4) and last.stride() == (4, 1)


def test_a_transpose_chain_with_example_inputs_rewrites_as_without():
    gm = chain(["transpose"] * 41)
    x = torch.randn(4, 4)
    with_inputs = fxrules.apply_rules(gm, fxrules.load_rules(fxrules.LIBRARY).select(names=["double_transpose"]), example_inputs=(x,))
    assert with_inputs.counts == {"double_transpose": 20}
    assert torch.equal(with_inputs.module(x)[0], gm(x)[0])


def test_a_deep_view_that_reinterprets_the_dtype_is_kept_as_it_is():
    """``view_as_real`` of a complex chain is a view of the complex base with another dtype: an
    ``as_strided`` of the base would be complex, so that view is not made shallow (nor ``conj``'s bit lost)."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(driver.VIEW_DEPTH - 1):
        value = graph.call_method("transpose", (value, 0, 1))
    conj = graph.call_method("conj", (value,))
    real = graph.call_function(torch.view_as_real, (value,))
    graph.output((real, graph.call_method("transpose", (real, 0, 1)), conj))
    gm = fx.GraphModule(nn.Module(), graph)
    x = torch.randn(4, 4, dtype=torch.complex64)
    kept = driver.VIEW_DEPTH
    try:
        driver.VIEW_DEPTH = 1 << 30
        plain = facts(propagated(gm, x))
    finally:
        driver.VIEW_DEPTH = kept
    got = facts(propagated(gm, x))
    assert got == plain
    assert [row[4] for row in got[-3:]] == [torch.complex64, torch.float32, torch.float32]
