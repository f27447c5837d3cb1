"""Replacement calls that compute a matched node again, found when the rule is compiled
(fxrules.engine.program.respelled): ``Dropout(F.gelu(Linear($x) as l)) -> F.gelu(l($x))`` keeps the
matched gelu and Linear nodes rather than build copies, decided once per rule instead of searched for
per match. What the rewrite produces must be what it produced when the search decided it: the same
nodes kept, the same outputs, the same refusals."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrules
import inspect

from fxrules.engine.program import HIDDEN_NAME_PREFIX, PBind, PCall, PCapture, PSeq, compile_rules
from fxrules.engine.program import _with_names

CHAIN = """
rule chain [exact]:
    call_module Dropout(call_function F.gelu(call_module Linear($x) as l)) as d
    where not d.training
    -> call_function F.gelu(call_module l($x))
"""


def _program(text: str):
    (program,) = compile_rules(fxrules.parse_rules(text, source="t.fxr")).programs
    return program


def _calls(item) -> list:
    """The replacement calls of ``item``, outermost first."""
    found, stack = [], [item]
    while stack:
        i = stack.pop()
        if hasattr(i, "respells"):
            found.append(i)
            stack.extend(reversed(list(i.args or ()) + [v for _, v in i.kwargs]))
        elif hasattr(i, "items"):
            stack.extend(i.items)
        elif hasattr(i, "inner"):
            stack.append(i.inner)
    return found


def _bound_names(pattern) -> list:
    found, stack = [], [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, PBind):
            found.append(p.name)
            stack.append(p.inner)
        elif isinstance(p, PCall):
            stack.extend(p.args or ())
            stack.extend(v for _, v in p.kwargs)
    return found


# -- what the compiler marks ---------------------------------------------------------------------------

def test_a_chain_is_marked_call_by_call_and_the_unnamed_node_gets_a_hidden_name():
    program = _program(CHAIN)
    outer, inner = _calls(program.replacements[0])
    assert inner.respells == "l"
    assert outer.respells.startswith(HIDDEN_NAME_PREFIX)
    assert outer.respells in _bound_names(program.roots[0])
    # every signature binding of the root sees the named gelu pattern, so the matcher binds the name
    (sig, bound), = program.roots[0].inner.overloads
    assert isinstance(bound["input"], PBind) and bound["input"].name == outer.respells


@pytest.mark.parametrize("text", [
    # another keyword than the pattern's
    "rule r: call_function torch.relu(call_function F.gelu($x)) -> call_function F.gelu($x, approximate='tanh')",
    # a float literal (-0.0 == 0.0): never taken for the same value
    "rule r: call_function torch.relu(call_function torch.add($x, 0.0)) -> call_function torch.add($x, 0.0)",
    # commuting operands may have matched either way round
    "rule r: call_function torch.relu(call_function operator.add($x, $y)) -> call_function operator.add($x, $y)",
    # `...` takes what the pattern does not spell
    "rule r: call_function torch.relu(call_function F.gelu($x, ...)) -> call_function F.gelu($x)",
    # another target
    "rule r: call_function torch.relu(call_function F.gelu($x)) -> call_function F.silu($x)",
    # inside an alternative the call may not have matched at all
    "rule r: call_function torch.relu(call_function F.gelu($x) | call_function F.silu($x)) -> call_function F.gelu($x)",
    # the root itself is never kept
    "rule r: call_function torch.relu($x) -> call_function torch.neg(call_function torch.relu($x))",
    # a module the replacement makes is a new module
    "rule r: call_module ReLU(call_module Linear($x)) -> call_module Linear{in_features=2, out_features=2}($x)",
])
def test_calls_that_are_not_the_matched_node_are_not_marked(text):
    program = _program(text)
    assert all(c.respells is None for c in _calls(program.replacements[0]))


def test_an_int_literal_and_a_keyword_are_the_same_when_spelled_the_same():
    program = _program("rule r: call_function torch.relu(call_function torch.sum($x, 1, keepdim=True)) "
                       "-> call_function torch.sum($x, 1, keepdim=True)")
    (call,) = _calls(program.replacements[0])
    assert call.respells is not None


def test_several_roots_use_only_the_rules_own_names():
    text = """
