"""Direct matchers (``engine.matcher.direct_matcher``): a rule's pattern as nested closures, which the
fixpoint asks before the interpreter. Wherever one decides, it must answer what ``match_program``
answers: the same match (roots, captures, names, matched nodes in their order, get_attr nodes, rest)
or a miss. These tests hold the two to that on the bundled library and on hand-written rules over
the fuzzer's random graphs, and check which forms get a direct matcher at all."""

from __future__ import annotations

import torch
from hypothesis import given
from torch import fx, nn

import fxrules
from fxrules.engine.matcher import GraphView, Miss, direct_matcher, match_program
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
rule choice_in_order "an option bound in order, or by the signature (a later option matches too)":
    (call_function torch.sum($x, 1) | call_method sum($x, 1)) -> $x
rule sum_keyword "a keyword pattern, bound by the signature":
    call_function torch.sum($x, dim=$d) -> $x
rule sum_keepdim "a keyword pattern and one the pattern leaves out at its default":
    call_function torch.sum($x, $d, keepdim=True) -> $x
rule option_keyword "an option with a keyword":
    (call_function torch.relu($x) | call_function torch.sum($x, dim=1)) -> $x
rule flatten_rest "`...`: whatever else the call has, kept":
    call_function torch.flatten($x, ...) -> $x
rule sum_rest "`...` after a positional pattern, the call bound by its signature":
    call_function torch.sum($x, $d, ...) -> $x
rule method_rest "`...` on a method without a signature of its own: compared as written":
    call_method contiguous($x, ...) -> $x
rule commuting_add "commuting operands: the written order, else exchanged":
    call_function torch.add($x, call_function torch.relu($y)) -> $y
rule commuting_op "an operator that commutes, a capture on both sides":
    call_function operator.add(call_function torch.relu($x), $x) -> $x
rule commuting_choice "an alternative below a commuting call":
    call_function operator.mul(call_function torch.relu($x) | call_function torch.neg($x), $y) -> $y
rule cat_variadic "a list ending in *$bs":
    call_function torch.cat([$a, *$bs], 0) -> $a
rule cat_all "a list that is all *$xs":
    call_function torch.cat([*$xs], 0) -> call_function torch.stack($xs)
rule cat_keyword "a list ending in *$bs, its dim as a keyword":
    call_function torch.cat([$a, *$bs], dim=$d) -> $a
rule method_variadic "*$rest in a call's arguments: the rest of them, as written":
    call_method permute($x, 0, *$rest) -> $x
rule weight "a get_attr pattern, captured":
    call_function operator.add($x, get_attr $w) -> $x
rule named_weight "a get_attr pattern by name":
    call_function operator.mul(get_attr bias, $x) -> $x
rule sum_not_kept "a keyword pattern that a call leaving it out meets with its default":
    call_function torch.sum($x, $d, keepdim=False) -> $x
rule named_twice "a named node referenced later":
    call_function operator.sub(call_function torch.relu($x) as r, r) -> $x
rule named_later "a reference before the name: checked once the match is complete":
    call_function operator.sub(r, call_function torch.relu($x) as r) -> $x
"""

PROGRAMS = compile_rules(fxrules.load_rules(RULES_DIR)).programs + compile_rules(
    fxrules.parse_rules(HAND_WRITTEN)).programs
DIRECT = [(p, d) for p, d in ((p, direct_matcher(p)) for p in PROGRAMS) if d is not None]


def same_answer(program, direct, node: fx.Node, view: GraphView) -> bool:
    """Asserts that ``direct`` answers for ``node`` what the interpreter does; returns whether it matched."""
    found = direct(node, view)
    expected = match_program(program, node, view, explain=False)
    if found is None:
        assert isinstance(expected, Miss), f"{program.name} at %{node.name}: direct missed, the interpreter matched"
        return False
    assert not isinstance(expected, Miss), f"{program.name} at %{node.name}: direct matched, the interpreter missed"
    a, b = found.bindings, expected.bindings
    assert found.roots == expected.roots and found.program is expected.program
    assert a.captures == b.captures and list(a.captures) == list(b.captures)
    assert a.names == b.names and list(a.names) == list(b.names)
    assert list(a.nodes) == list(b.nodes) and list(a.attrs) == list(b.attrs)
    assert a.rest == b.rest and a.pending_refs == b.pending_refs
    return True


def compare_everywhere(gm: fx.GraphModule) -> dict:
    """Every direct matcher at every node of ``gm``, each answer the interpreter's: rule -> matched nodes."""
    modules = dict(gm.named_modules())
    view = GraphView(modules.get)
    matched: dict = {}
    for node in gm.graph.nodes:
        for program, direct in DIRECT:
            if same_answer(program, direct, node, view):
                matched.setdefault(program.name, []).append(node)
    return matched


