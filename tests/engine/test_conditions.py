"""`where` conditions on their own: fxrules.engine.conditions.Evaluator over hand-made bindings.

Each test parses one rule for its conditions, binds captures and `as` names by hand (graph
nodes carrying ``meta['val']`` or ``meta['tensor_meta']``, nodes without metadata, get_attr
nodes, literals) and asks the Evaluator whether the conditions hold: no matcher, no engine
run. The semantics are those of the module docstring and docs/language.md ("Conditions").
"""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

import fxrules
from fxrules.engine.conditions import Evaluator, MissingMetadata, TensorInfo, tensor_info

ADD = "call_function operator.add($x, $y)"


class Bound:
    """A rule's conditions, and an Evaluator over the given bindings."""

    def __init__(self, where: str, pattern: str = ADD, *, captures: dict, names: dict | None = None,
                 modules: dict | None = None, attrs: dict | None = None, allow_imports: tuple = ()):
        rule_set = fxrules.parse_rules(f"rule c: {pattern} where {where} -> $x", allow_imports=allow_imports)
        (rule,) = rule_set.rules
        self.conditions = rule.ast.conditions
        self.evaluator = Evaluator(captures, names or {}, (modules or {}).get, (attrs or {}).get, rule.aliases,
                                   rule_set.resolver)

    def holds(self) -> bool:
        return all(self.evaluator.holds(c) for c in self.conditions)


def holds(where: str, pattern: str = ADD, **bindings) -> bool:
    return Bound(where, pattern, **bindings).holds()


def node_with(val=None, *, name: str = "v", op: str = "call_function", target=torch.relu, **meta) -> fx.Node:
    """A node of a throwaway graph with ``meta['val'] = val`` (when given) and further meta."""
    g = fx.Graph()
    if op == "placeholder":
        node = g.placeholder(name)
    elif op == "get_attr":
        node = g.get_attr(target)
    elif op == "call_module":
        node = g.call_module(target, (g.placeholder("inp"),))
    else:
        node = g.call_function(target, (g.placeholder("inp"),))
    if val is not None:
        node.meta["val"] = val
    node.meta.update(meta)
    return node


def tensor_node(*shape: int, dtype=torch.float32, **kwargs) -> fx.Node:
    return node_with(torch.empty(shape, dtype=dtype), **kwargs)


# ---------------------------------------------------------------------------
# tensor metadata
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where, expected", [
    ("$x.shape[0] == 2 and $x.shape[1] == 3", True),
    ("tuple($x.shape) == tuple([2, 3])", True),
    ("$x.shape[-1] == 2", False),
    ("$x.ndim == 2", True),
    ("$x.numel == 6", True),
    ("$x.dtype == torch.float32", True),
    ("$x.dtype == torch.float16", False),
    ("$x.dtype != torch.bool", True),
    ("$x.requires_grad", False),
    ("$x.is_contiguous()", True),
    ("$x.dtype == $y.dtype", False),
    ("$x.ndim > $y.ndim", True),
])
def test_metadata_reads_of_captured_nodes(where, expected):
    captures = {"x": tensor_node(2, 3), "y": tensor_node(4, dtype=torch.int64)}
    assert holds(where, captures=captures) is expected


def test_a_strided_value_is_not_contiguous():
    captures = {"x": node_with(torch.empty(3, 2).t()), "y": 1}
    assert holds("$x.is_contiguous()", captures=captures) is False
    assert holds("$x.shape[0] == 2", captures=captures) is True


