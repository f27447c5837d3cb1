"""The planner's search for an in-place write below a value (:func:`fxrules.engine.planner.first_write_below`).

Past :data:`~fxrules.engine.planner.TREE_LIMIT` nodes of a storage tree the search asks the writers of the
window instead of walking the tree (a chain of views, an input that many views read: walking per match was
quadratic). Both ways must name the same writer, and what the writers' answers remember must not outlive an
edit of the graph.
"""

from __future__ import annotations

import operator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from fxrules.engine import planner
from fxrules.engine.refusals import RefusalCode
from fxrules.engine.transaction import Workpiece


def opaque(x):  # a function the engine does not know: it may view and write every argument
    return x


def opaque2(x, y):  # the same, with two arguments
    return x


torch.fx.wrap("opaque")
torch.fx.wrap("opaque2")

# what a node of the random graphs calls: (op, target, how many extra constant args)
_STEPS = [
    ("call_method", "transpose", (0, 1)),  # a view of its input
    ("call_method", "view", (-1,)),  # a view
    ("call_function", torch.relu, ()),  # fresh
    ("call_method", "add_", (1,)),  # writes its input, returns it
    ("call_method", "mul_", (2,)),
    ("call_function", operator.getitem, (0,)),  # a view
    ("call_function", opaque, ()),  # unknown: writes and may return any input
    ("call_function", torch.add, None),  # fresh, two inputs
    ("call_function", opaque2, None),  # unknown, two inputs: writes both
]


@st.composite
def graphs(draw):
    """A graph of views, fresh values and writes over one or two inputs, some node read by many."""
    graph = fx.Graph()
    nodes = [graph.placeholder("x"), graph.placeholder("y")]
    for _ in range(draw(st.integers(4, 40))):
        op, target, extra = draw(st.sampled_from(_STEPS))
        # half the time the input is one of the first nodes: a hub with many views
        pick = st.integers(0, min(2, len(nodes) - 1)) if draw(st.booleans()) else st.integers(0, len(nodes) - 1)
        a = nodes[draw(pick)]
        args = (a, nodes[draw(st.integers(0, len(nodes) - 1))]) if extra is None else (a, *extra)
        nodes.append(graph.create_node(op, target, args))
    graph.output(nodes[-1])
    return graph


@pytest.mark.parametrize("limit", [0, 1, 3])
@given(data=st.data())
def test_asking_the_writers_finds_the_writer_the_walk_finds(limit, data):
    graph = data.draw(graphs())
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="G")
    effects, analysis = work.effects, work.effects.aliasing
    nodes = list(gm.graph.nodes)[:-1]
    tops = data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3, unique=True))
    skip = set(data.draw(st.lists(st.sampled_from(nodes), max_size=3)))
    after = data.draw(st.none() | st.sampled_from(nodes))
    before = data.draw(st.none() | st.sampled_from(nodes))
    expected = analysis.first_write(analysis.tree_of(tops), effects.mutated_inputs, skip=skip, after=after,
                                    before=before)
    saved = planner.TREE_LIMIT
    planner.TREE_LIMIT = limit
    try:
        found = planner.first_write_below(effects, tops, skip, after=after, before=before)
        again = planner.first_write_below(effects, tops, skip, after=after, before=before)  # remembered answers
    finally:
        planner.TREE_LIMIT = saved
    assert (found and found[1]) == (expected and expected[1])
    assert again == found
    if found is not None:  # the node it names is written by that writer and lies in the tree
        assert found[0] in effects.mutated_inputs(found[1]) and found[0] in analysis.tree_of(tops)


def test_an_edit_forgets_what_the_writers_answered():
    """A written node that views ``a`` is rewired to view ``b``: asked again, the search answers for ``b``."""
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    views = [graph.call_method("view", (a, -1)) for _ in range(5)]
    other = graph.call_method("view", (b, -1))
    written = graph.call_method("transpose", (views[0], 0, 1))
    writer = graph.call_method("add_", (written, 1))
    graph.output((writer, *views, other))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="G")
    nodes = {n.name: n for n in gm.graph.nodes}
    a, b, written, views0, other = nodes["a"], nodes["b"], nodes["transpose"], nodes["view"], nodes["view_5"]
    saved = planner.TREE_LIMIT
    planner.TREE_LIMIT = 1
    try:
        assert planner.first_write_below(work.effects, (a,), ()) == (written, nodes["add_"])
        assert planner.first_write_below(work.effects, (b,), ()) is None
        work.repoint(written, views0, other)
        assert planner.first_write_below(work.effects, (a,), ()) is None
        assert planner.first_write_below(work.effects, (b,), ()) == (written, nodes["add_"])
    finally:
        planner.TREE_LIMIT = saved


def test_a_writer_whose_second_argument_is_in_the_tree():
    """A function the engine does not know writes every argument: its second one is the view of ``a``."""
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    views = [graph.call_method("view", (a, -1)) for _ in range(5)]
    writer = graph.call_function(opaque2, (b, views[3]))
    graph.output((writer, *views))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="G")
    nodes = {n.name: n for n in gm.graph.nodes}
    saved = planner.TREE_LIMIT
    planner.TREE_LIMIT = 1
    try:
        assert planner.first_write_below(work.effects, (nodes["a"],), ()) == (nodes["view_3"], nodes["opaque2"])
        assert planner.first_write_below(work.effects, (nodes["a"],), {nodes["opaque2"]}) is None
    finally:
        planner.TREE_LIMIT = saved


class ManyViews(nn.Module):
    """``n`` blocks ``relu(relu(x.view(-1)))`` summed, then ``x`` written in place at the end (or not)."""

    def __init__(self, n: int, write: bool):
        super().__init__()
        self.n, self.write = n, write

    def forward(self, x):
        total = None
        for _ in range(self.n):
            r = torch.relu(torch.relu(x.view(-1)))
            total = r if total is None else total + r
        if self.write:
            x.mul_(2)
        return total


RELU = fxrules.parse_rules("rule r [exact]: call_function torch.relu(call_function torch.relu($x)) "
                           "-> call_function torch.relu($x)", source="r.fxr")
DOUBLE_VIEW = fxrules.parse_rules("rule v [exact]: call_method view(call_method view($x, $a), $a) -> "
                                  "call_method view($x, $a)", source="v.fxr")


@pytest.mark.parametrize("write", [False, True])
def test_many_views_of_one_input_rewrite_as_before(write):
    """100 views of the input (a tree past the limit), a write after them all: every pair rewrites (the
    write is after the matches, no replacement reads across it)."""
    model = ManyViews(100, write)
    gm = fx.symbolic_trace(model)
    result = fxrules.apply_rules(gm, RELU)
    assert result.counts == {"r": 100}
    x = torch.randn(2, 3)
    assert_close(result.module(x.clone()), model(x.clone()))


def test_a_write_far_down_a_chain_of_views_refuses_as_before():
    """``x.view(-1)`` 100 times, then the last written in place: the write reaches every view, each root is
    a view and its replacement may share storage with another value, so every pair is refused
    (replaced-node-mutated, as the walk found it), the write found by asking the writer (the tree below each
    root is past the limit)."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(100):
        value = graph.call_method("view", (value, -1))
    graph.call_method("add_", (value, 1))
    graph.output(value)
    gm = fx.GraphModule(nn.Module(), graph)
    result = fxrules.apply_rules(gm, DOUBLE_VIEW)
    assert result.counts == {}
    codes = {r.code for r in result.report.rejected}
    assert codes == {RefusalCode.REPLACED_NODE_MUTATED}, codes
    assert len(result.report.rejected) == 99
