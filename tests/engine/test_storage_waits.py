"""Matches turned down for a storage reason wait on their bound values' storage only (:mod:`fxrules.engine.watch`),
and the planner reads a node read by many through its index of users that reach its storage
(:meth:`fxrules.engine.aliasing.Aliasing.storage_users`).

A match the planner refuses with one of :data:`~fxrules.engine.planner.STORAGE_REFUSALS` is sent back when one
of its own nodes changes, as before, but when a value it bound (``$x``) gains or loses a user only if that user
may view, write or return it. Both must change nothing a run does: the property below runs random graphs of
views, in-place writes and plain calls over a few inputs every node reads, with rules whose matches those
writes turn down and rules whose rewrites add and remove views of the inputs, once as before (every turned-down
match waiting on every change, every user walked) and once with each node's storage users indexed (``HUB`` 1)
or some (``HUB`` 3), and compares the runs rewrite by rewrite.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import fx, nn

import fxrules
from fxrules.engine import aliasing, driver
from fxrules.engine.errors import RewriteLoopError
from fxrules.engine.planner import STORAGE_REFUSALS
from fxrules.engine.transaction import Workpiece

RULES = """
rule mul_one [exact]: call_function torch.mul($x, 1) -> $x
rule add_zero [exact]: call_function torch.add($x, 0) -> $x
rule contiguous_to_clone [changes]: call_method contiguous($x) -> call_function torch.clone($x)
rule reshape_to_view [exact]: call_method reshape($x, -1) -> call_method view($x, -1)
rule neg_neg [exact]: call_function torch.neg(call_function torch.neg($x)) -> $x
rule t_t [exact]: call_method t(call_method t($x)) -> $x
rule clone_of_add [changes]: call_function torch.clone(call_function torch.add($x, $y)) -> call_function torch.sub($x, $y)
"""
"""``mul_one`` and ``add_zero`` put an input in a root's place: turned down when the root, the input or a view of
either is written after (``replaced-node-mutated``, ``alias-mutated-later``, ``output-alias-introduced``). The
others add and remove users of the inputs that view them (``contiguous`` and ``reshape`` may return their input,
``clone`` does not), move users onto them (``neg_neg``, ``t_t``) or add plain ones."""


@st.composite
def graphs(draw):
    """Calls over two inputs, most reading one of the first few nodes (the inputs every block reads): plain
    calls, ``* 1`` and ``+ 0``, views and self-returning calls, in-place adds, ``neg(neg(.))`` and
    ``.t().t()``; the nodes nothing reads are returned."""
    graph = fx.Graph()
    nodes = [graph.placeholder("x"), graph.placeholder("y")]

    def argument():
        if not draw(st.integers(0, 3)):
            return nodes[draw(st.integers(0, len(nodes) - 1))]
        return nodes[draw(st.integers(0, min(3, len(nodes) - 1)))]

    for _ in range(draw(st.integers(4, 28))):
        kind = draw(st.integers(0, 9))
        value = argument()
        if kind == 0:
            made = graph.call_function(draw(st.sampled_from([torch.neg, torch.sin])), (value,))
        elif kind == 1:
            made = graph.call_function(torch.mul, (value, 1))
        elif kind == 2:
            made = graph.call_function(torch.add, (value, 0))
        elif kind == 3:
            made = graph.call_function(torch.add, (value, argument()))
        elif kind == 4:
            made = graph.call_method(draw(st.sampled_from(["contiguous", "t"])), (value,))
        elif kind == 5:
            made = graph.call_method("reshape", (value, -1))
        elif kind == 6:
            made = graph.call_method("add_", (value, 1))
        elif kind == 7:
            made = graph.call_function(torch.neg, (graph.call_function(torch.neg, (value,)),))
        elif kind == 8:
            made = graph.call_method("t", (graph.call_method("t", (value,)),))
        else:
            made = graph.call_function(torch.clone, (graph.call_function(torch.add, (value, argument())),))
        nodes.append(made)
    graph.output(tuple(n for n in graph.nodes if n.op != "placeholder" and not n.users) or nodes[0])
    return fx.GraphModule(nn.Module(), graph)


def _run(gm: fx.GraphModule, hub: int, storage_refusals: frozenset, inplace: bool, monkeypatch) -> tuple:
    with monkeypatch.context() as patch:
        patch.setattr(aliasing, "HUB", hub)
        patch.setattr(driver, "STORAGE_REFUSALS", storage_refusals)
        try:
            result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES, "storage.fxr"), inplace=inplace,
                                         max_iterations=300)
        except RewriteLoopError as exc:
            return str(exc), (), ()
    applied = [(a.rule, a.matched, a.created, a.replaced_by) for a in result.report.applied]
    rejected = sorted((r.rule, r.matched, r.code, r.reason) for r in result.report.rejected)
    return result.module.code, applied, rejected


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(nn.Module(), graph)


@pytest.mark.parametrize("hub", [1, 3], ids=["every-node-indexed", "some-indexed"])
@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
@given(gm=graphs())
def test_storage_waits_and_indexed_users_rewrite_what_waiting_on_everything_does(gm, inplace, hub):
    monkeypatch = pytest.MonkeyPatch()
    before = _run(_copy(gm), 10**9, frozenset(), inplace, monkeypatch)
    now = _run(_copy(gm), hub, STORAGE_REFUSALS, inplace, monkeypatch)
    assert now == before


def _hub(graph: fx.Graph, x: fx.Node, n: int) -> list:
    return [graph.call_function(torch.sin, (x,)) for _ in range(n)]


def test_a_match_turned_down_for_an_alias_is_sent_back_when_the_alias_goes():
    """Returned ``x * 1`` is turned down while ``x.contiguous()`` (which may be ``x`` itself) is returned too: two
    outputs would share storage. When ``contiguous_to_clone`` makes that a fresh copy, ``x`` has lost a user that
    may return it, and the match is tried again and rewritten. Among 100 other users of ``x``."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    sines = _hub(graph, x, 100)
    times_one = graph.call_function(torch.mul, (x, 1))
    same = graph.call_method("contiguous", (x,))
    graph.output((times_one, same, *sines))
    rules = fxrules.parse_rules(RULES, "storage.fxr").select(names=["mul_one", "contiguous_to_clone"])
    result = fxrules.apply_rules(fx.GraphModule(nn.Module(), graph), rules)
    assert [a.rule for a in result.report.applied] == ["contiguous_to_clone", "mul_one"]
    assert not result.report.rejected
    assert [n.op for n in result.module.graph.output_node().args[0][:2]] == ["placeholder", "call_function"]


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
def test_a_view_a_rewrite_makes_of_a_node_read_by_many_is_seen_by_the_planner(inplace):
    """Returned ``x * 1`` is turned down while ``x.reshape(-1)`` (which may view ``x``) is returned too. The planner
    has indexed the users of ``x`` (read by 100 more) to find that; ``reshape_to_view`` then makes ``x.view(-1)``,
    which the index must hold: ``x * 1`` is tried again (``x`` lost a user that viewed it) and still turned down
    (two outputs would share storage)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    sines = _hub(graph, x, 100)
    times_one = graph.call_function(torch.mul, (x, 1))
    flat = graph.call_method("reshape", (x, -1))
    graph.output((times_one, flat, *sines))
    rules = fxrules.parse_rules(RULES, "storage.fxr").select(names=["mul_one", "reshape_to_view"])
    result = fxrules.apply_rules(fx.GraphModule(nn.Module(), graph), rules, inplace=inplace)
    assert [a.rule for a in result.report.applied] == ["reshape_to_view"]
    assert [(r.rule, r.code) for r in result.report.rejected] == [("mul_one", "output-alias-introduced")]
    assert [n.target for n in result.module.graph.output_node().args[0][:2]] == [torch.mul, "view"]


def test_a_hub_that_only_gains_and_loses_plain_users_does_not_send_back_what_waits_on_its_storage(monkeypatch):
    """Per block ``(x * 1).add_(1)`` (``mul_one`` turned down: the product is written) beside ``x + 0``
    (``add_zero`` rewritten: ``x`` loses an add and gains a neg, neither reaching its storage): each turned-down
    match is tried once, not once per rewrite."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    outs = []
    for _ in range(40):
        product = graph.call_function(torch.mul, (x, 1))
        graph.call_method("add_", (product, 1))
        outs += [product, graph.call_function(torch.neg, (graph.call_function(torch.add, (x, 0)),))]
    graph.output(tuple(outs))
    tried = []
    plan = driver.plan
    monkeypatch.setattr(driver, "plan", lambda match, effects: tried.append(match.roots[0].name) or plan(match, effects))
    rules = fxrules.parse_rules(RULES, "storage.fxr").select(names=["mul_one", "add_zero"])
    result = fxrules.apply_rules(fx.GraphModule(nn.Module(), graph), rules)
    assert len(result.report.applied) == 40 and len(result.report.rejected) == 40
    assert len(tried) == 80  # each of the 40 turned down once, each of the 40 rewritten once