def test_metadata_comes_from_tensor_meta_when_there_is_no_val():
    class Double(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    gm = fx.symbolic_trace(Double())
    ShapeProp(gm).propagate(torch.zeros(2, 5, dtype=torch.float64))
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    assert "val" not in relu.meta and "tensor_meta" in relu.meta
    captures = {"x": relu, "y": 2}
    assert holds("$x.dtype == torch.float64 and $x.ndim == 2 and $x.shape[1] == 5", captures=captures)
    assert holds("$x.dtype == torch.float32", captures=captures) is False


def test_val_is_preferred_to_tensor_meta():
    node = tensor_node(7)
    node.meta["tensor_meta"] = tensor_info(tensor_node(1, 1))  # anything with a shape would be read
    assert holds("$x.ndim == 1 and $x.shape[0] == 7", captures={"x": node, "y": 0})


def test_tensor_info_reads_shape_dtype_and_layout():
    info = tensor_info(node_with(torch.empty(2, 3, 4, dtype=torch.float16).transpose(0, 2)))
    assert isinstance(info, TensorInfo)
    assert info.shape == (4, 3, 2) and all(type(d) is int for d in info.shape)
    assert (info.ndim, info.dim(), info.numel(), info.size(0), info.size()) == (3, 3, 24, 4, (4, 3, 2))
    assert info.dtype == torch.float16 and info.is_contiguous() is False
    assert tensor_info(node_with(5)) is None  # not a tensor
    assert tensor_info(node_with()) is None  # no metadata at all


# ---------------------------------------------------------------------------
# values: literals, ints the graph computes, arithmetic, comparisons
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where, expected", [
    ("$y + 1 == 4", True),
    ("$y - 5 == -2", True),
    ("$y * $y == 9", True),
    ("$y / 2 == 1.5", True),
    ("$y // 2 == 1", True),
    ("$y % 2 == 1", True),
    ("-$y == -3", True),
    ("$y < 3", False),
    ("$y <= 3", True),
    ("$y > 2 and $y >= 3", True),
    ("$y != 3", False),
    ("$y in [1, 2, 3]", True),
    ("$y not in [1, 2, 3]", False),
    ("$x.shape[0] * $y == 6", True),
    ("$x.ndim + $y == 5 or $y == 0", True),
    ("not ($y == 3)", False),
])
def test_arithmetic_and_comparisons(where, expected):
    assert holds(where, captures={"x": tensor_node(2, 3), "y": 3}) is expected


def test_a_node_whose_value_is_not_a_tensor_stands_for_that_value():
    size = node_with(4, target=torch.numel)  # e.g. x.size(0) in a graph with values
    captures = {"x": tensor_node(4, 2), "y": size}
    assert holds("$y == 4 and $y == $x.shape[0]", captures=captures)
    assert holds("$y * 2 == 9", captures=captures) is False


def test_captured_sequences_index_and_len():
    captures = {"x": tensor_node(2, 3, 4), "p": [2, 0, 1], "q": [1, 2, 0]}
    pattern = "call_function torch.permute(call_function torch.permute($x, $p), $q)"
    assert holds("len($p) == len($q) and $p[$q[0]] == 0 and $p[$q[2]] == 2", pattern, captures=captures)
    assert holds("$p[$q[1]] == 0", pattern, captures=captures) is False
    assert holds("len($p) == $x.ndim and max($p) == 2 and min($q) == 0", pattern, captures=captures)


def test_a_function_by_dotted_path_is_called_with_the_values(tmp_path, monkeypatch):
    """Conditions call dotted paths only in packages the user allows (SECURITY.md); such a call
    gets the evaluated values."""
    (tmp_path / "fxrules_condition_helpers_zz.py").write_text("import math\n\ndef root(v):\n    return math.sqrt(v)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    allowed = ("fxrules_condition_helpers_zz",)
    where = "fxrules_condition_helpers_zz.root($y) == 3.0"
    assert holds(where, captures={"x": tensor_node(1), "y": 9}, allow_imports=allowed)
    assert holds(where, captures={"x": tensor_node(1), "y": 16}, allow_imports=allowed) is False


def test_a_condition_may_not_call_other_dotted_paths():
    with pytest.raises(fxrules.RuleFileError) as caught:
        holds("math.sqrt($y) == 3.0", captures={"x": tensor_node(1), "y": 9})
    assert [d.code for d in caught.value.diagnostics] == ["not-allowed"]


# ---------------------------------------------------------------------------
# NotApplicable: a value without the metadata a condition reads
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", [
    "$y.dtype == torch.int64",
    "not ($y.dtype == torch.int64)",
    "$y.dtype != torch.int64",
    "$y.ndim == 0 or $y == 3",  # the whole line, not only the read's own comparison
    "$y == 3 and $y.shape[0] == 1",
])
def test_reading_tensor_metadata_of_a_literal_makes_the_whole_condition_false(where):
    assert holds(where, captures={"x": tensor_node(2), "y": 3}) is False


