"""Random draws a rewrite keeps (issue 19): the replacement keeps the very node that draws.

Inductor's post-grad ``randperm`` patterns (torch/_inductor/fx_passes/misc_patterns.py) match the
permutation to know an index is unique and in bounds, and keep it: ``x[randperm(n)[:k]]`` becomes
``_unsafe_index(x, [randperm(n)[:k]])`` with the same ``randperm`` node. Under ``[exact]``/``[approx]``
the planner used to refuse every match with a drawing node (``changes-random-draws``); it now accepts a
rewrite that keeps each drawing node it matched (read by the replacement by name, or computed again
by it and so kept as it is) and adds none, and still refuses one that removes, adds or repeats a draw.
Kept nodes stay where they are, so every draw happens in the same order: outputs are bit-identical
under the same seed, and so is the generator's state after the forward pass.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxrules
from fxrules.engine import driver, planner
from fxrules.engine.refusals import RefusalCode

aten = torch.ops.aten

RANDPERM = fxrules.load_rules(fxrules.LIBRARY / "aten" / "randperm.fxr")  # inductor's two patterns


def rules(text: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(text, source="kept.fxr")


def codes(result) -> list:
    return [r.code for r in result.report.rejected]


class RandpermIndex(nn.Module):
    def forward(self, x):
        idx = torch.randperm(x.shape[0], device=x.device)[:2]
        return x[idx] * 2


class RandpermIndexAdd(nn.Module):
    def forward(self, x, y):
        idx = torch.randperm(x.shape[0], device=x.device)[: y.shape[0]]
        return torch.index_add(x, dim=0, source=y, index=idx)


def _seeded(module, inputs, seed=0):
    """The outputs under ``seed``, and the generator's next draw after them (its state)."""
    torch.manual_seed(seed)
    out = module(*inputs)
    return out, torch.rand(4)


def _random_targets(module) -> list:
    return [n.name for n in module.graph.nodes if n.op == "call_function" and n.target is aten.randperm.default]


@pytest.fixture
def recorded(monkeypatch):
    """What the planner predicts each planned match keeps (planner.kept_nodes), by node name."""
    seen = []
    plan = driver.plan

    def recording(match, effects):
        kept = planner.kept_nodes(match)
        seen.append(({n.name for n in match.bindings.nodes}, {n.name for n in kept.nodes}))
        return plan(match, effects)

    monkeypatch.setattr(driver, "plan", recording)
    return seen


@pytest.mark.parametrize("model, inputs, name", [
    (RandpermIndex(), (torch.randn(4, 8),), "aten_randperm_index"),
    (RandpermIndexAdd(), (torch.randn(6, 8), torch.randn(3, 8)), "aten_randperm_index_add"),
], ids=["index", "index_add"])
def test_inductors_randperm_patterns_keep_their_draw(model, inputs, name, recorded):
    program = torch.export.export(model, inputs)
    original = program.module()
    result = fxrules.apply_rules(program, RANDPERM)
    assert result.counts == {name: 1} and codes(result) == []
    assert _random_targets(result.module) == _random_targets(original) == ["randperm"]  # the same node
    targets = {n.target for n in result.module.graph.nodes}
    assert aten.index.Tensor not in targets and aten.index_add.default not in targets
    for seed in (0, 1, 2):
        (want, after_want), (got, after_got) = _seeded(original, inputs, seed), _seeded(result.module, inputs, seed)
        assert torch.equal(got, want) and torch.equal(after_got, after_want)
    # the planner's prediction is what the rewrite kept: the permutation and its slice, nothing else
    matched, kept = recorded[0]
    left = {n.name for n in result.module.graph.nodes}
    assert kept == {"randperm", "slice_1"} and kept <= left and not (matched - kept) & left


class RandpermIndexAddReturned(nn.Module):
    """Inductor's pattern returns the index too; here the slice is read outside the match."""

    def forward(self, x, y):
        idx = torch.randperm(x.shape[0], device=x.device)[: y.shape[0]]
        return torch.index_add(x, dim=0, source=y, index=idx), idx


