"""After each rewrite the fixpoint revisits the nodes whose matches it may have changed
(``engine.driver._Session._revisit``): the touched nodes and their users up to
``_revisit_reach`` levels. These tests hold the reach to what rules can read, and the run to a
fixpoint, on both sides of the line where a rule set needs one level less."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn

import fxrules
from fxrules.engine.driver import _Session, _revisit_reach, prepare
from fxrules.engine.program import compile_rules


def reach_of(text: str) -> tuple:
    """(the deepest pattern's depth, the reach) of a run of ``text``'s rules."""
    work = prepare(nn.Sequential(nn.ReLU()), tracer=None, concrete_args=None, example_inputs=None)
    session = _Session(work, fxrules.parse_rules(text))
    return session.depth, session.reach


RELU_PAIR = "call_module ReLU(call_module ReLU($x) as a) -> call_module a($x)\n"
DROPOUT = "call_module Dropout($x) as d where not d.training -> $x\n"


@pytest.mark.parametrize("text, depth, reach", [
    (RELU_PAIR, 2, 1),  # no condition
    (RELU_PAIR + DROPOUT, 2, 1),  # a module flag reads the module, which no rewrite changes
    ("call_function torch.neg(call_function torch.neg(call_function torch.neg($x))) -> $x\n", 3, 2),
    # a condition that reads a capture: its users, its metadata, or the node itself through a function
    (RELU_PAIR + "call_function torch.relu($x) where users($x) == 1 -> $x\n", 2, 2),
    (RELU_PAIR + "call_function torch.relu($x) where $x.ndim == 2 -> $x\n", 2, 2),
    (RELU_PAIR + "call_function torch.relu($x) where is_constant($x) -> $x\n", 2, 2),
    # a multi-root rule finds its other roots through the captures' users
    (RELU_PAIR + "call_function torch.sin($x) as s, call_function torch.cos($x) as c -> "
                 "call_function torch.cos($x), call_function torch.sin($x)\n", 2, 2),
])
def test_the_reach_is_one_level_less_only_when_no_rule_reads_a_capture(text, depth, reach):
    assert reach_of(text) == (depth, reach)


def test_reach_of_a_rule_set_of_one_level_patterns():
    programs = compile_rules(fxrules.parse_rules(DROPOUT)).programs
    assert _revisit_reach(programs, 1) == 0  # only the touched nodes: their own inputs changed
    programs = compile_rules(fxrules.parse_rules("call_function torch.relu($x) where users($x) == 1 -> $x\n")).programs
    assert _revisit_reach(programs, 1) == 1


def to_fixpoint(model: nn.Module, text: str, inplace: bool = False) -> fxrules.RewriteResult:
    """``text``'s rules applied to the traced ``model`` (copying, or in place); a second run on the result
    applies nothing."""
    rules = fxrules.parse_rules(text)
    result = fxrules.apply_rules(fx.symbolic_trace(model), rules, inplace=inplace)
    assert not fxrules.apply_rules(result.module, rules).report.applied
    return result


@pytest.fixture(params=[None, 0], ids=["reach as computed", "no reach"])
def any_reach(request, monkeypatch):
    """The revisit's reach as the rule set asks for it, or none at all (only the touched nodes)."""
    if request.param is not None:
        monkeypatch.setattr("fxrules.engine.driver._revisit_reach", lambda programs, depth: request.param)


class UsersAtTheCaptureLevel(nn.Module):
    """``a = sin(x)`` is used by ``b = relu(a)`` (under ``c = neg(b)``) and by ``d = a + y``. The rule rooted
    at ``c`` needs ``users(a) == 1``; another rule replaces ``d`` by ``y``, so ``a`` loses a user two levels
    below ``c``, where the first rule reads it as a capture."""

    def forward(self, x, y):
        a = torch.sin(x)
        c = torch.neg(torch.relu(a))
        return c, a + y


USERS_RULES = (
    "rule neg_relu \"neg(relu(y)) when y has one user\" [changes]:\n"
    "    call_function torch.neg(call_function torch.relu($y)) where users($y) == 1 -> call_function torch.tanh($y)\n"
    "rule drop_add \"a + b is b\" [changes]:\n"
    "    call_function operator.add($a, $b) -> $b\n"
)


def test_a_capture_losing_a_user_two_levels_below_a_root_is_revisited(any_reach):
    result = to_fixpoint(UsersAtTheCaptureLevel(), USERS_RULES)
    # neg_relu is tried first (rule order) and its condition fails (sin has two users): the match waits on
    # the nodes it read; drop_add then leaves sin one user, and sin sends neg_relu's match back (a node that
    # only lost a user is not revisited through its users: the waiting match is what finds it, with any reach)
    assert result.counts == {"drop_add": 1, "neg_relu": 1}
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    c, d = result.module(x, y)
    assert torch.equal(c, torch.tanh(torch.sin(x))) and torch.equal(d, y)


def test_one_level_less_reaches_every_match_of_a_module_chain():
    """Runs of ReLUs broken by eval-mode Dropouts: each rewrite makes the next match (a Dropout
    removed joins two runs); every pair is found, in one run, and a second run finds nothing."""
    layers = []
    for i in range(12):
        layers += [nn.Linear(4, 4)] + [nn.ReLU() for _ in range(1 + i % 4)] + [nn.Dropout(0.1)] * (i % 2) \
            + [nn.ReLU()] * (i % 3)
    model = nn.Sequential(*layers).eval()
    rules = fxrules.parse_rules(RELU_PAIR + DROPOUT)
    gm = fx.symbolic_trace(model)
    assert _Session(prepare(gm, tracer=None, concrete_args=None, example_inputs=None), rules).reach == 1
    result = fxrules.apply_rules(gm, rules)
    kinds = [type(result.module.get_submodule(n.target)).__name__ for n in result.module.graph.nodes
             if n.op == "call_module"]
    assert "Dropout" not in kinds
    assert all(not (a == b == "ReLU") for a, b in zip(kinds, kinds[1:]))  # no two ReLUs in a row left
    assert not fxrules.apply_rules(result.module, rules).report.applied
    x = torch.randn(2, 4)
    assert torch.equal(result.module(x), model(x))



class InteriorUsedOutside(nn.Module):
    """``a = relu(x)`` is read by ``relu(a)`` and by ``a * y``: ``relu(relu(x))`` is turned down (``a``,
    matched inside it, is used outside) until a later rule drops the product, and ``a`` with it. That
    rewrite touches ``y`` and the sum, not ``relu(a)``."""

    def forward(self, x, y):
        a = torch.relu(x)
        return torch.relu(a) + a * y


INTERIOR_RULES = (
    "rule relu_twice [exact]:\n"
    "    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n"
    "rule drop_factor [changes]:\n"
    "    call_function operator.mul($p, $q) -> $q\n"
)


def test_a_match_turned_down_is_sent_back_by_a_node_it_read_losing_a_user(any_reach):
    """A node that only lost a user is not revisited through its users: the matches turned down while
    reading it wait on it, and come back when it changes, whatever the reach."""
    result = to_fixpoint(InteriorUsedOutside(), INTERIOR_RULES)
    assert [a.rule for a in result.report.applied] == ["drop_factor", "relu_twice"]
    assert not result.report.rejected  # the refusal that came first is not reported: the match went through
    x, y = torch.randn(5), torch.randn(5)
    assert torch.equal(result.module(x, y), torch.relu(x) + y)


class ValueGainsUsers(nn.Module):
    """``neg(x)`` comes first, under a rule that needs ``users($x) >= 3``; then ``mul(x, 1)``, read by ``sin`` and
    ``cos``, which a rule replaces by ``x``: ``x`` loses one user and gains two."""

    def forward(self, x):
        n = torch.neg(x)
        m = torch.mul(x, 1)
        return n, torch.sin(m), torch.cos(m)


GAINED_RULES = (
    "rule shared_neg [changes]:\n"
    "    call_function torch.neg($x) where users($x) >= 3 -> call_function torch.sub(0, $x)\n"
    "rule mul_one [changes]:\n"
    "    call_function torch.mul($x, 1) -> $x\n"
)


def test_a_match_turned_down_is_sent_back_by_a_node_it_read_gaining_users(any_reach):
    """A value put in a root's place (``-> $x``) is not revisited through its users (a hub's users were
    all revisited per rewrite: quadratic); what its new users may change, a condition on ``users($x)``, is
    a match turned down while reading it, which comes back. (A value gains users only where it also loses
    the matched node that read it, an interior node used outside being refused: both send the match back.)"""
    result = to_fixpoint(ValueGainsUsers(), GAINED_RULES)
    assert [a.rule for a in result.report.applied] == ["mul_one", "shared_neg"]
    x = torch.randn(5)
    first, *_ = result.module(x)
    assert torch.equal(first, 0 - x)


class FurtherRootMadeLater(nn.Module):
    """``sin(x)`` and ``neg(neg(x))``: a rule turns the second into ``cos(x)``, the further root of a
    multi-root rule whose first root, ``sin(x)``, nothing else touches."""

    def forward(self, x):
        return torch.sin(x), torch.neg(torch.neg(x))


FURTHER_RULES = (
    "rule pair \"sin and cos of one value\" [changes]:\n"
    "    call_function torch.sin($v), call_function torch.cos($v) -> call_function torch.tanh($v), "
    "call_function torch.sigmoid($v)\n"
    "rule to_cos [changes]:\n"
    "    call_function torch.neg(call_function torch.neg($v)) -> call_function torch.cos($v)\n"
)


def test_a_node_made_that_may_be_a_further_root_sends_back_its_siblings(any_reach):
    result = to_fixpoint(FurtherRootMadeLater(), FURTHER_RULES)
    assert [a.rule for a in result.report.applied] == ["to_cos", "pair"]
    x = torch.randn(5)
    first, second = result.module(x)
    assert torch.equal(first, torch.tanh(x)) and torch.equal(second, torch.sigmoid(x))


class FurtherRootAmongManyUsers(nn.Module):
    """The input is read by 70 negations (a hub: its users are read grouped by target), by ``relu(x)`` and
    ``sin(x)``, and, through ``x * 1``, by ``tanh`` and ``cos``: removing the product makes ``tanh(x)`` and
    ``cos(x)``, further roots of multi-root rules whose first roots, ``relu(x)`` and ``sin(x)``, nothing else
    touches (a module call, matched by class, and a function call)."""

    def __init__(self):
        super().__init__()
        self.relu, self.tanh = nn.ReLU(), nn.Tanh()

    def forward(self, x):
        total = self.relu(x) + torch.sin(x)
        for _ in range(70):
            total = total + torch.neg(x)
        product = x * 1
        return total, self.tanh(product), torch.cos(product)


HUB_FURTHER_RULES = (
    "rule modules [changes]:\n"
    "    call_module ReLU($v) as a, call_module Tanh($v) as b -> call_module a($v), call_module a($v)\n"
    "rule functions [changes]:\n"
    "    call_function torch.sin($v), call_function torch.cos($v) -> call_function torch.tanh($v), "
    "call_function torch.sigmoid($v)\n"
    "rule mul_one [exact]:\n"
    "    call_function operator.mul($x, 1) -> $x\n"
)


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "in place"])
def test_a_further_root_made_beside_a_hub_sends_back_its_siblings(inplace):
    model = FurtherRootAmongManyUsers()
    x = torch.randn(5)
    expected = model(x)
    result = to_fixpoint(model, HUB_FURTHER_RULES, inplace)
    assert [a.rule for a in result.report.applied] == ["mul_one", "modules", "functions"]
    total, tanh, cos = result.module(x)
    # the tanh module's place reads relu(x); sin's place reads tanh(x), cos's sigmoid(x)
    assert torch.equal(tanh, torch.relu(x)) and torch.equal(cos, torch.sigmoid(x))
    assert torch.allclose(total, expected[0] - torch.sin(x) + torch.tanh(x))


