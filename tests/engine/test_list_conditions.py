"""Conditions over lists, `is_literal`, and conditions that raise (issue 19).

`range` and generators (`all(d > 0 for d in $dims)`) are bounded: a literal range over
65,536 items and generators nested three deep are check-time errors; at run time every range
and every generator item of one evaluation counts against one budget, refused as
`ConditionRefused` (a RewriteError naming the rule), never a long loop. A condition whose own
operation raises on a match's values does not abort `apply_rules`: that match is refused with
`condition-raised`, and the run goes on.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import fx, nn

import fxrules
from fxrules.engine.refusals import RefusalCode

PERMUTE_IDENTITY = """
rule permute_identity [exact]:
    call_method permute($x, *$dims)
    where len($dims) == $x.ndim and all($dims[i] == i for i in range(len($dims)))
    -> $x
"""


def rules(text: str) -> fxrules.RuleSet:
    return fxrules.parse_rules(text, source="lists.fxr")


class Permutes(nn.Module):
    def forward(self, x):
        return x.permute(0, 1, 2) + 1, x.permute(0, 2, 1)


def test_range_and_all_over_a_variadic_capture():
    x = torch.randn(2, 3, 4)
    result = fxrules.apply_rules(Permutes(), rules(PERMUTE_IDENTITY), example_inputs=(x,))
    assert result.counts == {"permute_identity": 1}
    methods = [n.target for n in result.module.graph.nodes if n.op == "call_method"]
    assert methods == ["permute"]  # the (0, 2, 1) permutation stays
    for got, want in zip(result.module(x), Permutes()(x)):
        assert torch.equal(got, want)


class Cats(nn.Module):
    def forward(self, a, e):
        return torch.cat([a, e, e], 0), torch.cat([a, a], 0)


def test_a_generator_reads_the_metadata_of_each_node_in_a_list():
    text = """
    rule drop_empty_tail [exact]:
        call_function torch.cat([$a, *$rest], 0)
        where len($rest) >= 1 and all(r.numel == 0 and r.ndim == 1 for r in $rest) and $a.ndim == 1
        -> call_function torch.cat([$a], 0)
    """
    a, e = torch.randn(3), torch.randn(0)
    result = fxrules.apply_rules(Cats(), rules(text), example_inputs=(a, e))
    assert result.counts == {"drop_empty_tail": 1}  # [a, a]: the tail is not empty
    for got, want in zip(result.module(a, e), Cats()(a, e)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("cond, holds", [
    ("any(d == 3 for d in $x.shape)", True),
    ("any(d == 5 for d in $x.shape)", False),
    ("sum(d for d in $x.shape if d > 2) == 7", True),
    ("min(d * 2 for d in $x.shape) == 4", True),
    ("tuple(d for d in $x.shape) == tuple([2, 3, 4])", True),
    ("3 in range(1, 4) and 4 not in range(1, 4)", True),
    ("all(all(e < d for e in range(d)) for d in $x.shape)", True),
    ("all(d > 2 for d in [])", True),
], ids=lambda v: v if isinstance(v, str) else None)
def test_generators_range_and_filters(cond, holds):
    text = f"rule r [changes]: call_function torch.relu($x) where {cond} -> call_function torch.sigmoid($x)"
    result = fxrules.apply_rules(Relu(), rules(text), example_inputs=(torch.randn(2, 3, 4),))
    assert result.counts == ({"r": 1} if holds else {})


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Adds(nn.Module):
    def forward(self, x):
        n = x.size(0)
        return torch.add(x, 0), torch.add(x, torch.zeros_like(x)), torch.add(x, n)


def test_is_literal_tells_a_literal_from_a_node():
    text = """
    rule add_literal [changes]:
        call_function torch.add($x, $k) where is_literal($k) -> call_function torch.sub($x, $k)
    """
    result = fxrules.apply_rules(Adds(), rules(text), example_inputs=(torch.randn(2, 3),))
    # only `x + 0`: `zeros_like(x)` is a node, and so is `x.size(0)` (though its value is an int)
    assert result.counts == {"add_literal": 1}
    subs = [n for n in result.module.graph.nodes if n.target is torch.sub]
    assert [s.args[1] for s in subs] == [0]


def test_is_literal_of_a_list_holding_a_node_is_false():
    class Cat(nn.Module):
        def forward(self, x):
            return torch.cat([x, x], 0)

    literal = rules("rule r [changes]: call_function torch.cat($xs, 0) where is_literal($xs) -> call_function "
                    "torch.stack($xs, 0)")
    assert fxrules.apply_rules(Cat(), literal).counts == {}


# ---------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cond", [
    "all(all(True for j in range(60000)) for i in range(60000))",
    "any(i < 0 for i in range($x.numel * 1000))",
    "all(sum(1 for j in range(300)) > 0 for i in range(300))",
])
def test_a_condition_cannot_loop_for_long(cond):
    text = f"rule r [changes]: call_function torch.relu($x) where {cond} -> call_function torch.sigmoid($x)"
    start = time.perf_counter()
    with pytest.raises(fxrules.RewriteError, match="ConditionRefused") as info:
        fxrules.apply_rules(Relu(), rules(text), example_inputs=(torch.randn(64, 64),))
    assert time.perf_counter() - start < 10
    assert info.value.rule == "r"


def test_the_check_bounds_literal_ranges_and_generator_depth():
    with pytest.raises(fxrules.RuleFileError) as info:
        rules("rule r [changes]: call_function torch.relu($x) where 0 in range(70000) -> call_function torch.sigmoid($x)")
    assert [d.code for d in info.value.diagnostics] == ["too-large"]
    rules("rule r [changes]: call_function torch.relu($x) where 0 in range(65536) -> call_function torch.sigmoid($x)")


# ---------------------------------------------------------------------------
# A condition that raises: refused for that match, and the run goes on
# ---------------------------------------------------------------------------


class ReluTwice(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2, torch.tanh(torch.relu(x + 1))


RAISES = """
rule raises [changes]:
    call_function torch.relu($x) as r where r * 1.0 > 0 -> call_function torch.sigmoid($x)