def test_every_single_root_rule_has_a_direct_matcher():
    """The library's rules and the hand-written ones: only a rule with several roots is left to the
    interpreter (its other roots are searched over the graph: _match_other_root)."""
    missing = [p.name for p in PROGRAMS if direct_matcher(p) is None]
    assert missing == [p.name for p in PROGRAMS if len(p.roots) > 1]
    assert len(DIRECT) >= len(PROGRAMS) - 2


def test_a_rule_with_two_roots_is_left_to_the_interpreter():
    text = "call_function torch.relu($x) as a, call_function torch.neg($x) as b -> a, b\n"
    (program,) = compile_rules(fxrules.parse_rules(text)).programs
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
        self.bias = nn.Parameter(torch.randn(4))
        self.scale = nn.Parameter(torch.randn(4))

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
        # keywords, `...`, *$xs, commuting operands, get_attr nodes, named-node references
        k = torch.sum(t, dim=1) + torch.sum(t, dim=0, keepdim=False).sum() + torch.sum(t, 1, keepdim=True) \
            + t.sum(1, keepdim=True)
        cube = x.reshape(3, 2, 2)
        f = torch.flatten(cube, 1).sum() + torch.flatten(x).sum() + torch.flatten(cube, start_dim=0, end_dim=-1).sum()
        a = torch.add(x, torch.relu(w)) + torch.add(torch.relu(w), x) + torch.add(x, torch.relu(w), alpha=2)
        o = (torch.relu(x) + x) + (x + torch.relu(x)) + torch.relu(x) * w + w * torch.neg(x) + torch.relu(x) * 2
        c2 = torch.cat([x, w, x], 0).sum() + torch.cat([x], 0).sum() + torch.cat([x, w], dim=1).sum() \
            + torch.cat((x, w), 1).sum() + torch.cat([x, w], 1).sum()
        q = cube.permute(0, 2, 1).sum() + cube.permute(1, 0, 2).sum() + cube.permute([0, 2, 1]).sum()
        g = x + self.bias + self.bias * x + x * self.bias + self.scale * x
        r = torch.relu(x)
        n = (r - r) + (torch.relu(x) - torch.relu(x))
        return h, c, self.posing(t) - x, torch.relu(input=torch.relu(x)), w - w, torch.relu(input=w), s, torch.sum(t, 1), \
            p, m, t.sum(1), torch.sum(t, 1, keepdim=False), k, f, a, o, c2, q, g, n


