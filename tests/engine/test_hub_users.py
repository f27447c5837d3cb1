"""The further-root search over nodes read by many (:mod:`fxrules.engine.users`).

A multi-root rule's further root is the first user, in graph order, of the first root's bound nodes that
matches. For a node with at least :data:`~fxrules.engine.users.HUB` users the search reads the workpiece's
groups of its users by (op, target), kept through the run's edits, instead of walking them all. Both ways must
find the same node every time: the property below runs each random graph and rule set with every node
grouped (``HUB`` 1: each edit's bookkeeping is exercised on small graphs), with some (``HUB`` 3) and with
none, and compares the runs rewrite by rewrite.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import fx, nn

import fxrules
from fxrules.engine import driver, matcher
from fxrules.engine.errors import RewriteLoopError
from fxrules.engine.transaction import Workpiece
from fxrules.engine.users import UsersByKey

# one-input and two-input calls the random graphs are made of
_UNARY = [torch.sin, torch.cos, torch.neg, torch.relu, torch.exp]
_BINARY = [torch.add, torch.mul, torch.sub]

# multi-root rules (one and two bound values; a further root that is itself a pattern, which some users
# fail; one of two options, whose groups are merged in graph order; a second root of the first's kind, which
# must not be the first; one that reads nothing the first bound, found among all nodes when the first's
# inputs have no other users), beside rules whose rewrites give a hub new users that are further roots: a call made anew
# (`exp(exp($v)) -> cos($v)`), a root replaced by its input, whose users move to it (`neg(neg($x)) -> $x`
# under `cos`, `mul`, `sub`). Some sets of them loop: both runs must then fail alike.
RULES = """
rule sin_cos [exact]: call_function torch.sin($v), call_function torch.cos($v)
    -> call_function torch.sin($v), call_function torch.exp($v)
rule add_mul [exact]: call_function torch.add($a, $b), call_function torch.mul($a, $b)
    -> call_function torch.add($a, $b), call_function torch.mul(call_function torch.relu($a), $b)
rule exp_sub [exact]: call_function torch.exp($v), call_function torch.sub($v, call_function torch.neg($v))
    -> call_function torch.exp($v), call_function torch.mul($v, 2)
rule alternatives [exact]: call_function torch.relu($v), (call_function torch.sin($v) | call_function torch.cos($v))
    -> call_function torch.relu($v), call_function torch.add($v, 1)
rule duplicate [exact]: call_function torch.neg($v) as a, call_function torch.neg($v) as b -> call_function torch.neg($v) as c, c
rule unrelated [exact]: call_function torch.mul($v, $v), call_function torch.exp($w)
    -> call_function torch.mul($v, $v), call_function torch.sin($w)
rule make_cos [exact]: call_function torch.exp(call_function torch.exp($v)) -> call_function torch.cos($v)
rule neg_neg [exact]: call_function torch.neg(call_function torch.neg($x)) -> $x
rule relu_relu [exact]: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
"""


@st.composite
def graphs(draw):
    """Calls over two inputs, most of them reading one of the first few nodes (hubs) directly or through
    ``neg(neg(.))`` or ``exp(exp(.))`` (which rewrites turn into the hub itself or a new call of it), summed
    into the output."""
    graph = fx.Graph()
    nodes = [graph.placeholder("x"), graph.placeholder("y")]

    def argument():
        if not draw(st.integers(0, 3)):
            return nodes[draw(st.integers(0, len(nodes) - 1))]
        hub = nodes[draw(st.integers(0, min(3, len(nodes) - 1)))]
        wrap = draw(st.sampled_from([None, None, torch.neg, torch.exp]))
        if wrap is None:
            return hub
        return graph.call_function(wrap, (graph.call_function(wrap, (hub,)),))

    for _ in range(draw(st.integers(4, 32))):
        if draw(st.booleans()):
            nodes.append(graph.call_function(draw(st.sampled_from(_UNARY)), (argument(),)))
        else:
            nodes.append(graph.call_function(draw(st.sampled_from(_BINARY)), (argument(), argument())))
    total = nodes[2]
    for node in graph.nodes:
        if node.op == "call_function" and not node.users and node is not total:
            total = graph.call_function(torch.add, (total, node))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def _run(gm: fx.GraphModule, hub: int, inplace: bool, monkeypatch) -> tuple:
    with monkeypatch.context() as patch:
        patch.setattr(matcher, "HUB", hub)
        patch.setattr(driver, "HUB", hub)  # the revisit's siblings of a further root made: grouped too
        try:
            result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES, "hubs.fxr"), inplace=inplace,
                                         max_iterations=300)
        except RewriteLoopError as exc:
            return str(exc), ()
    applied = [(a.rule, a.matched, a.created, a.replaced_by) for a in result.report.applied]
    return result.module.code, applied


@pytest.mark.parametrize("hub", [1, 3], ids=["every-node-grouped", "some-grouped"])
@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
@given(gm=graphs())
def test_grouped_users_find_what_walking_them_finds(gm, inplace, hub):
    """With ``HUB`` 3, a match binds nodes read by few (walked) beside nodes read by many (grouped): the
    search merges both in graph order."""
    monkeypatch = pytest.MonkeyPatch()
    copies = [fx.GraphModule(gm, _copy(gm.graph)) for _ in range(2)]
    walked = _run(copies[0], 10**9, inplace, monkeypatch)
    grouped = _run(copies[1], hub, inplace, monkeypatch)
    assert grouped == walked  # (the rules do not keep values: the two runs are compared)


def _copy(graph: fx.Graph) -> fx.Graph:
    copied = fx.Graph()
    out = copied.graph_copy(graph, {})
    copied.output(out)
    return copied


def _pairs(n: int) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = None
    for _ in range(n):
        pair = graph.call_function(torch.add, (graph.call_function(torch.sin, (x,)), graph.call_function(torch.cos, (x,))))
        total = pair if total is None else graph.call_function(torch.add, (total, pair))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def test_a_hub_pairs_each_sin_with_the_first_cos_left():
    """Over an input read by 400 nodes: each match's cos is the first cos still reading the input (the
    group's front moves past the ones rewritten), and the run rewrites every pair."""
    gm = _pairs(200)
    cosines = [n.name for n in gm.graph.nodes if n.target is torch.cos]
    result = fxrules.apply_rules(gm, fxrules.parse_rules(RULES, "hubs.fxr"))
    pairs = [a.matched for a in result.report.applied if a.rule == "sin_cos"]
    assert len(pairs) == 200
    assert [cos for _, cos in pairs] == cosines