rule fine [changes]:
    call_function torch.tanh($y) -> call_function torch.sin($y)
"""


def test_a_condition_that_raises_refuses_the_match_and_the_run_goes_on():
    x = torch.randn(3)
    model = ReluTwice()
    result = fxrules.apply_rules(model, rules(RAISES), example_inputs=(x,))
    assert result.counts == {"fine": 1}
    refused = result.report.rejected
    assert {r.code for r in refused} == {RefusalCode.CONDITION_RAISED} and len(refused) == 2
    assert all("TypeError" in r.reason and "`r * 1.0 > 0`" in r.reason for r in refused)
    assert refused[0].nodes[0].startswith("relu")
    got = result.module(x)
    assert torch.equal(got[0], model(x)[0]) and torch.equal(got[1], torch.sin(torch.relu(x + 1)))
    found = [m for m in fxrules.find_matches(model, rules(RAISES), example_inputs=(x,)) if m.rule == "raises"]
    assert {m.code for m in found} == {RefusalCode.CONDITION_RAISED}
    misses = [m for m in fxrules.explain(model, rules(RAISES), example_inputs=(x,)) if m.rule == "raises"]
    assert {m.code for m in misses} == {RefusalCode.CONDITION_RAISED}


@pytest.mark.parametrize("cond, codes", [
    ("$x.shape[5] == 1", [RefusalCode.CONDITION_RAISED]),  # IndexError
    ("$x.ndim // 0 == 1", [RefusalCode.CONDITION_RAISED]),  # ZeroDivisionError
    ("int(\"a\") == 1", [RefusalCode.CONDITION_RAISED]),  # ValueError
    ("$k.dtype == torch.float32", []),  # a literal has no dtype: not applicable, so false (no refusal)
])
def test_each_kind_of_raise_is_a_refusal(cond, codes):
    class M(nn.Module):
        def forward(self, x):
            return torch.add(x, 2)

    text = f"rule r [changes]: call_function torch.add($x, $k) where {cond} -> call_function torch.sub($x, $k)"
    result = fxrules.apply_rules(M(), rules(text), example_inputs=(torch.randn(3),))
    assert result.counts == {} and [r.code for r in result.report.rejected] == codes


def test_a_check_time_type_error_is_bad_condition():
    with pytest.raises(fxrules.RuleFileError) as info:
        rules("rule r [changes]: call_function torch.relu($x) where $x.shape * 1.0 == [] "
              "-> call_function torch.sigmoid($x)")
    [diagnostic] = info.value.diagnostics
    assert diagnostic.code == "bad-condition" and "a shape (tuple) and a float" in diagnostic.message


def test_metadata_missing_is_still_an_error_naming_the_rule():
    """Not a rule's fault for one match: the caller passed no example inputs."""
    graph_module = fx.symbolic_trace(Relu())
    with pytest.raises(fxrules.RewriteError, match="example_inputs"):
        fxrules.apply_rules(graph_module, rules(
            "rule r [changes]: call_function torch.relu($x) where $x.ndim == 1 -> call_function torch.sigmoid($x)"))