def test_reading_tensor_metadata_of_a_computed_int_makes_the_condition_false():
    captures = {"x": tensor_node(2), "y": node_with(2, target=torch.numel)}
    assert holds("$y.dtype == torch.int64", captures=captures) is False
    assert holds("not ($y.dtype == torch.int64)", captures=captures) is False
    assert holds("$y == 2", captures=captures) is True


# ---------------------------------------------------------------------------
# MissingMetadata: a node the graph has no metadata for
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["$x.ndim == 2", "$x.dtype == torch.float32", "$x == 1", "$x.is_contiguous()"])
def test_reading_a_node_without_metadata_raises_missing_metadata_naming_it(where):
    bare = node_with(name="bare")
    bound = Bound(where, captures={"x": bare, "y": 1})
    with pytest.raises(MissingMetadata) as caught:
        bound.holds()
    assert caught.value.node is bare


def test_a_module_node_without_metadata_raises_missing_metadata_for_its_shape():
    module_node = node_with(op="call_module", target="lin")
    bound = Bound("lin.shape[0] == 2", "call_module Linear($x) as lin", captures={"x": module_node.args[0]},
                  names={"lin": module_node}, modules={"lin": nn.Linear(2, 2)})
    with pytest.raises(MissingMetadata) as caught:
        bound.holds()
    assert caught.value.node is module_node


def test_short_circuit_skips_a_read_that_would_need_missing_metadata():
    captures = {"x": tensor_node(2, 2), "y": node_with(name="bare")}
    assert holds("$x.ndim == 2 or $y.ndim == 2", captures=captures) is True
    assert holds("$x.ndim == 3 and $y.ndim == 2", captures=captures) is False


def test_a_bare_node_passed_to_a_predicate_is_no_constant_and_raises_nothing():
    captures = {"x": node_with(name="bare"), "y": 0}
    for predicate in ("is_zero", "is_one", "is_constant", "is_scalar", "is_floating"):
        assert holds(f"{predicate}($x)", captures=captures) is False, predicate


# ---------------------------------------------------------------------------
# predicates on parameters, buffers, literals and metadata
# ---------------------------------------------------------------------------

GET_ATTR = "call_function operator.add($x, get_attr $b)"


def with_buffer(where: str, tensor: torch.Tensor, x: fx.Node | None = None) -> bool:
    b = node_with(op="get_attr", target="blk.b")
    return holds(where, GET_ATTR, captures={"x": x if x is not None else tensor_node(3), "b": b},
                 attrs={"blk.b": tensor})


@pytest.mark.parametrize("tensor, zero, one", [
    (torch.zeros(3), True, False),
    (torch.ones(2, 2), False, True),
    (torch.tensor([0.0, 1.0]), False, False),
    (torch.tensor([0.0, -0.0]), True, False),
    (torch.zeros(0), False, False),  # no elements: neither
    (torch.zeros(3, device="meta"), False, False),  # no values to read
    (torch.ones(3, dtype=torch.int64), False, True),
])
def test_is_zero_and_is_one_read_the_parameter_or_buffer(tensor, zero, one):
    assert with_buffer("is_zero($b)", tensor) is zero
    assert with_buffer("is_one($b)", tensor) is one


