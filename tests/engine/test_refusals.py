"""Refusals, near-miss reasons and verification grades are data with stable codes.

Every refusal code is produced by a small model and rule, and carries the nodes it is about;
the message (the English the report and the CLI show) is checked once per code where the
text is the contract. Explain's near misses carry a code per failure kind. Every code, grade
and host-graph gap is documented. The planner's checks run in their documented order.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import fxrules
from fxrules.engine import planner
from fxrules.engine.matcher import GraphView, Match, match_program
from fxrules.engine.program import compile_rules
from fxrules.engine.refusals import MissCode, Refusal, RefusalCode
from fxrules.verifier.driver import GRADES, Grade, HostsGap, HostsNote

DOCS = Path(__file__).resolve().parents[2] / "docs"

fx.wrap("print")  # traced as a call_function node, as test_safety does


# ---------------------------------------------------------------------------
# models that provoke each refusal
# ---------------------------------------------------------------------------


class SharedInterior(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        return torch.relu(a) + a  # `a` is used outside relu(relu(x))


class Prints(nn.Module):
    def forward(self, x):
        print(x)
        return x


class TimesTwo(nn.Module):
    def forward(self, x):
        return x * 2


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class CopyMutated(nn.Module):
    def forward(self, x):
        y = x * 1  # replacing y by x would make the add_ below modify x
        y.add_(1)
        return x, y


class MutatedBetween(nn.Module):
    def forward(self, x):
        a = x * 1
        b = torch.neg(a)
        a.add_(100)  # between neg and relu: a replacement re-reading `a` at relu would see it
        return torch.relu(b)


class InputMutatedAfter(nn.Module):
    def forward(self, x):
        y = x * 1  # a copy of x: replacing it by x would carry the add_ below into y
        x.add_(1)
        return y + x


class LateInput(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        b = a * 2  # a user of the first root ...
        z = torch.neg(b)  # ... before the value the first root's replacement reads
        return torch.add(x, z), b


class TrainingConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        # training mode: fold_conv_bn declines (without running statistics: calling it updates none, so removing
        # its call drops no effect)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)

    def forward(self, x):
        return self.bn(self.conv(x))


class HookedDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.drop.register_forward_hook(lambda module, args, output: None)

    def forward(self, x):
        return self.drop(x)


class DropoutThenRandom(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)  # training mode: draws random numbers

    def forward(self, x):
        return self.drop(x) + torch.rand_like(x)


class ReluOfMul(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2), x


class ReturnsClone(nn.Module):
    def forward(self, x):
        return x.clone()


def _written_buffer_graph() -> fx.GraphModule:
    """``b.add_(1)`` then ``x + b`` (torch.fx's tracer would run the add_ while tracing, so written by hand)."""
    root = nn.Module()
    root.register_buffer("b", torch.zeros(3))
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_method("add_", (graph.get_attr("b"), 1))
    graph.output(graph.call_function(torch.add, (x, graph.get_attr("b"))))
    return fx.GraphModule(root, graph)


def _written_bn_graph() -> fx.GraphModule:
    """conv then an eval-mode bn whose running mean the graph writes in place."""
    root = nn.Module()
    root.conv = nn.Conv2d(3, 4, 3)
    root.bn = nn.BatchNorm2d(4).eval()
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_method("add_", (graph.get_attr("bn.running_mean"), 1))
    graph.output(graph.call_module("bn", (graph.call_module("conv", (x,)),)))
    return fx.GraphModule(root, graph)


RELU_RELU = "rule r: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)"
MUL_ONE = "rule r: call_function operator.mul($x, 1) -> $x"

# code -> (rule text, model, the refusal's nodes, its message)
REFUSALS = {
    RefusalCode.INTERIOR_USED_OUTSIDE: (
        RELU_RELU, SharedInterior, ("relu", "add"),
        "interior node %relu is also used by %add, outside the match; rewriting would duplicate or break it"),
    RefusalCode.CONDITION_RAISED: (
        "rule r: call_function operator.mul($x, $k) where $k[0] == 2 -> call_function torch.mul($x, $k)", ReluOfMul,
        ("mul",), "the condition `$k[0] == 2` raised TypeError: 'int' object is not subscriptable"),
    RefusalCode.DROPS_SIDE_EFFECT: (
        "rule r: call_function builtins.print($x) -> $x", Prints, ("print_1",),
        "removing the match would drop a side effect: %print_1 calls print, which has a side effect"),
    RefusalCode.USES_REPLACED_NODE: (
        "rule r: call_function torch.relu($x) as r -> call_function torch.neg(r)", Relu, ("relu",),
        "the replacement uses %relu, the node it replaces"),
    RefusalCode.REPLACES_WITH_LITERAL: (
        "rule r: call_function operator.mul($x, $y) -> $y", TimesTwo, ("mul",),
        "the replacement would replace %mul by the literal 2"),
    RefusalCode.REPLACED_NODE_MUTATED: (
        MUL_ONE, CopyMutated, ("mul", "add_", "x"),
        "%mul is modified in place by %add_; replacing it by %x would modify %x too"),
    RefusalCode.READS_ACROSS_MUTATION: (
        "rule r: call_function torch.relu(call_function torch.neg($a))"
        " -> call_function F.relu(call_function torch.neg($a))", MutatedBetween, ("mul", "add_"),
        "%mul is modified in place by %add_ between the matched nodes and the place the replacement reads it"),
    RefusalCode.ALIAS_MUTATED_LATER: (
        MUL_ONE, InputMutatedAfter, ("x", "add_", "mul"),
        "%x is modified in place by %add_ after the matched nodes; standing in for %mul, it would carry that "
        "change to whatever reads %mul or an alias of it"),
    RefusalCode.WOULD_CYCLE: (
        "rule r: call_function torch.relu($x), call_function torch.add($x, $z)"
        " -> call_function torch.relu($z), call_function torch.add($x, $z)", LateInput, ("neg", "mul"),
        "the replacement would have to come after a user of the nodes it replaces (a cycle)"),
    RefusalCode.BUILDER_DECLINED: (
        "rule r [approx]: call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn"
        " -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)", TrainingConvBn, ("bn",),
        None),  # the builder's own words: checked below
    RefusalCode.MODULE_HAS_HOOKS: (
        "rule r: call_module Dropout($x) -> $x", HookedDropout, ("drop",),
        "module `drop` (%drop) has forward_hooks; removing or replacing its call would drop them"),
    RefusalCode.CHANGES_RANDOM_DRAWS: (
        "rule r [approx]: call_module Dropout($x) -> $x", DropoutThenRandom, ("drop",),
        "%drop draws random numbers; under [approx] a rewrite may not remove it (every later random draw would "
        "change)"),
    RefusalCode.REPLACEMENT_WRITES_INPUT: (
        "rule r: call_function torch.relu(call_function operator.mul($x, 2)) -> call_method relu_($x)", ReluOfMul,
        ("relu",), "the replacement of %relu calls relu_, which writes in place a value that exists outside the "
        "replacement"),
    RefusalCode.OUTPUT_ALIAS_INTRODUCED: (
        "rule r: call_method clone($x) -> $x", ReturnsClone, ("clone", "x"),
        "%clone is returned by the graph; its replacement would share storage with the input %x"),
    RefusalCode.READS_WRITTEN_VALUE: (
        "rule r [approx]: call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn"
        " -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)", _written_bn_graph, ("bn",),
        "builder fxrules.builders.fold_conv_bn would read a tensor of %bn that the graph modifies in place; its "
        "value is not fixed"),
}


def test_the_cases_cover_every_refusal_code():
    from tests.engine.test_guards import GUARDS  # the contract guards' cases (they need example inputs)

    assert set(REFUSALS) | set(GUARDS) == set(RefusalCode) and not set(REFUSALS) & set(GUARDS)


@pytest.mark.parametrize("code", list(REFUSALS), ids=str)
def test_each_refusal_code_is_reported_with_its_nodes_and_message(code):
    text, model_class, nodes, message = REFUSALS[code]
    model = model_class().train() if model_class in (TrainingConvBn, DropoutThenRandom) else model_class()
    result = fxrules.apply_rules(model, fxrules.parse_rules(text, source="refuse.fxr"))
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.code is code and rejected.nodes == nodes
    if message is not None:
        assert rejected.reason == message
    else:
        assert re.fullmatch(r"builder fxrules\.builders\.fold_conv_bn declined: .*training.*", rejected.reason)
    # the same refusal, before anything is rewritten, from find_matches and explain
    found = [m for m in fxrules.find_matches(model, fxrules.parse_rules(text, source="refuse.fxr"))
             if m.rejected is not None]
    # builders run here too (their modules are thrown away): a declining builder shows as well
    assert [(m.code, m.rejected) for m in found] == [(code, rejected.reason)]
    refused = [m for m in fxrules.explain(model, fxrules.parse_rules(text, source="refuse.fxr"))
               if m.code in set(RefusalCode)]
    [miss] = refused
    assert miss.code is code and miss.reason == f"the pattern matched, but the rewrite is refused: {rejected.reason}"


def test_report_json_carries_the_code_and_the_nodes():
    result = fxrules.apply_rules(SharedInterior(), fxrules.parse_rules(RELU_RELU, source="refuse.fxr"))
    payload = json.loads(json.dumps(result.report.to_json()))
    [entry] = payload["rejected"]
    assert entry == {"rule": "r", "source": "refuse.fxr:1", "matched": ["relu", "relu_1"],
                     "reason": result.report.rejected[0].reason, "code": "interior-used-outside",
                     "nodes": ["relu", "add"]}


def test_the_first_refusal_in_the_documented_order_wins():
    """An interior node that is used outside the match and writes in place: interior-used-outside,
    the first check, is reported rather than drops-side-effect."""

    class M(nn.Module):
        def forward(self, z):
            w = z.add_(1)
            return w.relu(), w

    rules = fxrules.parse_rules("rule r: call_method relu(call_method add_($x, 1)) -> call_method relu($x)")
    [rejected] = fxrules.apply_rules(M(), rules).report.rejected
    assert rejected.code is RefusalCode.INTERIOR_USED_OUTSIDE


def _match(model: nn.Module, text: str) -> tuple[Match, planner.Effects]:
    gm = fx.symbolic_trace(model)
    [program] = compile_rules(fxrules.parse_rules(text)).programs
    module_of = gm.get_submodule
    for node in gm.graph.nodes:
        found = match_program(program, node, GraphView(module_of))
        if isinstance(found, Match):
            return found, planner.Effects(module_of)
    raise AssertionError("no match")


def test_each_check_passes_an_acceptable_match_and_plan_places_it():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    match, effects = _match(M(), RELU_RELU)
    inputs = planner._replacement_inputs(match)
    assert planner.interior_used_outside(match) is None
    assert planner.drops_side_effect(match, effects) is None
    assert planner.uses_replaced_node(match, inputs) is None
    assert planner.replaced_by_value(match, effects) is None
    assert planner.reads_across_mutation(match, effects, inputs) is None
    decision = planner.plan(match, effects)
    assert isinstance(decision, planner.Plan) and decision.anchor.name == "relu_1"  # before the root


def test_a_check_returns_its_refusal_directly():
    match, effects = _match(SharedInterior(), RELU_RELU)
    refusal = planner.interior_used_outside(match)
    assert refusal == Refusal(RefusalCode.INTERIOR_USED_OUTSIDE, refusal.message, ("relu", "add"))
    assert planner.plan(match, effects) == refusal
    assert str(refusal) == refusal.message


def test_a_refusal_is_a_frozen_slotted_value():
    refusal = Refusal(RefusalCode.WOULD_CYCLE, "text", ("a",))
    assert not hasattr(refusal, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        refusal.code = RefusalCode.DROPS_SIDE_EFFECT  # type: ignore[misc]


# ---------------------------------------------------------------------------
# explain's near misses
# ---------------------------------------------------------------------------


class Many(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, y):
        a = torch.relu(torch.sigmoid(x))
        b = x + y
        c = self.drop(x)
        d = x.to(torch.float32)
        e = torch.permute(x, [1, 0])
        f = x.view(2, -1)
        g = torch.sum(x, 1, keepdim=True)
        h = torch.neg(torch.sigmoid(x))
        i = torch.neg(x) + torch.neg(x)
        return a, b, c, d, e, f, g, h, i


# code -> (rule text, the reason)
MISSES = {
    MissCode.TARGET_MISMATCH: ("rule m: call_function torch.relu(call_function torch.neg($x)) -> $x",
                               "expected torch.neg, found sigmoid"),
    MissCode.CAPTURE_CONFLICT: ("rule m: call_function operator.add($x, $x) -> $x",
                                "`$x` is already bound to %x, but here it is %y"),
    MissCode.LITERAL_MISMATCH: ("rule m: call_module Dropout{p=0.5}($x) -> $x", "expected the literal 0.5, found 0.1"),
    MissCode.CONSTANT_MISMATCH: ("rule m: call_method to($x, torch.float16) -> $x",
                                 "expected torch.float16, found torch.float32"),
    MissCode.SEQUENCE_MISMATCH: ("rule m: call_function torch.permute($x, [0, 1, 2]) -> $x",
                                 "expected a sequence of 3, found [1, 0]"),
    MissCode.ARGUMENT_COUNT: ("rule m: call_method view($x, 2) -> $x", "expected 2 positional arguments, found 3"),
    MissCode.ARGUMENT_MISSING: ("rule m: call_method view($x, 2, -1, k=1) -> $x", "keyword argument `k` is missing"),
    MissCode.UNEXPECTED_ARGUMENT: ("rule m: call_function torch.sum($x, 1) -> $x", None),
    MissCode.OTHER_ROOT_MISSING: (
        "rule m: call_function torch.neg(call_function torch.sigmoid($x)), call_function torch.cos($x) -> $x, $x",
        "no node matches the rule's other root over the same captures"),
    MissCode.NAMED_NODE_MISMATCH: (
        "rule m: call_function operator.add(call_function torch.neg($x) as n, n) -> n", None),
}


@pytest.mark.parametrize("code", list(MISSES), ids=str)
def test_each_near_miss_kind_has_its_code(code):
    text, reason = MISSES[code]
    misses = fxrules.explain(Many(), fxrules.parse_rules(text, source="miss.fxr"))
    reasons = [m.reason for m in misses if m.code is code]
    assert reasons, [(m.code, m.reason) for m in misses]
    if reason is not None:
        assert reason in reasons


def test_an_op_mismatch_and_a_false_condition_have_their_codes():
    text = "rule c: call_function torch.neg(call_function torch.sigmoid($x)) where $x.dtype == torch.float16 -> $x"
    misses = fxrules.explain(Many(), fxrules.parse_rules(text, source="miss.fxr"),
                             example_inputs=(torch.randn(2, 3), torch.randn(2, 3)))
    assert {m.node: m.code for m in misses}["neg"] is MissCode.CONDITION_FALSE
    assert MissCode.OP_MISMATCH in {m.code for m in fxrules.explain(
        Relu(), fxrules.parse_rules("rule m: call_function torch.relu(call_function torch.neg($x)) -> $x"))}


def test_refusal_and_miss_codes_are_distinct_kebab_case_strings():
    values = [c.value for c in RefusalCode] + [c.value for c in MissCode]
    assert len(values) == len(set(values))
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", v) for v in values)
    assert json.dumps([RefusalCode.WOULD_CYCLE, MissCode.CONDITION_FALSE]) == '["would-cycle", "condition-false"]'


# ---------------------------------------------------------------------------
# grades
# ---------------------------------------------------------------------------


def test_grades_are_an_enum_of_the_same_strings():
    assert GRADES == tuple(Grade)
    assert [str(g) for g in GRADES] == ["validated", "wrong", "noisy", "missing", "unverified", "weak", "error"]
    assert Grade.WRONG == "wrong" and json.dumps(Grade.WRONG) == '"wrong"'
    assert max(GRADES, key=lambda g: g.severity) is Grade.WRONG
    assert min(GRADES, key=lambda g: g.severity) is Grade.VALIDATED


@pytest.mark.parametrize("note, without, with_examples", [
    (HostsNote(HostsGap.NO_SAMPLER, missing=("torch.special.i0e", "torch.erf")),
     "not verified on host graphs: no sampler for torch.special.i0e, torch.erf; add an example",
     "not verified on host graphs: no sampler for torch.special.i0e, torch.erf (its examples verify it)"),
    (HostsNote(HostsGap.NONE_REWRITTEN, declined=7),
     "not verified on host graphs: none of the drawn hosts was rewritten by the rule (7 declined); add an example",
     "not verified on host graphs: none of the drawn hosts was rewritten by the rule (7 declined) (its examples "
     "verify it)"),
    (HostsNote(HostsGap.NO_HOST_REWRITTEN),
     "not verified on host graphs: no host was rewritten by the rule; add an example",
     "not verified on host graphs: no host was rewritten by the rule (its examples verify it)"),
    (HostsNote(HostsGap.DID_NOT_REPRODUCE),
     "the given counterexample did not reproduce (the rule, its samplers or hypothesis changed)",
     "the given counterexample did not reproduce (the rule, its samplers or hypothesis changed)"),
    (HostsNote(HostsGap.FLAKY, detail="Hypothesis saw it fail once"),
     "host check flaky: Hypothesis saw it fail once", "host check flaky: Hypothesis saw it fail once"),
], ids=lambda v: str(v.gap) if isinstance(v, HostsNote) else "")
def test_host_notes_are_written_from_their_facts(note, without, with_examples):
    assert note.text(examples_rewrote=False) == without
    assert note.text(examples_rewrote=True) == with_examples


def test_every_host_gap_has_a_note():
    assert {n.gap for n in (HostsNote(g) for g in HostsGap)} == set(HostsGap)
    assert all(HostsNote(g).text(examples_rewrote=False) for g in HostsGap)


# ---------------------------------------------------------------------------
# documentation
# ---------------------------------------------------------------------------


def _table_codes(path: Path) -> set[str]:
    """Every `code` in the first column of a markdown table row."""
    return set(re.findall(r"^\| `([a-z-]+)` \|", path.read_text(), re.M))


def test_every_refusal_and_miss_code_is_documented():
    documented = _table_codes(DOCS / "semantics.md")
    assert {c.value for c in RefusalCode} <= documented
    assert {c.value for c in MissCode} <= documented
    assert documented <= {c.value for c in RefusalCode} | {c.value for c in MissCode}


def test_every_grade_and_host_gap_is_documented():
    documented = _table_codes(DOCS / "verify.md")
    assert {g.value for g in Grade} <= documented
    assert {g.value for g in HostsGap} <= documented


def test_the_json_fields_are_documented():
    cli = (DOCS / "cli.md").read_text()
    assert '"code": "interior-used-outside"' in cli and '"nodes": ["relu", "add"]' in cli
    assert re.search(r'"code": "condition-false"', cli)
    assert '"hosts_gap"' in cli or '"hosts_gap"' in (DOCS / "verify.md").read_text()


# The planner asks whether a replacement call writes in place or draws random numbers only of the calls
# whose template cannot rule it out (Effects.writing_calls, Effects.drawing_calls, once per program). Each
# way a template can write is still refused, and a template that neither writes nor draws is not asked.
# (A replacement that draws where its pattern does not is an error of the rule file under [exact]/[approx].)
WRITING_REPLACEMENTS = [
    "call_method relu_($x)",
    "call_function torch.relu($x, inplace=True)",
    "call_function F.relu($x, inplace=True)",
    "call_function torch.neg($x, out=$x)",
    "call_function operator.iadd($x, 1)",
    "call_function torch.ops.aten.relu_.default($x)",
    "call_module ReLU{inplace=True}($x)",
]


@pytest.mark.parametrize("replacement", WRITING_REPLACEMENTS)
def test_every_way_a_replacement_writes_an_input_is_refused(replacement):
    rules = fxrules.parse_rules(f"rule r: call_function torch.relu(call_function operator.mul($x, 2)) -> {replacement}")
    program = compile_rules(rules).programs[0]
    effects = planner.Effects(lambda target: None)
    assert effects.writing_calls(program), "the template alone must not rule the write out"
    result = fxrules.apply_rules(ReluOfMul(), rules)
    assert [r.code for r in result.report.rejected] == [RefusalCode.REPLACEMENT_WRITES_INPUT]


@pytest.mark.parametrize("text", [
    "call_function torch.relu($x)", "call_method relu($x)", "call_function torch.neg($x)",
    "call_module ReLU{}($x)", "call_module ReLU{inplace=False}($x)", "call_function F.dropout($x, 0.5, False)",
    "call_module Dropout{p=0.0}($x)", "call_function torch.ops.aten.relu.default($x)"])
def test_a_template_that_writes_and_draws_nothing_is_not_asked_per_match(text):
    rules = fxrules.parse_rules(f"rule r [changes]: call_function torch.relu(call_function operator.mul($x, 2)) -> {text}")
    program = compile_rules(rules).programs[0]
    effects = planner.Effects(lambda target: None)
    assert len(effects.replacement_calls(program)) == 1
    assert effects.writing_calls(program) == ()
    # a dropout template names a class or function that may draw: asked per match (and answered there)
    assert (effects.drawing_calls(program) == ()) == ("ropout" not in text)
    result = fxrules.apply_rules(ReluOfMul(), rules)
    if "ropout" in text:  # an eval-mode dropout returns its input, which the graph also returns
        assert [r.code for r in result.report.rejected] == [RefusalCode.OUTPUT_ALIAS_INTRODUCED]
    else:
        assert result.counts == {"r": 1}


def test_a_reused_module_that_draws_is_refused_in_the_replacement():
    """A replacement that calls a matched module again (RReuse) is asked per match: a train-mode dropout
    it would call twice is refused under [approx] (its pattern draws, so the rule file is allowed)."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x) * 2

    rules = fxrules.parse_rules("rule r [approx]: call_function operator.mul(call_module Dropout($x) as d, 2) -> "
                                "call_function operator.add(call_module d($x), call_module d($x))")
    program = compile_rules(rules).programs[0]
    assert planner.Effects(lambda target: None).drawing_calls(program)
    result = fxrules.apply_rules(Twice().train(), rules)
    assert [r.code for r in result.report.rejected] == [RefusalCode.CHANGES_RANDOM_DRAWS]