class LaterFirstRootAmongManyUsers(nn.Module):
    """The input is read by 70 negations and two ``sin(x)``, the first of them used twice; removing a double
    negation makes ``cos(x)``, the further root of a rule whose condition turns down the first ``sin`` and
    takes the second: the hub's first roots are followed past one that does not take the node made."""

    def forward(self, x):
        first, second = torch.sin(x), torch.sin(x)
        total = first + first * 2 + second
        for _ in range(70):
            total = total + torch.neg(x)
        return total + torch.cos(torch.neg(torch.neg(x)))


LATER_FIRST_ROOT_RULES = (
    "rule pair [changes]:\n"
    "    call_function torch.sin($v) as s, call_function torch.cos($v) where users(s) == 1\n"
    "    -> call_function torch.tanh($v), call_function torch.sigmoid($v)\n"
    "rule twice [exact]:\n"
    "    call_function torch.neg(call_function torch.neg($x)) -> $x\n"
)


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "in place"])
def test_the_first_roots_beside_a_hub_are_followed_past_one_that_does_not_match(inplace):
    model = LaterFirstRootAmongManyUsers()
    x = torch.randn(5)
    result = to_fixpoint(model, LATER_FIRST_ROOT_RULES, inplace)
    assert [(a.rule, a.matched[0]) for a in result.report.applied] == [("twice", "neg_71"), ("pair", "sin_1")]
    expected = model(x) - torch.sin(x) - torch.cos(x) + torch.tanh(x) + torch.sigmoid(x)
    assert torch.allclose(result.module(x), expected)