@pytest.mark.parametrize("literal, zero, one, scalar", [
    (0, True, False, True), (0.0, True, False, True), (1, False, True, True), (1.0, False, True, True),
    (2.5, False, False, True), (False, True, False, True),
])
def test_predicates_on_literals(literal, zero, one, scalar):
    captures = {"x": tensor_node(2), "y": literal}
    assert holds("is_zero($y)", captures=captures) is zero
    assert holds("is_one($y)", captures=captures) is one
    assert holds("is_scalar($y)", captures=captures) is scalar
    assert holds("is_constant($y)", captures=captures) is True


def test_is_constant_tells_parameters_from_computed_values():
    assert with_buffer("is_constant($b)", torch.randn(3)) is True
    assert holds("is_constant($x)", captures={"x": tensor_node(3), "y": 1}) is False


@pytest.mark.parametrize("shape, scalar", [((), True), ((1,), True), ((1, 1), True), ((2,), False), ((1, 3), False)])
def test_is_scalar_counts_elements_of_metadata_and_buffers(shape, scalar):
    assert holds("is_scalar($x)", captures={"x": tensor_node(*shape), "y": 1}) is scalar
    assert with_buffer("is_scalar($b)", torch.zeros(shape)) is scalar


@pytest.mark.parametrize("dtype, floating", [(torch.float32, True), (torch.float16, True), (torch.bfloat16, True),
                                             (torch.int64, False), (torch.bool, False)])
def test_is_floating_reads_the_dtype(dtype, floating):
    assert holds("is_floating($x)", captures={"x": tensor_node(2, dtype=dtype), "y": 1}) is floating
    assert with_buffer("is_floating($b)", torch.zeros(2, dtype=dtype)) is floating


def test_a_buffer_capture_is_the_tensor_itself():
    buffer = torch.arange(6.0).reshape(2, 3)
    assert with_buffer("$b.ndim == 2 and $b.shape[1] == 3 and $b.numel == 6", buffer)
    assert with_buffer("$b.dtype == $x.dtype", buffer, x=tensor_node(3, dtype=torch.float64)) is False
    assert with_buffer("is_zero($b) and $b.ndim <= $x.ndim", torch.zeros(3), x=tensor_node(2, 3))


# ---------------------------------------------------------------------------
# `as` names: modules and other nodes
# ---------------------------------------------------------------------------


def test_a_named_module_node_is_its_module():
    linear = nn.Linear(4, 4, bias=False)
    node = node_with(op="call_module", target="fc")
    bind = dict(captures={"x": node.args[0]}, names={"lin": node}, modules={"fc": linear})
    pattern = "call_module Linear($x) as lin"
    assert holds("lin.in_features == lin.out_features", pattern, **bind)
    assert holds("lin.weight.shape[0] == 4 and lin.weight.ndim == 2", pattern, **bind)
    linear.train()
    assert holds("lin.training", pattern, **bind) is True
    linear.eval()
    assert holds("not lin.training", pattern, **bind) is True


def test_a_named_module_node_reads_tensor_metadata_for_metadata_attributes():
    node = node_with(torch.empty(5, 2), op="call_module", target="fc")
    bind = dict(captures={"x": node.args[0]}, names={"lin": node}, modules={"fc": nn.Linear(3, 2)})
    assert holds("lin.shape[0] == 5 and lin.out_features == 2", "call_module Linear($x) as lin", **bind)


def test_a_named_module_method_may_not_be_read():
    node = node_with(op="call_module", target="d")
    bound = Bound("d.train", "call_module Dropout($x) as d", captures={"x": node.args[0]}, names={"d": node},
                  modules={"d": nn.Dropout()})
    with pytest.raises(NameError):
        bound.holds()


def test_a_named_call_node_is_like_a_capture():
    relu = tensor_node(2, 8)
    pattern = "call_function torch.neg(call_function torch.relu($x) as r)"
    assert holds("r.ndim == 2 and r.shape[1] == 8 and is_floating(r)", pattern, captures={"x": relu.args[0]},
                 names={"r": relu})