def test_direct_matchers_answer_what_the_interpreter_answers_on_a_traced_model():
    gm = fx.symbolic_trace(Traced().eval())
    matched = compare_everywhere(gm)  # every answer the interpreter's
    view = GraphView(dict(gm.named_modules()).get)

    def where(name: str) -> list:
        rule = next(d for p, d in DIRECT if p.name == name)
        return [n for n in gm.graph.nodes if rule(n, view) is not None]

    def calls(target) -> list:
        return [n for n in gm.graph.nodes if n.target is target]

    # a keyword (relu(input=...)) bound by the signature, beside the calls taken in order
    relus = where("in_order")
    assert len(relus) == 6 and [n.kwargs != {} for n in relus] == [False, False, False, False, True, True]
    # torch.sum(t, $d): a keyword the pattern leaves out must be absent or at its default; dim= binds $d
    sums = calls(torch.sum)  # (0, keepdim=True), (1, dtype=...), (dim=1), (dim=0, keepdim=False), (1, keepdim=True),
    #                          (1), (1, keepdim=False)
    assert [n in where("sum_dim") for n in sums] == [False, False, True, True, False, True, True]
    assert [n in where("sum_keyword") for n in sums] == [False, False, True, True, False, True, True]
    assert [n in where("sum_keepdim") for n in sums] == [True, False, False, False, True, False, False]
    assert [n in where("sum_not_kept") for n in sums] == [False, False, True, True, False, True, True]
    assert [n in where("sum_rest") for n in sums] == [True] * 7
    assert [n in where("choice_in_order") for n in sums] == [False, False, True, False, False, True, True]
    method_sum = next(n for n in gm.graph.nodes if n.op == "call_method" and n.target == "sum" and n.args[1:] == (1,)
                      and not n.kwargs)
    assert method_sum in where("choice_in_order")
    assert [n in where("option_keyword") for n in sums] == [False, False, True, False, False, True, True]
    # `...` keeps what else the call has
    flattens = calls(torch.flatten)
    assert [n in where("flatten_rest") for n in flattens] == [True, True, True]
    rule = next(d for p, d in DIRECT if p.name == "flatten_rest")
    assert [rule(n, view).bindings.rest for n in flattens] == [
        ((1,), {}), ((), {}), ((), {"start_dim": 0, "end_dim": -1})]
    assert [n.kwargs for n in where("method_rest")] == [{}, {"memory_format": torch.contiguous_format}]
    # commuting operands: either order for torch.add; not past a keyword the exchange must leave at its
    # default; an operator only where an operand is known to be a number or a tensor (no metadata here)
    adds = calls(torch.add)
    assert [n in where("commuting_add") for n in adds] == [True, True, False]
    assert [n.args[1].name for n in where("commuting_op")] == ["x"]  # relu(x) + x, not x + relu(x)
    assert len(where("commuting_choice")) == 3  # relu(x) * w, w * neg(x) (w is a relu), relu(x) * 2
    # *$bs in a list: at least the fixed items
    cats = calls(torch.cat)  # ([x, w, x], 0), ([x], 0), ([x, w], dim=1), ((x, w), 1), ([x, w], 1)
    assert [n in where("cat_variadic") for n in cats] == [True, True, False, False, False]
    assert [n in where("cat_all") for n in cats] == [True, True, False, False, False]
    assert [n in where("cat_keyword") for n in cats] == [True, True, True, True, True]
    assert [n.args[1:] for n in where("method_variadic")] == [(0, 2, 1)]
    # get_attr nodes: x + self.bias, self.bias * x (not x * self.bias: no metadata to commute it; not
    # self.scale * x: another attribute)
    assert [n.args[1].target for n in where("weight")] == ["bias"]
    assert [n.args[0].target for n in where("named_weight")] == ["bias"]
    # a named node referenced after (and before) it is named: the same node, not an equal one
    assert len(where("named_twice")) == 2 and where("named_twice") == where("named_later")
    assert all(n.args[0] is n.args[1] for n in where("named_twice"))
    # options that bind differently
    for name, least in (("either_pair", 3), ("permute_lists", 2), ("nested_choice", 4), ("stale_binding", 5),
                        ("drop_half", 1), ("gelu_kind", 3), ("stored_forms", 2)):
        assert len(where(name)) >= least, (name, where(name))
    assert set(matched) >= {"in_order", "sum_dim", "flatten_rest", "commuting_add", "cat_variadic", "weight",
                            "named_twice", "either_pair"}


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


def test_direct_matchers_are_freed_without_the_cyclic_collector():
    """A direct matcher and the closures it made on first use hold no reference cycle: a rule set's
    matchers are freed with it, leaving the collector nothing to find (see
    tests/engine/test_speed.py::test_a_run_leaves_nothing_to_the_cyclic_collector)."""
    import gc

    gm = fx.symbolic_trace(Traced().eval())
    view = GraphView(dict(gm.named_modules()).get)
    programs = compile_rules(fxrules.load_rules(RULES_DIR)).programs + compile_rules(
        fxrules.parse_rules(HAND_WRITTEN)).programs
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        matchers = [d for d in map(direct_matcher, programs) if d is not None]
        found = sum(d(node, view) is not None for d in matchers for node in gm.graph.nodes)
        del matchers, programs
        gc.collect()
        left = [o for o in gc.garbage if getattr(o, "__module__", None) == "fxrules.engine.matcher"
                or type(o).__module__.startswith("fxrules.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found > 20
    assert not left, left[:5]
