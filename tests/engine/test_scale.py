"""Scale: long graphs, deep patterns, large rule files.

Nothing here asserts a time: each test asserts that the run completes (no
RecursionError, no quadratic blow-up that would time the suite out) and that the
result is right. ``test_long_chain`` is the slowest test of the suite (about half a
minute on a 2-core machine: building and compiling a 100,000-node GraphModule, then
75,000 rewrites); it is marked ``slow`` so a quick local run can deselect it with
``-m "not slow"``.
"""

from __future__ import annotations

import operator
import sys
from pathlib import Path

import pytest
import torch
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from fxrules import zoo

LIBRARY = fxrules.load_rules(Path(__file__).resolve().parents[2] / "rules")


def chain(functions, length: int) -> fx.GraphModule:
    """A GraphModule computing ``functions[i % len](...)`` ``length`` times over one input, built directly."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for i in range(length):
        value = graph.call_function(functions[i % len(functions)], (value,))
    graph.output(value)
    return fx.GraphModule(nn.Module(), graph)


# ---------------------------------------------------------------------------
# (a) a 100,000-node chain
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_long_chain():
    """relu, relu, neg, neg, ... 100,000 times: every `-(-x)` cancels, then every relu(relu(x))
    collapses, down to one relu. Cascades of 75,000 rewrites over a 100,000-node graph."""
    n = 100_000
    gm = chain((torch.relu, torch.relu, operator.neg, operator.neg), n)
    assert len(gm.graph.nodes) == n + 2
    rules = LIBRARY.select(names=["relu_idempotent", "double_neg"])
    x = torch.randn(5, generator=torch.Generator().manual_seed(0))
    # with example inputs: double_neg reads x's dtype (not complex), and the guards check each rewrite
    result = fxrules.apply_rules(gm, rules, example_inputs=(x,))
    assert result.counts == {"relu_idempotent": n // 2 - 1, "double_neg": n // 4}
    assert [node.op for node in result.module.graph.nodes] == ["placeholder", "call_function", "output"]
    assert result.report.nodes_before == n + 2 and result.report.nodes_after == 3
    assert_close(result.module(x), torch.relu(x), rtol=0, atol=0)
    assert len(gm.graph.nodes) == n + 2  # the input is untouched


# ---------------------------------------------------------------------------
# (b) a pattern nested 200 deep
# ---------------------------------------------------------------------------

DEPTH = 200


def deep_rule_text(depth: int) -> str:
    pattern = "call_function torch.relu(" * depth + "$x" + ")" * depth
    return f"rule deep_relu \"relu applied {depth} times is relu\" [exact]:\n    {pattern}\n" \
           f"    -> call_function torch.relu($x)\n"


@pytest.fixture(scope="module")
def deep_rules() -> fxrules.RuleSet:
    return fxrules.parse_rules(deep_rule_text(DEPTH), source="deep.fxr")


def test_deep_pattern_checks_clean(tmp_path, deep_rules):
    from fxrules.tools.cli import main

    path = tmp_path / "deep.fxr"
    path.write_text(deep_rule_text(DEPTH), encoding="utf-8")
    assert fxrules.load_rules(path).names == ["deep_relu"]
    assert main(["check", str(path)]) == 0
    assert deep_rules.names == ["deep_relu"] and not deep_rules.warnings


def test_deep_pattern_matches_a_deep_graph(deep_rules):
    gm = chain((torch.relu,), DEPTH)
    matches = fxrules.find_matches(gm, deep_rules)
    assert len(matches) == 1
    [match] = matches
    assert match.roots == (f"relu_{DEPTH - 1}",) and len(match.nodes) == DEPTH and match.rejected is None
    result = fxrules.apply_rules(gm, deep_rules)
    assert result.counts == {"deep_relu": 1}
    assert len(result.module.graph.nodes) == 3
    x = torch.randn(7, generator=torch.Generator().manual_seed(0))
    assert_close(result.module(x), gm(x), rtol=0, atol=0)


def test_deep_pattern_does_not_match_a_shallower_graph(deep_rules):
    gm = chain((torch.relu,), DEPTH - 1)
    assert fxrules.find_matches(gm, deep_rules) == []
    assert fxrules.apply_rules(gm, deep_rules).counts == {}
    misses = fxrules.explain(gm, deep_rules)
    assert misses and all(m.rule == "deep_relu" for m in misses)


def test_deep_pattern_matches_twice_in_a_longer_graph(deep_rules):
    gm = chain((torch.relu,), 2 * DEPTH + 5)
    result = fxrules.apply_rules(gm, deep_rules)
    # 405 relus: the first match (at node 200) leaves relu + 205 relus = 206, a second match
    # leaves relu + 6 = 7 relus, fewer than 200: a fixpoint
    assert result.counts == {"deep_relu": 2}
    assert len(result.module.graph.nodes) == 7 + 2


# ---------------------------------------------------------------------------
# (c) a 5,000-rule file
# ---------------------------------------------------------------------------

RULE_COUNT = 5_000

_KINDS = (
    lambda i: f"rule r{i}_mul [changes]:\n    call_function operator.mul($x, {i + 1000}) -> $x\n",
    lambda i: f"rule r{i}_transpose [changes]:\n    call_method transpose($x, {i + 10}, {i + 11}) -> $x\n",
    lambda i: f"rule r{i}_conv [changes]:\n    call_module Conv2d{{out_channels={i + 1000}}}($x) -> $x\n",
    lambda i: f"rule r{i}_add [changes]:\n    call_function torch.add(call_function torch.sigmoid($x), {float(i)})"
              f" -> $x\n",
    lambda i: f"rule r{i}_relu \"never holds\" [exact]:\n    call_function torch.relu(call_function torch.relu($x))"
              f" where $x.ndim == {i + 100} -> call_function torch.relu($x)\n",
    # the one-line form: named <file>:<line>, so distinct too
    lambda i: f"call_function torch.clamp($x, {i}, {i + 0.5}) -> call_function torch.clamp($x, {i}, {i + 1.5})\n",
)


def many_rules_text(count: int) -> str:
    """``count - 2`` rules that match nothing in the zoo, then remove_dropout and relu_idempotent."""
    parts = ["# generated: many distinct rules, almost none of which match\n", "default [changes]\n"]
    parts.extend(_KINDS[i % len(_KINDS)](i) + "\n" for i in range(count - 2))
    parts.append("rule keep_dropout_out [exact]:\n    call_module Dropout($x) as d where not d.training -> $x\n\n")
    parts.append("rule relu_twice [exact]:\n    call_function torch.relu(call_function torch.relu($x))"
                 " -> call_function torch.relu($x)\n")
    return "".join(parts)


@pytest.fixture(scope="module")
def many_rules(tmp_path_factory) -> fxrules.RuleSet:
    path = tmp_path_factory.mktemp("many") / "many.fxr"
    path.write_text(many_rules_text(RULE_COUNT), encoding="utf-8")
    return fxrules.load_rules(path)


def test_many_rules_load(many_rules):
    assert len(many_rules) == RULE_COUNT
    assert len(set(many_rules.names)) == RULE_COUNT
    assert many_rules.names[-2:] == ["keep_dropout_out", "relu_twice"]


@pytest.mark.parametrize("name, expected", [
    ("redundant", {"keep_dropout_out": 1, "relu_twice": 1}),
    ("mlp", {"keep_dropout_out": 2}),
])
def test_many_rules_apply_to_zoo_models(many_rules, name, expected):
    model = zoo.ZOO[name]()
    inputs = zoo.example_inputs(name)
    result = fxrules.apply_rules(model, many_rules, example_inputs=inputs)
    assert result.counts == expected
    with torch.no_grad():
        assert_close(result.module(*inputs), model(*inputs), rtol=0, atol=0)
    # the same as applying just the two rules that match
    small = many_rules.select(names=["keep_dropout_out", "relu_twice"])
    assert fxrules.apply_rules(model, small).module.code == result.module.code


# ---------------------------------------------------------------------------
# (d) the work grows linearly with the graph
# ---------------------------------------------------------------------------
#
# A quadratic step hides at the sizes the other tests use and costs seconds at 16,000 nodes (an
# in-place run of ``add -> sub(x, neg(y))`` over 16,000 adds once took 20.7 s against 1.3 s copying:
# each erasure walked back over every node made before it; with ``neg(neg($v)) -> $v`` beside it,
# 8,000 adds took 52 s either way: each rewrite revisited every user of the input it took a user
# from). Timing it would be noise on a shared machine; counting the Python calls and lines a run executes is
# exact: at four times the nodes a linear run makes about four times the calls and lines (less: some
# work is per run), a quadratic one about sixteen.


def python_steps(run) -> int:
    """How many Python function calls and lines ``run()`` executes (a loop in Python counts each turn: the
    further-root search once walked every user of an input per match in a loop without a call)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return count