def test_a_user_an_edit_gives_the_hub_is_found():
    """Users the run gives a grouped node (a call made anew, a root's users moved to it) join its groups in
    graph order; ones that stop reading it are skipped."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    users = [graph.call_function(torch.relu, (x,)) for _ in range(3)]
    graph.output(tuple(users))
    hubs = UsersByKey()
    key = frozenset({("call_function", torch.relu), ("call_function", torch.cos)})
    assert [list(g) for g in hubs.groups(x, key)] == [users]
    assert hubs.watches(x)
    with graph.inserting_before(users[1]):
        made = graph.call_function(torch.cos, (x,))
    hubs.made(made)
    users[0].replace_input_with(x, made)  # users[0] no longer reads x
    groups = sorted(([n.name for n in g] for g in hubs.groups(x, key)), key=len)
    assert groups == [["cos"], ["relu_1", "relu_2"]]
    hubs.added(x, users[0])  # told of a user that came back: a duplicate the search skips as seen
    users[0].replace_input_with(made, x)
    relus = max((list(g) for g in hubs.groups(x, key)), key=len)
    assert relus == users


def test_a_group_read_to_its_end_drops_the_users_that_left_it():
    """A user replaced by one made in its place (before it) leaves a stale entry behind the live one: a read to
    the group's end drops it (a rule set that kept replacing the same user grew the group by one per rewrite),
    a read that stops early keeps the entries it did not pass."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    users = [graph.call_function(torch.relu, (x,)) for _ in range(4)]
    graph.output(tuple(users))
    hubs = UsersByKey()
    key = frozenset({("call_function", torch.relu)})
    [group] = hubs.groups(x, key)
    assert list(group) == users
    members = hubs.grouped[x][("call_function", torch.relu)]
    for old in users[1:3]:  # each replaced by a relu made before it
        with graph.inserting_before(old):
            made = graph.call_function(torch.relu, (x,))
        hubs.made(made)
        old.replace_all_uses_with(made)
        graph.erase_node(old)
    assert len(members) == 6
    [group] = hubs.groups(x, key)
    assert next(group) is users[0]  # a read that stops: nothing dropped
    assert len(members) == 6
    [group] = hubs.groups(x, key)
    live = list(group)
    assert live == [n for n in graph.nodes if n.target is torch.relu] and len(live) == 4
    assert members == live


def test_finding_matches_reads_the_groups_as_a_run_does(monkeypatch):
    """``find_matches`` (no edits) finds the same matches, further roots included, either way."""
    rules = fxrules.parse_rules(RULES, "hubs.fxr")
    found = {}
    for hub in (1, 10**9):
        monkeypatch.setattr(matcher, "HUB", hub)
        found[hub] = [(m.rule, m.roots) for m in fxrules.find_matches(_pairs(100), rules)]
    assert found[1] == found[10**9]
    assert sum(1 for rule, _ in found[1] if rule == "sin_cos") == 100


def test_each_edit_of_a_workpiece_that_gives_a_hub_a_user_tells_its_groups():
    """The three edits that add a user (a node made, a root's users moved, a user repointed) each reach the
    groups of a grouped node, in graph order; a node that is not grouped is not grouped by them."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    first = graph.call_function(torch.cos, (x,))
    root = graph.call_function(torch.neg, (y,))
    moving = graph.call_function(torch.cos, (root,))
    later = graph.call_function(torch.cos, (y,))
    graph.output((first, moving, later))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="Model")
    cos = frozenset({("call_function", torch.cos)})
    assert [list(g) for g in work.hubs.groups(x, cos)] == [[first]]
    with graph.inserting_before(root):
        made = work.new_node("call_function", torch.cos, (x,), {})
    work.replace_uses(root, x)  # `moving` reads x now
    work.repoint(later, y, x)
    assert [list(g) for g in work.hubs.groups(x, cos)] == [[first, made, moving, later]]
    assert not work.hubs.watches(y)


@pytest.mark.parametrize("first", [torch.sin, torch.cos], ids=["sin-first", "cos-first"])
def test_options_of_a_further_root_are_merged_in_graph_order(first, monkeypatch):
    """A further root with two options reads two groups of the hub's users: the earlier node in the graph is
    the one found, whichever option it matches (each option's group alone would find its own first)."""
    monkeypatch.setattr(matcher, "HUB", 1)
    graph = fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    second = torch.cos if first is torch.sin else torch.sin
    early, late = graph.call_function(first, (x,)), graph.call_function(second, (x,))
    graph.output((relu, early, late))
    rules = fxrules.parse_rules("rule options [exact]: call_function torch.relu($v), (call_function torch.sin($v) | "
                                "call_function torch.cos($v)) -> call_function torch.relu($v), $v\n", "options.fxr")
    result = fxrules.apply_rules(fx.GraphModule(nn.Module(), graph), rules)
    assert result.report.applied[0].matched == (relu.name, early.name)