class LoudTanh(nn.Tanh):
    """A subclass that computes as ``Tanh``: a ``Tanh`` pattern matches it."""


def subclass_among_many_users() -> fx.GraphModule:
    """The input is read by 70 negations, a ``Sigmoid``, a ``ReLU`` and a :class:`LoudTanh` (module calls,
    made directly: tracing would go into the subclass): the search for the further root reads the input's
    module calls grouped by class, and the group of a subclass counts."""
    root = nn.Module()
    root.sigmoid, root.relu, root.tanh = nn.Sigmoid(), nn.ReLU(), LoudTanh()
    graph = fx.Graph()
    x = graph.placeholder("x")
    total = graph.call_function(operator.add, (graph.call_module("sigmoid", (x,)), graph.call_module("relu", (x,))))
    for _ in range(70):
        total = graph.call_function(operator.add, (total, graph.call_function(torch.neg, (x,))))
    graph.output(graph.call_function(operator.add, (total, graph.call_module("tanh", (x,)))))
    return fx.GraphModule(root, graph)


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "in place"])
def test_a_further_root_of_a_subclass_is_found_among_many_users(inplace):
    gm = subclass_among_many_users()
    x = torch.randn(5)
    expected = gm(x) - torch.tanh(x) + torch.relu(x)
    rules = fxrules.parse_rules(
        "rule pair [changes]: call_module ReLU($v) as a, call_module Tanh($v) as b -> call_module a($v), call_module a($v)\n")
    result = fxrules.apply_rules(gm, rules, inplace=inplace)
    assert [(a.rule, a.matched) for a in result.report.applied] == [("pair", ("relu", "tanh"))]
    assert torch.allclose(result.module(x), expected)