rule two:
    call_function torch.relu(call_function torch.neg($x)) as a, call_function torch.sigmoid(call_function torch.exp($x) as e) as b
    -> call_function torch.neg($x), call_function torch.exp($x)
"""
    program = _program(text)
    neg, exp = (c for r in program.replacements for c in _calls(r))
    assert neg.respells is None  # unnamed: no hidden name in a rule of several roots
    assert exp.respells == "e"
    assert not any(n.startswith(HIDDEN_NAME_PREFIX) for r in program.roots for n in _bound_names(r))


# -- what the rewrite does ----------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, approximate: bool = False):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.2)
        self.approximate = approximate

    def forward(self, x):
        h = F.gelu(self.fc(x), approximate="none") if self.approximate else F.gelu(self.fc(x))
        return self.drop(h) * 2


def test_the_matched_nodes_are_kept_in_place_with_the_rules_origin():
    gm = fx.symbolic_trace(Block().eval())
    gelu = next(n for n in gm.graph.nodes if n.target is F.gelu)
    fc = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "fc")
    x = torch.randn(3, 6)
    expected = gm(x)
    result = fxrules.apply_rules(gm, fxrules.parse_rules(CHAIN, source="t.fxr"), inplace=True)
    assert result.counts == {"chain": 1}
    nodes = list(result.module.graph.nodes)
    assert gelu in nodes and fc in nodes  # the very nodes: nothing was built
    assert [n.op for n in nodes].count("call_module") == 1
    assert gelu.meta["fxrules"]["rule"] == "chain" and fc.meta["fxrules"]["rule"] == "chain"
    assert torch.equal(result.module(x), expected)
    assert not any(n.startswith(HIDDEN_NAME_PREFIX) for n in (n.name for n in nodes))


def test_a_node_spelled_with_its_default_is_kept_too():
    """``F.gelu(h, approximate='none')`` matches ``F.gelu($x)`` (the default, given): the replacement's
    ``F.gelu(l($x))`` computes the same, so the node stays, spelled as it was."""
    gm = fx.symbolic_trace(Block(approximate=True).eval())
    gelu = next(n for n in gm.graph.nodes if n.target is F.gelu)
    assert gelu.kwargs == {"approximate": "none"}
    x = torch.randn(3, 6)
    expected = gm(x)
    result = fxrules.apply_rules(gm, fxrules.parse_rules(CHAIN, source="t.fxr"))
    assert result.counts == {"chain": 1}
    (kept,) = [n for n in result.module.graph.nodes if n.target is F.gelu]
    assert kept.name == gelu.name and kept.kwargs == {"approximate": "none"}
    assert torch.equal(result.module(x), expected)


def test_a_node_with_another_argument_does_not_match_at_all():
    gm = fx.symbolic_trace(Block().eval())
    for n in gm.graph.nodes:
        if n.target is F.gelu:
            n.kwargs = {"approximate": "tanh"}
    gm.recompile()
    result = fxrules.apply_rules(gm, fxrules.parse_rules(CHAIN, source="t.fxr"))
    assert result.counts == {}


class Broadcast(nn.Module):
    def forward(self, x, y):
        a, b = torch.broadcast_tensors(torch.relu(x), y)
        return a + b


def test_a_call_among_arguments_compared_as_written_is_named_and_kept():
    """``torch.broadcast_tensors`` has no signature its written arguments bind to: they are compared
    as written, and the re-spelled relu among them is named and found all the same."""
    text = """
rule swap_broadcast [exact]:
    call_function torch.broadcast_tensors(call_function torch.relu($x), $y)
    -> call_function torch.broadcast_tensors($y, call_function torch.relu($x))
