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
