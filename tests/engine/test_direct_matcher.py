"""Direct matchers (``engine.matcher.direct_matcher``): a rule's pattern as nested closures, which the
fixpoint asks before the interpreter. Wherever one decides, it must answer what ``match_program``
answers: the same match (roots, captures, names, matched nodes in their order, get_attr nodes, rest)
or a miss. These tests hold the two to that on the bundled library and on hand-written rules over
the fuzzer's random graphs, and check which forms get a direct matcher at all."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from torch import fx, nn

import fxrules
from fxrules.engine.matcher import UNDECIDED, GraphView, Miss, direct_matcher, match_program
from fxrules.engine.program import compile_rules
from tests.engine.test_fuzz_engine import RULES_DIR, build, graph_specs

HAND_WRITTEN = """
rule relu_pair "module pair":
    call_module ReLU(call_module ReLU($x) as a) -> call_module a($x)
rule drop "module with a flag":
    call_module Dropout($x) as d where not d.training -> $x
rule same_twice "one capture twice":
    call_function operator.sub($x, $x) -> $x
rule literal_one "a literal":
    call_function operator.truediv($x, 1) -> $x
rule nested_methods "methods as written":
    call_method transpose(call_method transpose($x, 0, 1), 0, 1) -> $x
rule in_order "a function bound in order, or left to the interpreter":
    call_function torch.relu(call_function torch.relu($x) as inner) -> inner
rule contiguous_pair "a method pair, called with a keyword once":
    call_method contiguous(call_method contiguous($x)) -> call_method contiguous($x)
rule sum_dim "a reduction over one dim, its keyword left to the signature":
    call_function torch.sum($x, $d) -> $x
rule wildcard "any second operand":
    call_function operator.sub($x, _) -> $x
rule either_pair "alternatives whose options bind names and captures differently":
    (call_method transpose(call_method transpose($x, $a, $b) as inner, $a, $b)
     | call_method transpose(call_method transpose($x, $a, $b) as inner, $b, $a)
     | call_function torch.transpose(call_function torch.transpose($x, $a, $b) as inner, $a, $b))
    -> $x
rule nested_choice "an alternative below a call, the first option failing late":
    call_function operator.sub(
        (call_function torch.relu(call_function torch.neg($y)) | call_function torch.relu($y)), $z) -> $z
rule stale_binding "an option that binds a capture, then fails: the next starts from the bindings before it":
    (call_function operator.sub($y, call_function torch.neg($z)) | call_function operator.sub($z, $y)) -> $y
rule drop_half "a module attribute, a literal":
    call_module Dropout{p=0.5}($x) -> $x
rule gelu_kind "a module attribute, captured, and a flag after it":
    (call_module GELU{approximate=$a}($x) as r | call_module ReLU{inplace=$a}($x) as r) -> $x
rule stored_forms "attributes as the module stores them: a bias tensor for True, (3, 3) for 3":
    (call_module Linear{bias=True}($x) | call_module Conv2d{kernel_size=3, padding=1}($x)) -> $x
rule permute_lists "sequences, as a list and as positional dims":
    (call_method permute(call_method permute($x, [$a, $b]), [$c, $d])
     | call_method permute(call_method permute($x, $a, $b), $c, $d))
    -> $x
rule choice_in_order "an option bound in order, or left to the interpreter (a later option matches too)":
    (call_function torch.sum($x, 1) | call_method sum($x, 1)) -> $x