"""
    program = _program(text)
    (_, relu) = _calls(program.replacements[0])
    assert relu.respells is not None
    gm = fx.symbolic_trace(Broadcast())
    relu_node = next(n for n in gm.graph.nodes if n.target is torch.relu)
    result = fxrules.find_matches(gm, fxrules.parse_rules(text, source="t.fxr"))
    assert len(result) == 1 and relu_node.name in result[0].nodes
    assert set(result[0].captures) == {"x", "y"}  # hidden names are not captures


class TwoUses(nn.Module):
    def forward(self, x):
        return torch.neg(torch.relu(torch.relu(x)))


def test_relu_of_relu_keeps_the_inner_node_and_its_outputs():
    text = "rule rr [exact]: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)"
    gm = fx.symbolic_trace(TwoUses())
    inner = next(n for n in gm.graph.nodes if n.target is torch.relu)
    x = torch.randn(4)
    expected = gm(x)
    result = fxrules.apply_rules(gm, fxrules.parse_rules(text, source="t.fxr"))
    relus = [n for n in result.module.graph.nodes if n.target is torch.relu]
    assert [n.name for n in relus] == [inner.name]
    assert torch.equal(result.module(x), expected)


def test_a_drawing_node_computed_twice_is_still_refused():
    """``dropout(x) + dropout(x)`` in a replacement says two draws; keeping the one matched node for both
    would make one. The planner refuses it, as when the kept node was searched for per match."""
    text = """
rule twice [exact]:
    call_function torch.relu(call_function torch.bernoulli($x)) as r
    -> call_function operator.add(call_function torch.bernoulli($x), call_function torch.bernoulli($x))
"""

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.bernoulli(x))

    program = _program(text)
    assert [c.respells is not None for c in _calls(program.replacements[0])] == [False, True, True]
    result = fxrules.apply_rules(fx.symbolic_trace(M()), fxrules.parse_rules(text, source="t.fxr"))
    assert result.counts == {}
    assert [r.code.value for r in result.report.rejected] == ["changes-random-draws"]


def test_explain_and_find_matches_do_not_show_hidden_names():
    gm = fx.symbolic_trace(Block().eval())
    rules = fxrules.parse_rules(CHAIN, source="t.fxr")
    (found,) = fxrules.find_matches(gm, rules)
    assert not any(k.startswith(HIDDEN_NAME_PREFIX) for k in found.captures)
    text = str(fxrules.explain(gm, rules))
    assert HIDDEN_NAME_PREFIX + "1" not in text


def test_a_hidden_name_reaches_a_call_bound_to_a_var_positional_parameter():
    """A Python function ``f(*xs)``: its signature binds the pattern's arguments as one sequence, a PSeq
    made around the same pattern objects; the name must be given inside it too, or the matcher (which
    matches by signature) would never bind it."""
    inner = PCall("call_function", (torch.relu,), "torch.relu", (PCapture("x"),), (), False, (), (), None)
    sig = inspect.Signature([inspect.Parameter("xs", inspect.Parameter.VAR_POSITIONAL)])
    outer = PCall("call_function", (torch.add,), "f", (inner, PCapture("y")), (), False,
                  ((sig, {"xs": PSeq((inner, PCapture("y")))}),), (), None)
    named = _with_names(outer, {id(inner): "%1"})
    assert isinstance(named.args[0], PBind) and named.args[0].name == "%1" and named.args[0].inner is inner
    ((_, bound),) = named.overloads
    assert isinstance(bound["xs"], PSeq)
    assert isinstance(bound["xs"].items[0], PBind) and bound["xs"].items[0].name == "%1"
    assert bound["xs"].items[1] == PCapture("y")


class Viewed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.drop(F.gelu(self.fc(x))).view(-1)  # `view` reads the strides of what replaces the dropout


def test_a_kept_node_without_a_value_is_given_one_by_the_dry_run():
    """A graph with values where the re-spelled gelu has lost its ``meta['val']``: the dry run computes the
    replacement's value from its arguments' values, as for any call, rather than leave it unknown (which
    the layout guard, with a stride reader downstream, would have to refuse)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = fx.symbolic_trace(Viewed().eval())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(torch.randn(2, 4)))
    gelu = next(n for n in gm.graph.nodes if n.target is F.gelu)
    del gelu.meta["val"]
    x = torch.randn(2, 4)
    expected = gm(x)
    result = fxrules.apply_rules(gm, fxrules.parse_rules(CHAIN, source="t.fxr"))
    assert result.counts == {"chain": 1}, [r.code for r in result.report.rejected]
    assert torch.equal(result.module(x), expected)