def test_further_roots_index_the_roots_after_the_first():
    from fxrules.engine.program import further_roots

    programs = compile_rules(fxrules.parse_rules(FURTHER_RULES + RELU_PAIR)).programs
    index = further_roots(programs)
    assert set(index.by_key) == {("call_function", torch.cos)}
    assert [p.name for p in index.programs] == ["pair"]
    assert further_roots(compile_rules(fxrules.parse_rules(RELU_PAIR)).programs).by_key == {}


class ReaderBelowAChain(nn.Module):
    """``contiguous(x.t())`` three nodes above a ``view``: an ``[exact]`` rule dropping the ``contiguous`` is
    turned down while the view (a stride reader) is below it, and a rule on the view, three levels down,
    makes it a ``reshape`` (which reads no strides). The refusal read the graph below the root, which no
    wait covers: the driver tries it again when its worklist runs dry."""

    def forward(self, x):
        c = x.t().contiguous()
        return (c * 2).view(-1) + 1


READER_RULES = (
    "rule drop_contiguous [exact]:\n"
    "    call_method contiguous($x) -> $x\n"
    "rule view_to_reshape [exact]:\n"
    "    call_method view($x, -1) -> call_method reshape($x, -1)\n"
)


@pytest.mark.parametrize("inplace", [False, True], ids=["copying", "in place"])
def test_a_layout_refusal_lapses_when_the_stride_reader_below_it_goes(inplace):
    rules = fxrules.parse_rules(READER_RULES)
    model = ReaderBelowAChain()
    gm = fx.symbolic_trace(model)
    result = fxrules.apply_rules(gm, rules, inplace=inplace)
    assert [a.rule for a in result.report.applied] == ["view_to_reshape", "drop_contiguous"]
    assert not result.report.rejected  # the refusal that came first is not reported: the match went through
    assert "contiguous" not in result.module.code
    assert not fxrules.apply_rules(result.module, rules).report.applied
    x = torch.randn(3, 4)
    assert torch.equal(result.module(x), model(x))