"""

PROGRAMS = compile_rules(fxrules.load_rules(RULES_DIR)).programs + compile_rules(
    fxrules.parse_rules(HAND_WRITTEN)).programs
DIRECT = [(p, d) for p, d in ((p, direct_matcher(p)) for p in PROGRAMS) if d is not None]


def same_answer(program, direct, node: fx.Node, view: GraphView) -> bool:
    """Whether ``direct`` answers for ``node`` what the interpreter does; True also when it leaves it
    to the interpreter (UNDECIDED). Returns whether it decided."""
    found = direct(node, view)
    expected = match_program(program, node, view, explain=False)
    if found is UNDECIDED:
        return False
    if found is None:
        assert isinstance(expected, Miss), f"{program.name} at %{node.name}: direct missed, the interpreter matched"
        return True
    assert not isinstance(expected, Miss), f"{program.name} at %{node.name}: direct matched, the interpreter missed"
    a, b = found.bindings, expected.bindings
    assert found.roots == expected.roots and found.program is expected.program
    assert a.captures == b.captures and list(a.captures) == list(b.captures)
    assert a.names == b.names and list(a.names) == list(b.names)
    assert list(a.nodes) == list(b.nodes) and list(a.attrs) == list(b.attrs)
    assert a.rest == b.rest and a.pending_refs == b.pending_refs
    return True


def compare_everywhere(gm: fx.GraphModule) -> tuple:
    """Every direct matcher at every node of ``gm``: (decided, matched) counts."""
    modules = dict(gm.named_modules())
    view = GraphView(modules.get)
    decided = matched = 0
    for node in gm.graph.nodes:
        for program, direct in DIRECT:
            if same_answer(program, direct, node, view):
                decided += 1
                matched += direct(node, view) is not None
    return decided, matched


def test_the_library_and_the_hand_written_rules_have_direct_matchers():
    names = {p.name for p, _ in DIRECT}
    assert {"relu_pair", "drop", "same_twice", "literal_one", "nested_methods", "in_order", "wildcard",
            "relu_idempotent", "remove_identity", "fold_conv2d_bn", "either_pair", "nested_choice", "permute_lists",
            "choice_in_order", "stale_binding", "drop_half", "gelu_kind", "canonical_relu", "double_transpose", "double_permute_3d", "remove_dropout"} <= names


@pytest.mark.parametrize("text", [
    "call_function torch.relu($x) as a, call_function torch.neg($x) as b -> a, b",  # two roots
    "call_function torch.add(call_function torch.relu($x) | call_function torch.neg($x), $y) -> $y",  # commuting
    "call_function torch.cat([$a, *$bs], 0) -> $a",  # a sequence ending in *$bs
    "(call_function torch.relu($x) | call_function torch.sum($x, dim=1)) -> $x",  # an option with a keyword
    "call_function torch.flatten($x, ...) -> $x",  # rest
    "call_function torch.sum($x, dim=$d) -> $x",  # a keyword pattern
    "call_function torch.add($x, call_function torch.relu($y)) -> $y",  # commuting operands
    "call_function torch.cat([*$xs], 0) -> call_function torch.stack($xs)",  # variadic
])
def test_forms_left_to_the_interpreter_have_none(text):
    (program,) = compile_rules(fxrules.parse_rules(text + "\n")).programs
    assert direct_matcher(program) is None


@given(spec=graph_specs())
def test_direct_matchers_answer_what_the_interpreter_answers_on_random_graphs(spec):
    compare_everywhere(build(spec))


class Traced(nn.Module):
    def __init__(self):
        super().__init__()
        self.relus = nn.Sequential(nn.ReLU(), nn.ReLU(), nn.ReLU())
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(4, 4)
        self.posing = nn.Identity()
        self.posing.__class__ = type("Sneaky", (nn.Identity,), {"forward": lambda self, x: x * 2})
        self.patched = nn.ReLU()
        self.patched.forward = lambda x: x + 1
        self.halves = nn.Sequential(nn.Dropout(0.5), nn.Dropout(0.2), nn.GELU("tanh"), nn.GELU(), nn.ReLU(inplace=True),
                                    nn.ReLU())
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        y = self.relus(self.fc(x))
        z = self.patched(torch.relu(self.drop(y)))
        w = torch.relu(torch.relu(z))
        t = (w / 1 + w).transpose(0, 1).transpose(0, 1)
        t = t.contiguous().contiguous(memory_format=torch.contiguous_format)  # a keyword the pattern has not
        s = torch.sum(t, 0, keepdim=True) + torch.sum(t, 1, dtype=torch.float64).float().sum()
        u = torch.transpose(torch.transpose(t, 0, 1), 0, 1).transpose(1, 0).transpose(0, 1)
        p = u.permute([1, 0]).permute([1, 0]).permute(1, 0).permute(1, 0).permute([1, 0]).permute(1, 0)
        m = (torch.relu(torch.neg(x)) - 2) + (torch.relu(x) - 3) + (torch.relu(torch.neg(torch.relu(x))) - x)
        h = self.halves(x)
        c = self.conv(x.reshape(1, 1, 3, 4))
        return h, c, self.posing(t) - x, torch.relu(input=torch.relu(x)), w - w, torch.relu(input=w), s, torch.sum(t, 1), \
            p, m, t.sum(1), torch.sum(t, 1, keepdim=False)


def test_direct_matchers_answer_what_the_interpreter_answers_on_a_traced_model():
    gm = fx.symbolic_trace(Traced().eval())
    decided, matched = compare_everywhere(gm)
    assert decided > 0 and matched >= 5  # relu pairs, the dropout, relu(relu(z)), w / 1, the transposes, w - w
    # a keyword (relu(input=...)) is left to the interpreter, which binds it
    relu_rule = next(d for p, d in DIRECT if p.name == "in_order")
    view = GraphView(dict(gm.named_modules()).get)
    undecided = [n for n in gm.graph.nodes if n.target is torch.relu and relu_rule(n, view) is UNDECIDED]
    assert len(undecided) >= 2
    # torch.sum(t, 0, keepdim=True): the pattern's two arguments and a keyword, bound by the signature
    sum_rule = next(d for p, d in DIRECT if p.name == "sum_dim")
    sums = [n for n in gm.graph.nodes if n.target is torch.sum]
    assert [sum_rule(n, view) is UNDECIDED for n in sums] == [True, True, False, True]
    # alternatives: an option that cannot decide (a keyword) leaves the whole pattern to the interpreter,
    # though a later option (the method) would match at another node
    choice = next(d for p, d in DIRECT if p.name == "choice_in_order")
    assert [choice(n, view) is UNDECIDED for n in sums] == [True, True, False, True]
    method_sum = next(n for n in gm.graph.nodes if n.op == "call_method" and n.target == "sum" and n.args[1:] == (1,))
    assert choice(method_sum, view) is not None and choice(method_sum, view) is not UNDECIDED
    # options that bind differently: each match is the interpreter's (compare_everywhere), and these match
    # (permute(x, 1, 0) against the list option, whose call is bound by the signature: left to the interpreter)
    for name, least in (("either_pair", 3), ("permute_lists", 1), ("nested_choice", 4), ("stale_binding", 5),
                        ("drop_half", 1), ("gelu_kind", 3), ("stored_forms", 2)):
        rule = next(d for p, d in DIRECT if p.name == name)
        found = [n for n in gm.graph.nodes if rule(n, view) not in (None, UNDECIDED)]
        assert len(found) >= least, (name, found)


def test_the_rewrite_gives_the_same_result_with_and_without_direct_matchers(monkeypatch):
    rules = fxrules.parse_rules(HAND_WRITTEN)
    model = Traced().eval()
    x = torch.randn(3, 4)
    first = fxrules.apply_rules(fx.symbolic_trace(model), rules)
    monkeypatch.setattr("fxrules.engine.driver.direct_matcher", lambda program: None)
    second = fxrules.apply_rules(fx.symbolic_trace(model), rules)
    assert first.module.code == second.module.code
    assert [(a.rule, a.matched, a.created, a.replaced_by) for a in first.report.applied] == \
        [(a.rule, a.matched, a.created, a.replaced_by) for a in second.report.applied]
    assert first.counts and torch.equal(first.module(x)[0], second.module(x)[0])