def every_add_reads_x(n: int) -> fx.GraphModule:
    """``v = v + x``, ``n`` times: every add reads the input, and each rewrite of one leaves the nodes it
    made right before the next add."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    value = x
    for _ in range(n):
        value = graph.call_function(torch.add, (value, x))
    graph.output(value)
    return fx.GraphModule(nn.Module(), graph)


def one_node_many_readers(n: int) -> fx.GraphModule:
    """``r = relu(relu(x))`` read by ``n`` negations, summed: the rewrite rewires ``n`` users at once."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    r = graph.call_function(torch.relu, (graph.call_function(torch.relu, (x,)),))
    total = graph.call_function(torch.neg, (r,))
    for _ in range(n - 1):
        total = graph.call_function(torch.add, (total, graph.call_function(torch.neg, (r,))))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def chain_of_views(n: int) -> fx.GraphModule:
    """``v = v.transpose(0, 1)``, ``n`` times: every node is a view of the input, the last one returned."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(n):
        value = graph.call_method("transpose", (value, 0, 1))
    graph.output(value)
    return fx.GraphModule(nn.Module(), graph)


def chain_of_views_written(n: int) -> fx.GraphModule:
    """:func:`chain_of_views`, the last view then written in place (``add_``): the write reaches every view."""
    gm = chain_of_views(n)
    output = gm.graph.output_node()
    with gm.graph.inserting_before(output):
        gm.graph.call_method("add_", (output.args[0], 1))
    gm.recompile()
    return gm


def views_of_one_input(n: int) -> fx.GraphModule:
    """``relu(relu(x.view(-1)))`` ``n / 4`` times, summed, then the input written in place (``mul_``)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = None
    for _ in range(n // 4):
        r = graph.call_function(torch.relu, (graph.call_function(torch.relu, (graph.call_method("view", (x, -1)),)),))
        total = r if total is None else graph.call_function(torch.add, (total, r))
    graph.call_method("mul_", (x, 2))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def sin_cos_pairs(n: int) -> fx.GraphModule:
    """``sin(x) + cos(x)`` ``n / 3`` times, summed: every pair reads the input."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = None
    for _ in range(n // 3):
        pair = graph.call_function(torch.add, (graph.call_function(torch.sin, (x,)), graph.call_function(torch.cos, (x,))))
        total = pair if total is None else graph.call_function(torch.add, (total, pair))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def dropouts_of_one_input(n: int) -> fx.GraphModule:
    """``n / 2`` eval-mode Dropouts all reading the input, summed: each removal (``-> $x``) gives the input a
    user."""
    dropouts = nn.ModuleList([nn.Dropout(0.1) for _ in range(n // 2)]).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = x
    for i in range(n // 2):
        total = graph.call_function(torch.add, (total, graph.call_module(f"drop.{i}", (x,))))
    graph.output(total)
    root = nn.Module()
    root.drop = dropouts
    return fx.GraphModule(root, graph)


def module_pairs_of_one_input(n: int) -> fx.GraphModule:
    """``dropout(x) + identity(x)`` by modules of their own (an eval-mode Dropout, an Identity), ``n / 4``
    times, summed: every pair reads the input."""
    root = nn.Module()
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = x
    for i in range(max(1, n // 4)):
        root.add_module(f"drop{i}", nn.Dropout().eval())
        root.add_module(f"same{i}", nn.Identity())
        pair = graph.call_function(operator.add, (graph.call_module(f"drop{i}", (x,)), graph.call_module(f"same{i}", (x,))))
        total = graph.call_function(operator.add, (total, pair))
    graph.output(total)
    return fx.GraphModule(root, graph)


def further_roots_made_beside_one_input(n: int) -> fx.GraphModule:
    """``sin(x) + cos(-(-x))``, ``n / 5`` times, summed: removing a double negation makes ``cos(x)``, the
    further root of a multi-root rule whose first roots, the ``sin(x)``, all read the input."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = x
    for _ in range(max(1, n // 5)):
        twice = graph.call_function(torch.neg, (graph.call_function(torch.neg, (x,)),))
        pair = graph.call_function(torch.add, (graph.call_function(torch.sin, (x,)), graph.call_function(torch.cos, (twice,))))
        total = graph.call_function(torch.add, (total, pair))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def casts_of_one_input(n: int) -> fx.GraphModule:
    """``relu(x.to(torch.float32))`` ``n / 3`` times, summed: every cast reads the input."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = None
    for _ in range(n // 3):
        relu = graph.call_function(torch.relu, (graph.call_method("to", (x, torch.float32)),))
        total = relu if total is None else graph.call_function(torch.add, (total, relu))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def summed_blocks(n: int, per_block: int, block) -> fx.GraphModule:
    """``block(graph, x)``, a value, ``n // per_block`` times over one input, the values summed."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = None
    for _ in range(n // per_block):
        value = block(graph, x)
        total = value if total is None else graph.call_function(torch.add, (total, value))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


def written_products_beside_adds(n: int) -> fx.GraphModule:
    """Per block of four nodes ``(x * 1).add_(1)`` and ``neg(x + 0)``, the product and the negation summed:
    every block reads the input twice."""
    def block(graph, x):
        product = graph.call_function(torch.mul, (x, 1))
        graph.call_method("add_", (product, 1))
        negated = graph.call_function(torch.neg, (graph.call_function(torch.add, (x, 0)),))
        return graph.call_function(torch.add, (product, negated))

    return summed_blocks(n, 4, block)


def input_written_by_every_block(n: int) -> fx.GraphModule:
    """Per block of three nodes ``x * 1``, then ``x.add_(1)``, then a negation of the product, summed: every
    ``add_`` is a view of the input (it returns it), so the input's storage tree is a third of the graph."""
    def block(graph, x):
        product = graph.call_function(torch.mul, (x, 1))
        graph.call_method("add_", (x, 1))
        return graph.call_function(torch.neg, (product,))

    return summed_blocks(n, 3, block)


def negations_of_a_returned_input(n: int) -> fx.GraphModule:
    """The input and ``n - 2`` negations of it, all returned."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((x, *[graph.call_function(torch.neg, (x,)) for _ in range(n - 2)]))
    return fx.GraphModule(nn.Module(), graph)


def chain_before_a_view(n: int) -> fx.GraphModule:
    """``v = v + 0`` ``n - 2`` times, then ``v.view(-1)`` returned: a stride reader below every add."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(n - 2):
        value = graph.call_function(torch.add, (value, 0))
    graph.output(graph.call_method("view", (value, -1)))
    return fx.GraphModule(nn.Module(), graph)


def views_of_views(n: int, between: bool) -> fx.GraphModule:
    """``v = v.view(-1)`` (with ``between``: ``v = (v * 2).view(-1)``) repeated: each view reads the one above."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range((n - 2) // (2 if between else 1)):
        if between:
            value = graph.call_function(torch.mul, (value, 2))
        value = graph.call_method("view", (value, -1))
    graph.output(value)
    return fx.GraphModule(nn.Module(), graph)


def nested_modules(n: int) -> fx.GraphModule:
    """``n`` module calls at three-level paths, alternately an eval-mode Dropout and a ReLU."""
    root = nn.Module()
    graph = fx.Graph()
    value = graph.placeholder("x")
    for i in range(n):
        path = f"a{i % 7}.b{i % 11}.c{i}"
        parent = root
        for part in path.split(".")[:-1]:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(f"c{i}", nn.Dropout(0.1) if i % 2 else nn.ReLU())
        value = graph.call_module(path, (value,))
    graph.output(value)
    return fx.GraphModule(root.eval(), graph)


VIEW_TO_RESHAPE = "rule reshape [exact]: call_method view($x, -1) -> call_method reshape($x, -1)\n"
SPELL = "rule spell [exact]: call_function torch.add($x, $y) -> call_function torch.sub($x, call_function torch.neg($y))\n"

SHAPES = {
    "every_add_reads_x": (every_add_reads_x, SPELL),
    # beside the hub (x, read by every add and then by every neg): a nested rule (its matches reach one
    # level below their roots), a condition on a capture's users, a multi-root rule (its further roots are
    # found among the captures' users); none of them matches, and each rewrite takes a user from x
    "hub_and_a_nested_rule": (every_add_reads_x,
                              SPELL + "rule twice [exact]: call_function torch.neg(call_function torch.neg($v)) -> $v\n"),
    "hub_and_a_users_condition": (every_add_reads_x,
                                  SPELL + "rule twice [exact]: call_function torch.neg(call_function torch.neg($v))"
                                          " where users($v) == 1 -> $v\n"),
    "hub_and_a_multi_root_rule": (every_add_reads_x,
                                  SPELL + "rule pair [exact]: call_function torch.sin($v), call_function torch.cos($v)"
                                          " -> call_function torch.cos($v), call_function torch.sin($v)\n"),
    "cascading_chain": (lambda n: chain((torch.relu,), n),
                        "rule relu_twice [exact]: call_function torch.relu(call_function torch.relu($x))"
                        " -> call_function torch.relu($x)\n"),
    "one_node_many_readers": (one_node_many_readers,
                              "rule relu_twice [exact]: call_function torch.relu(call_function torch.relu($x))"
                              " -> call_function torch.relu($x)\n"),
    # each pair's root reaches the output through every view after it (the check of a replacement that
    # would make the output share storage walked them all, for a replacement sharing only the root's own)
    "chain_of_views": (chain_of_views,
                       "rule transposes [exact]: call_method transpose(call_method transpose($x, $a, $b), $a, $b)"
                       " -> $x\n"),
    # a write after every view: each pair is refused, found by asking for the write below its root (the tree
    # below a root was walked per match: the rest of the chain)
    "chain_of_views_written": (chain_of_views_written,
                               "rule transposes [exact]: call_method transpose(call_method transpose($x, $a, $b), $a,"
                               " $b) -> $x\n"),
    # the storage tree of each match's input is every view of x (asked whether a write reaches it in between)
    "views_of_one_input": (views_of_one_input,
                           "rule relu_twice [exact]: call_function torch.relu(call_function torch.relu($x))"
                           " -> call_function torch.relu($x)\n"),
    # a multi-root rule that matches, over the input every pair reads: the search for each match's cos among
    # the input's users tried every one of them with the matcher, then walked them all (a set test each); it
    # reads the input's users grouped by target now, from the first cos still there
    "multi_root_pairs_over_one_input": (sin_cos_pairs,
                                        "rule pair [exact]: call_function torch.sin($v), call_function torch.cos($v)"
                                        " -> call_function torch.sin($v), call_function torch.cos(call_function"
                                        " torch.neg($v))\n"),
    # a multi-root rule over module calls (matched by class) that all read the input: each match's search for
    # its Identity among the input's users tried every module call with the matcher (a module pattern's pair
    # had no index: `ReLU, Tanh` pairs over 2,000 blocks, 40 s); the input's module calls are grouped by class
    "module_pairs_over_one_input": (module_pairs_of_one_input,
                                    "rule pair [exact]: call_module Dropout($v) as a, call_module Identity($v)"
                                    " where not a.training -> $v, $v\n"),
    # each double negation removed makes a further root beside the input every first root reads: each such
    # rewrite tried every `sin(x)` again (1,000 blocks: 500,000 matches, 16 s); they are followed one at a time
    "further_roots_made_beside_one_input": (further_roots_made_beside_one_input,
                                            "rule pair [exact]: call_function torch.sin($v), call_function torch.cos($v)"
                                            " -> call_function torch.sin(call_function torch.mul($v, 1)),"
                                            " call_function torch.cos(call_function torch.mul($v, 1))\n"
                                            "rule twice [exact]: call_function torch.neg(call_function torch.neg($x))"
                                            " -> $x\n"),
    # each Dropout removed puts the input in its place, under an add: the input's users were all revisited
    # per removal (as a value that gained users); beside a multi-root rule, whose further roots are searched
    # among them
    "dropouts_of_one_input": (dropouts_of_one_input,
                              "rule drop [exact]: call_module Dropout($x) as d where not d.training -> $x\n"
                              "rule pair [exact]: call_function torch.sin($v), call_function torch.cos($v)"
                              " -> call_function torch.cos($v), call_function torch.sin($v)\n"),
    # a multi-root rule pairs the casts and is turned down by a condition on a literal; then each cast is
    # replaced by the input: every such rewrite sent back all the pairs turned down while reading the input
    "casts_of_one_input": (casts_of_one_input,
                           "rule pair [exact]: call_method to($x, $d) as a, call_method to($x, $d) as b"
                           " where $d == torch.float64 -> call_method to($x, $d) as c, c\n"
                           "rule same [exact]: call_method to($x, torch.float32) -> $x\n"),
    # `x * 1` is turned down (its product is written in place), waiting on x; each `x + 0` rewritten takes a
    # user from x and gives it another: every such rewrite sent back every product turned down, and the
    # planner walked every user of x for each (looking for views and writes of it)
    "written_products_beside_adds": (written_products_beside_adds,
                                     "rule one [exact]: call_function torch.mul($x, 1) -> $x\n"
                                     "rule zero [exact]: call_function torch.add($x, 0) -> $x\n"),
    # each `x * 1` is turned down (the input is written after it, and x would stand in for the product): the
    # first writer after the match writes the input, but with more than TREE_LIMIT writers after it the
    # planner walked the input's whole storage tree (every add_) per match
    "input_written_by_every_block": (input_written_by_every_block,
                                     "rule one [exact]: call_function torch.mul($x, 1) -> $x\n"),
    # each negation is turned down (returning the input in its place would make two outputs share storage):
    # the check whether the input is returned walked its users per match
    "negations_of_a_returned_input": (negations_of_a_returned_input,
                                      "rule neg [changes]: call_function torch.neg($x) -> $x\n"),
    # without metadata, each `+ 0` is turned down (x's strides cannot be compared, and the view reads them):
    # finding the view walked the rest of the chain per match
    "chain_before_a_view": (chain_before_a_view, "rule zero [exact]: call_function torch.add($x, 0) -> $x\n"),
    # without metadata, each view made a `reshape` is turned down while a view reads it: the last goes first,
    # then each above it, one at a time. Consecutive views: the check of a replacement that may alias walked
    # up the chain to its storage root per rewrite; with a product between them, each view is turned down for
    # the view two levels below (a guard refusal reading beyond its match) and comes back when that one goes,
    # and the walk looking for a stride reader below each root went down the rest of the chain per rewrite
    "views_made_reshape_from_the_last": (lambda n: views_of_views(n, between=False), VIEW_TO_RESHAPE),
    "views_between_products_made_reshape": (lambda n: views_of_views(n, between=True), VIEW_TO_RESHAPE),
    "nested_modules": (nested_modules,
                       "rule drop [exact]: call_module Dropout($x) as d where not d.training -> $x\n"
                       "rule relus [exact]: call_module ReLU(call_module ReLU($x) as inner) -> call_module inner($x)\n"),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_work_of_a_run_grows_linearly(shape, inplace):
    build, text = SHAPES[shape]
    rules = fxrules.parse_rules(text, source=f"{shape}.fxr")
    fxrules.apply_rules(build(50), rules, inplace=inplace)  # imports and first-call work out of the count
    small, large = build(400), build(1600)
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    expected = large(x.clone())
    results = []
    counts = [python_steps(lambda gm=gm: results.append(fxrules.apply_rules(gm, rules, inplace=inplace)))
              for gm in (small, large)]
    done = [sum(r.counts.values()) + len(r.report.rejected) for r in results]  # rewrites, and matches refused
    assert done[0] and done[1] >= done[0]
    assert_close(results[1].module(x.clone()), expected, rtol=1e-6, atol=1e-6)
    assert counts[1] <= 4.6 * counts[0], f"{counts[1]:,} steps at 1600 nodes against {counts[0]:,} at 400"


def written_products_and_one_sin_cos_pair(n: int) -> fx.GraphModule:
    """Per block of three nodes ``(x * 1).add_(1)``, summed, and one ``sin(x)``, ``cos(x)`` pair: every block
    reads the input the pair reads."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = graph.call_function(torch.add, (graph.call_function(torch.sin, (x,)), graph.call_function(torch.cos, (x,))))
    for _ in range(max(1, (n - 5) // 3)):
        product = graph.call_function(torch.mul, (x, 1))
        graph.call_method("add_", (product, 1))
        total = graph.call_function(torch.add, (total, product))
    graph.output(total)
    return fx.GraphModule(nn.Module(), graph)


MODULE_PAIR = ("rule mods [changes]: call_module ReLU($v) as a, call_module Tanh($v) as b"
               " -> call_module b($v), call_module a($v)\n")


@pytest.mark.parametrize("beside", ["", MODULE_PAIR], ids=["alone", "beside_a_module_pair"])
@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "inplace"])
def test_a_looping_multi_root_rule_beside_refused_matches_reaches_its_error_in_linear_work(inplace, beside):
    """A rule set that loops (``sin, cos -> cos, sin``) beside matches turned down over the value the loop
    reads (each ``x * 1`` is written in place): each rewrite of the pair makes a ``cos(x)`` that may be the
    further root of a match whose first root is another user of ``x``, and those users are revisited for the
    multi-root rules only. Revisited for every rule, each turned-down product was planned again per rewrite:
    1,200 random nodes took 148 s to the loop's error (8.7 s now). Beside a multi-root rule rooted on a module
    call (matched by class, which no (op, target) pair names), the input's module calls are read too."""
    rules = fxrules.parse_rules(
        beside + "rule one [exact]: call_function torch.mul($x, 1) -> $x\n"
        "rule pair [exact]: call_function torch.sin($v), call_function torch.cos($v)"
        " -> call_function torch.cos($v), call_function torch.sin($v)\n", source="loop.fxr")
    counts = []
    for n in (400, 1600):
        gm = written_products_and_one_sin_cos_pair(n)
        before = gm.code

        def run(gm=gm, n=n):
            with pytest.raises(fxrules.RewriteLoopError, match="`pair` \\(200 of the last 200\\)"):
                fxrules.apply_rules(gm, rules, inplace=inplace, max_iterations=n // 2)

        counts.append(python_steps(run))
        assert gm.code == before  # untouched, in place too: the run failed
    assert counts[1] <= 4.6 * counts[0], f"{counts[1]:,} steps at 1600 nodes against {counts[0]:,} at 400"


def test_undoing_a_long_in_place_run_is_linear_and_complete():
    """A run that fails after thousands of rewrites gives the graph back exactly, in work linear in its edits."""
    from tests.engine.test_inplace import assert_same_deep, deep_snapshot

    build, text = SHAPES["every_add_reads_x"]
    rules = fxrules.parse_rules(text, source="spell.fxr")
    counts = []
    for n in (400, 1600):
        gm = build(n)
        before = deep_snapshot(gm)

        def failing_run(gm=gm, n=n):
            with pytest.raises(fxrules.RewriteLoopError):
                fxrules.apply_rules(gm, rules, inplace=True, max_iterations=n - 1)

        counts.append(python_steps(failing_run))
        assert_same_deep(before, deep_snapshot(gm))
        assert fxrules.apply_rules(gm, rules, inplace=True).counts == {"spell": n}
    assert counts[1] <= 4.6 * counts[0], f"{counts[1]:,} steps at 1600 nodes against {counts[0]:,} at 400"