def test_a_layout_refusal_that_still_holds_is_tried_again_only_after_a_rewrite(monkeypatch):
    """Each ``contiguous`` has its own ``view`` below it (which stays): refused once each when nothing is
    rewritten after; when rewrites follow (``x * 2`` at the end of each block), the sweep finds each view
    still below its root and does not try the match again; the refusals are reported as before."""
    from fxrules.engine import driver

    tries = []
    real = driver.apply_match
    monkeypatch.setattr(driver, "apply_match", lambda work, match, plan: tries.append(match.rule.name)
                        or real(work, match, plan))

    class Blocks(nn.Module):
        def __init__(self, n, tail):
            super().__init__()
            self.n, self.tail = n, tail

        def forward(self, x):
            for _ in range(self.n):
                x = x.t().contiguous().view(-1).view(4, 3).t()
                if self.tail:
                    x = x * 2
            return x

    rules = fxrules.parse_rules(READER_RULES.split("rule view_to_reshape")[0]
                                + "rule twice [exact]:\n    call_function operator.mul($x, 2) -> call_function operator.add($x, $x)\n")
    result = fxrules.apply_rules(fx.symbolic_trace(Blocks(5, tail=False)), rules)
    assert tries.count("drop_contiguous") == 5 and not result.report.applied
    assert [r.code for r in result.report.rejected] == [fxrules.RefusalCode.LAYOUT_CHANGED] * 5
    tries.clear()
    result = fxrules.apply_rules(fx.symbolic_trace(Blocks(5, tail=True)), rules)
    assert result.counts == {"twice": 5}
    # each refusal is followed by rewrites (the products below), so the sweep looks again; the views stand
    assert tries.count("drop_contiguous") == 5
    assert [r.code for r in result.report.rejected] == [fxrules.RefusalCode.LAYOUT_CHANGED] * 5


def test_an_output_alias_refusal_lapses_when_the_outputs_change():
    """The guard's ``output-alias-introduced`` read every output: it may lapse once the output node's
    arguments are others (the driver then tries the match again)."""
    from fxrules.engine.guards import read_beyond
    from fxrules.engine.refusals import Refusal, RefusalCode

    work = prepare(fx.symbolic_trace(ReaderBelowAChain()), tracer=None, concrete_args=None, example_inputs=None)
    session = _Session(work, fxrules.parse_rules(READER_RULES))
    program = session.compiled.programs[0]
    match = next(m for m in (session.match_directly(program, n) for n in work.graph.nodes) if m is not None)
    root = match.roots[0]
    read = read_beyond(work, match, Refusal(RefusalCode.OUTPUT_ALIAS_INTRODUCED, "", (root.name,)))
    assert read is not None and not read.may_have_lapsed(work)
    output = work.graph.output_node()
    output.args = (output.args[0],)  # the same value, another args object: the outputs may have changed
    assert read.may_have_lapsed(work)
    assert read_beyond(work, match, Refusal(RefusalCode.SHAPE_CHANGED, "", (root.name,))) is None
    layout = read_beyond(work, match, Refusal(RefusalCode.LAYOUT_CHANGED, "", (root.name, "view")))
    assert layout is not None and not layout.outputs_read and not layout.may_have_lapsed(work)
    assert read_beyond(work, match, Refusal(RefusalCode.LAYOUT_CHANGED, "", (root.name, output.name))).outputs_read