def test_a_randperm_index_read_elsewhere_is_left_alone():
    inputs = (torch.randn(6, 8), torch.randn(3, 8))
    program = torch.export.export(RandpermIndexAddReturned(), inputs)
    result = fxrules.apply_rules(program, RANDPERM)
    assert result.counts == {} and codes(result) == [RefusalCode.INTERIOR_USED_OUTSIDE]
    (want, after_want), (got, after_got) = _seeded(program.module(), inputs), _seeded(result.module, inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(after_got, after_want)


# ---------------------------------------------------------------------------
# traced: a train-mode dropout kept by the replacement, named or computed again
# ---------------------------------------------------------------------------

class DropoutTimesOne(nn.Module):
    def forward(self, x):
        return torch.relu(F.dropout(x, 0.5, True) * 1) + torch.rand_like(x)


KEPT_BY_NAME = """
use torch.nn.functional as F
rule times_one_named [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True) as d, 1)
    -> d
"""
KEPT_BY_EQUAL_CALL = """
use torch.nn.functional as F
rule times_one_again [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True), 1)
    -> call_function F.dropout($x, p=0.5, training=True, inplace=False)
"""


@pytest.mark.parametrize("text", [KEPT_BY_NAME, KEPT_BY_EQUAL_CALL], ids=["by-name", "by-equal-call"])
def test_a_kept_dropout_draws_as_before(text, recorded):
    model = DropoutTimesOne()
    x = torch.randn(3, 8)
    result = fxrules.apply_rules(model, rules(text))
    assert sum(result.counts.values()) == 1 and codes(result) == []
    dropouts = [n for n in result.module.graph.nodes if n.target is F.dropout]
    assert [n.name for n in dropouts] == ["dropout"]  # the matched node, where it was
    assert operator.mul not in {n.target for n in result.module.graph.nodes}
    for seed in (0, 1):
        (want, after_want), (got, after_got) = _seeded(model, (x,), seed), _seeded(result.module, (x,), seed)
        assert torch.equal(got, want) and torch.equal(after_got, after_want)  # rand_like after it: same too
    matched, kept = recorded[0]
    assert kept == {"dropout"} and matched == {"dropout", "mul"}


# ---------------------------------------------------------------------------
# the draws change: refused, outputs kept
# ---------------------------------------------------------------------------

REMOVES = """
use torch.nn.functional as F
rule removes [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True), 1)
    -> $x
"""
ADDS = """
use torch.nn.functional as F
rule keeps_and_adds [exact]:
    call_function operator.add(
        call_function torch.relu(call_function operator.mul(call_function F.dropout($x, 0.5, True) as d, 1)),
        call_function torch.rand_like($y))
    -> call_function operator.add(
        call_function operator.add(call_function torch.relu(d), call_function torch.rand_like($y)),
        call_function torch.rand_like(d))
"""
REPEATS = """
use torch.nn.functional as F
rule repeats [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True), 2)
    -> call_function operator.add(call_function F.dropout($x, p=0.5, training=True, inplace=False),
                                  call_function F.dropout($x, p=0.5, training=True, inplace=False))
"""
REDRAWS = """
use torch.nn.functional as F
rule redraws_otherwise [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True), 1)
    -> call_function F.dropout($x, 0.25, True)
"""
RESPELLED = """
use torch.nn.functional as F
rule respelled [exact]:
    call_function operator.mul(call_function F.dropout($x, 0.5, True), 1)
    -> call_function F.dropout($x, 0.5, True)
"""
SWAPPED = """
use torch.nn.functional as F
rule swapped [exact]:
    call_function operator.add(call_function torch.relu(call_function operator.mul(
        call_function F.dropout($x, 0.5, True) as d, 1)), call_function torch.rand_like($x) as r)
    -> call_function operator.add(r, call_function torch.relu(d))
"""


class DropoutTimesTwo(nn.Module):
    def forward(self, x):
        return torch.relu(F.dropout(x, 0.5, True) * 2)


@pytest.mark.parametrize("model, text", [
    (DropoutTimesOne(), REMOVES), (DropoutTimesOne(), ADDS), (DropoutTimesTwo(), REPEATS),
    (DropoutTimesOne(), REDRAWS), (DropoutTimesOne(), RESPELLED),
], ids=["removes", "adds", "repeats", "redraws", "respelled"])
def test_a_rewrite_that_changes_the_draws_is_refused(model, text):
    """``respelled``: a call is kept only when written with the matched node's very arguments (the
    graph records ``F.dropout(x, p=0.5, training=True, inplace=False)``); ``F.dropout($x, 0.5, True)``
    would be a new node, drawing anew after the matched one is removed. Name the node (``as d``) to keep
    it whatever its spelling."""
    x = torch.randn(3, 8)
    result = fxrules.apply_rules(model, rules(text))
    assert result.counts == {} and codes(result) == [RefusalCode.CHANGES_RANDOM_DRAWS]
    (want, after_want), (got, after_got) = _seeded(model, (x,)), _seeded(result.module, (x,))
    assert torch.equal(got, want) and torch.equal(after_got, after_want)


def test_operands_swapped_keep_both_draws_in_their_order():
    """The replacement reads the two drawing nodes in the other order; both are kept where they are,
    so the dropout still draws before the noise: bit-identical (a float sum commutes exactly)."""
    model = DropoutTimesOne()
    x = torch.randn(3, 8)
    result = fxrules.apply_rules(model, rules(SWAPPED))
    assert result.counts == {"swapped": 1}
    order = [n.name for n in result.module.graph.nodes if n.target in (F.dropout, torch.rand_like)]
    assert order == ["dropout", "rand_like"]
    for seed in (0, 1):
        (want, after_want), (got, after_got) = _seeded(model, (x,), seed), _seeded(result.module, (x,), seed)
        assert torch.equal(got, want) and torch.equal(after_got, after_want)


def test_under_changes_draws_may_change():
    result = fxrules.apply_rules(DropoutTimesOne(), rules(REMOVES.replace("[exact]", "[changes]")))
    assert result.counts == {"removes": 1}


def test_a_traced_randperm_is_matched_as_its_aten_operator_is():
    """torch calls its Python random functions impure whatever it is asked; fxrules takes drawing as
    drawing (changes-random-draws), not as another side effect: a traced torch.randperm kept by the
    replacement is rewritten, one removed is refused for its draw."""

    class Perm(nn.Module):
        def forward(self, x):
            return x[torch.randperm(x.shape[0])] * 1

    kept = fxrules.apply_rules(Perm(), rules("""
rule perm_times_one [exact]:
    call_function operator.mul(call_function operator.getitem($x, call_function torch.randperm($n) as p), 1)
    -> call_function operator.getitem($x, p)
"""))
    assert kept.counts == {"perm_times_one": 1}
    x = torch.randn(4, 3)
    (want, _), (got, _) = _seeded(Perm(), (x,)), _seeded(kept.module, (x,))
    assert torch.equal(got, want)
    removed = fxrules.apply_rules(Perm(), rules("""
rule perm_dropped [exact]:
    call_function operator.mul(call_function operator.getitem($x, call_function torch.randperm($n)), 1)
    -> $x
"""))
    assert codes(removed) == [RefusalCode.CHANGES_RANDOM_DRAWS]


def test_a_draw_read_by_a_kept_node_is_not_left_unused():
    """The dropout is captured (not matched) and read by the matched neg the replacement keeps by name:
    it keeps its user, so it is not "left unused" (this was refused before kept nodes were predicted)."""

    class NegOfDropout(nn.Module):
        def forward(self, x):
            return torch.neg(F.dropout(x, 0.5, True)) * 1

    model = NegOfDropout()
    result = fxrules.apply_rules(model, rules("""
rule named_neg [exact]:
    call_function operator.mul(call_function torch.neg($z) as n, 1)
    -> n
"""))
    assert result.counts == {"named_neg": 1} and codes(result) == []
    x = torch.randn(3, 8)
    (want, after_want), (got, after_got) = _seeded(model, (x,)), _seeded(result.module, (x,))
    assert torch.equal(got, want) and torch.equal(after_got, after_want)