def test_each_edit_that_takes_a_user_that_may_view_a_watched_node_tells_the_watch():
    """Erasing a user, moving a root's users to another value and repointing a user each take a user away; the
    watch records a watched node only when the user taken may view, write or return it."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    plain = graph.call_function(torch.neg, (x,))
    view = graph.call_method("t", (x,))
    root = graph.call_function(torch.relu, (y,))
    over_root = graph.call_method("t", (root,))
    repointed = graph.call_method("view", (y, -1))
    graph.output((plain, view, over_root, repointed))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="Model")
    watch = work.storage
    for node in (x, y, root):
        watch.waiting[node] = []
    graph.output_node().args = ((view, over_root, repointed),)
    work.erase(plain)  # x loses a neg: nothing
    assert watch.take_changed() == []
    graph.output_node().args = ((over_root, repointed),)
    work.erase(view)  # x loses a view
    assert watch.take_changed() == [x]
    work.replace_uses(root, y)  # root loses a view (y gains it: not recorded)
    assert watch.take_changed() == [root]
    work.repoint(repointed, y, x)  # y loses a view
    assert watch.take_changed() == [y]


def test_the_index_of_a_hub_s_storage_users_follows_every_edit_in_the_order_of_its_users(monkeypatch):
    """Indexed once, then told of users made, moved to it and repointed (one repointed from another input while
    reading it too, one that came back): torch puts a node whose arguments are set last among the users of each of
    its inputs, and so does the index; users it lost are left out. Always the users that may view, write or return
    it, in the order of ``node.users``."""
    monkeypatch.setattr(aliasing, "HUB", 1)
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    first = graph.call_method("t", (x,))
    plain = graph.call_function(torch.neg, (x,))
    both = graph.call_function(torch.add, (x, y))
    leaving = graph.call_method("view", (x, -1))
    root = graph.call_function(torch.relu, (y,))
    moving = graph.call_method("t", (root,))
    twice = graph.call_method("expand_as", (y, x))
    graph.output((first, plain, both, leaving, moving, twice))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="Model")
    analysis = work.effects.aliasing

    def expected() -> list:
        return [user for user in x.users if work.effects.hands_on_storage(user)]

    assert list(analysis.storage_users(x)) == expected() == [first, leaving, twice]
    with graph.inserting_after(plain):
        made = work.new_node("call_method", "unsqueeze", (x, 0), {})
    work.replace_uses(root, x)  # `moving` views x now
    work.repoint(leaving, x, y)  # leaves
    work.repoint(twice, y, x)  # already a user of x: goes last too
    assert list(analysis.storage_users(x)) == expected() == [first, made, moving, twice]
    work.repoint(leaving, y, x)  # comes back: last
    assert list(analysis.storage_users(x)) == expected() == [first, made, moving, twice, leaving]
    work.repoint(plain, x, y)  # a plain user leaves: nothing indexed moves
    work.repoint(both, y, made)  # reads x and made: goes last among x's users, but is not indexed (plain)
    assert list(analysis.storage_users(x)) == expected() == [first, made, moving, twice, leaving]