# ---------------------------------------------------------------------------
# The library's permute rules (fuse/permute.fxr): variadic captures, generators, computed values
# ---------------------------------------------------------------------------

PERMUTE = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "permute.fxr")


class PermuteChains(nn.Module):
    def forward(self, x):
        a = x.permute(0, 2, 1, 3).permute(0, 2, 1, 3)  # undoes itself: x
        b = x.permute(3, 1, 2, 0).permute(1, 2, 0, 3)  # one permute
        return a + 1, b * 2


def test_permute_chains_of_any_rank_become_one_permute_or_none():
    x = torch.randn(2, 3, 4, 5)
    model = PermuteChains()
    result = fxrules.apply_rules(model, PERMUTE, example_inputs=(x,))
    assert result.counts == {"permute_compose": 2, "permute_identity": 1}
    permutes = [n for n in result.module.graph.nodes if n.target == "permute"]
    assert [tuple(n.args[1]) for n in permutes] == [(1, 2, 3, 0)]
    for got, want in zip(result.module(x), model(x)):
        assert torch.equal(got, want)


class ComputedDims(nn.Module):
    def forward(self, x):
        last = x.dim() - 1
        return x.permute(0, last) + 1


def test_a_dim_the_graph_computes_is_not_a_literal():
    """`x.permute(0, n - 1)`: the metadata has the example's n; is_literal keeps the rule off it."""
    gm = fx.symbolic_trace(ComputedDims())
    x = torch.randn(2, 3)
    assert any(isinstance(a, fx.Node) for n in gm.graph.nodes if n.target == "permute" for a in n.args[1:])
    assert fxrules.apply_rules(gm, PERMUTE, example_inputs=(x,)).counts == {}


def test_a_generator_reading_metadata_makes_the_rule_need_metadata():
    from fxrules.engine.program import compile_rules

    [program] = compile_rules(rules("rule r [changes]: call_function torch.relu($x) where all(d > 1 for d in $x.shape) "
                                    "-> call_function torch.sigmoid($x)")).programs
    assert program.needs_metadata


@pytest.mark.parametrize("condition, applies", [
    ("$x.shape == (7, 5)", True),
    ("$x.shape == [7, 5]", True),  # a list equals a shape with the same items (Python says torch.Size != list)
    ("tuple($x.shape) == [7, 5]", True),
    ("$x.shape in [(1, 2), [7, 5]]", True),
    ("$x.shape[0] in (7,)", True),
    ("$x.shape != (7, 5)", False),
    ("$x.shape == (5, 7)", False),
    ("$x.shape == (7,)", False),
    ("$x.shape == ()", False),
    ("$x.shape not in [(7, 5)]", False),
    ("[(7, 5)] == [[7, 5]]", True),  # nested sequences compare item by item too
])
def test_tuples_lists_and_shapes_compare_by_items(condition, applies):
    text = f"rule r [exact]:\n    call_function torch.relu(call_function torch.relu($x)) where {condition} -> call_function torch.relu($x)"

    class Twice(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    x = torch.randn(7, 5)
    result = fxrules.apply_rules(Twice(), rules(text), example_inputs=(x,))
    assert result.counts == ({"r": 1} if applies else {}), condition
    assert torch.equal(result.module(x), Twice()(x))


def test_an_empty_tuple_is_a_scalar_shape():
    text = "rule r [exact]:\n    call_function torch.relu(call_function torch.relu($x)) where $x.shape == () -> call_function torch.relu($x)"

    class Twice(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    assert fxrules.apply_rules(Twice(), rules(text), example_inputs=(torch.tensor(1.5),)).counts == {"r": 1}
    assert fxrules.apply_rules(Twice(), rules(text), example_inputs=(torch.ones(1),)).counts == {}
