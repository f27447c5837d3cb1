"""Tests for fxrules.zoo: every model traces, runs, is deterministic, and has the ops it claims."""

from __future__ import annotations

import operator
from collections import Counter
from typing import Callable

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from fxrules import zoo

DEEP = {"deep_mlp": zoo.deep_mlp, "deep_cnn": zoo.deep_cnn, "deep_transformer": zoo.deep_transformer}
ALL: dict[str, Callable[[], nn.Module]] = {**zoo.ZOO, **{name: (lambda f=f: f(3)) for name, f in DEEP.items()}}


def trace(name: str) -> fx.GraphModule:
    return fx.symbolic_trace(zoo.ZOO[name]())


def ops(graph_module: fx.GraphModule) -> Counter:
    return Counter(node.op for node in graph_module.graph.nodes)


def function_targets(graph_module: fx.GraphModule) -> set:
    return {node.target for node in graph_module.graph.nodes if node.op == "call_function"}


def method_targets(graph_module: fx.GraphModule) -> Counter:
    return Counter(node.target for node in graph_module.graph.nodes if node.op == "call_method")


def module_types(graph_module: fx.GraphModule) -> set[type]:
    return {
        type(graph_module.get_submodule(node.target)) for node in graph_module.graph.nodes if node.op == "call_module"
    }


def has_chain(graph_module: fx.GraphModule, outer, inner) -> bool:
    """Whether some node matching ``outer`` takes as its first argument a node matching ``inner``."""
    return any(
        outer(node) and node.args and isinstance(node.args[0], fx.Node) and inner(node.args[0])
        for node in graph_module.graph.nodes
    )


def is_fn(target) -> Callable[[fx.Node], bool]:
    return lambda node: node.op == "call_function" and node.target is target


def is_method(name: str) -> Callable[[fx.Node], bool]:
    return lambda node: node.op == "call_method" and node.target == name


def is_module(gm: fx.GraphModule, cls: type) -> Callable[[fx.Node], bool]:
    return lambda node: node.op == "call_module" and isinstance(gm.get_submodule(node.target), cls)


# ----------------------------------------------------------------- all models


def test_zoo_lists_the_five_models() -> None:
    assert set(zoo.ZOO) == {"mlp", "resnet", "transformer", "methods", "redundant"}


@pytest.mark.parametrize("name", sorted(ALL))
def test_traces_runs_and_matches_eager(name: str) -> None:
    model = ALL[name]()
    traced = fx.symbolic_trace(model)
    traced.graph.lint()
    inputs = zoo.example_inputs(name)
    assert all(isinstance(t, torch.Tensor) for t in inputs)
    with torch.no_grad():
        eager = model(*inputs)
        out = traced(*inputs)
    assert torch.isfinite(eager).all()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("name", sorted(ALL))
def test_models_are_in_eval_mode_and_deterministic(name: str) -> None:
    first, second = ALL[name](), ALL[name]()
    assert first is not second
    assert not any(module.training for module in first.modules())
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a)
    inputs = zoo.example_inputs(name)
    assert all(torch.equal(x, y) for x, y in zip(inputs, zoo.example_inputs(name)))
    with torch.no_grad():
        assert torch.equal(first(*inputs), first(*inputs))
        assert torch.equal(first(*inputs), second(*inputs))


def test_building_models_leaves_the_global_rng_alone() -> None:
    state = torch.get_rng_state()
    for factory in ALL.values():
        factory()
    zoo.example_inputs("mlp")
    assert torch.equal(torch.get_rng_state(), state)


def test_batch_norms_have_non_default_statistics() -> None:
    for name in ("resnet", "redundant", "deep_cnn"):
        for module in ALL[name]().modules():
            if isinstance(module, nn.BatchNorm2d):
                assert not torch.equal(module.running_mean, torch.zeros_like(module.running_mean))
                assert not torch.equal(module.running_var, torch.ones_like(module.running_var))


def test_example_inputs_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="no zoo model named 'nope'"):
        zoo.example_inputs("nope")


def test_example_inputs_seed_changes_values() -> None:
    (a,), (b,) = zoo.example_inputs("mlp"), zoo.example_inputs("mlp", seed=1)
    assert a.shape == b.shape and not torch.equal(a, b)


# ------------------------------------------------------------ claimed op kinds


def test_mlp_has_every_relu_spelling_and_dropout() -> None:
    gm = trace("mlp")
    assert {nn.Linear, nn.ReLU, nn.Dropout} <= module_types(gm)
    assert {torch.relu, F.relu} <= function_targets(gm)
    assert method_targets(gm)["relu"] >= 1


def test_resnet_has_conv_bn_relu_residuals_pool_flatten_linear() -> None:
    gm = trace("resnet")
    assert {nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.AdaptiveAvgPool2d, nn.Linear} <= module_types(gm)
    assert {operator.add, torch.flatten} <= function_targets(gm)
    assert has_chain(gm, is_module(gm, nn.BatchNorm2d), is_module(gm, nn.Conv2d))
    flatten = next(n for n in gm.graph.nodes if n.target is torch.flatten)
    assert flatten.args[1:] == (1,)


def test_transformer_has_all_four_node_kinds() -> None:
    gm = trace("transformer")
    counts = ops(gm)
    for kind in ("call_function", "call_method", "call_module", "get_attr"):
        assert counts[kind] > 0, kind
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["pos"]
    assert {nn.Linear, nn.LayerNorm, nn.GELU, nn.Dropout} <= module_types(gm)
    assert {torch.matmul, operator.matmul, F.softmax, operator.add} <= function_targets(gm)
    assert {"reshape", "view", "transpose", "permute"} <= set(method_targets(gm))


def test_methods_has_method_chains() -> None:
    gm = trace("methods")
    methods = method_targets(gm)
    assert {"transpose", "relu", "view", "contiguous", "sum", "mul"} <= set(methods)
    assert torch.sum in function_targets(gm)
    assert has_chain(gm, is_method("transpose"), is_method("transpose"))
    assert has_chain(gm, is_method("relu"), is_method("relu"))
    assert any(n.target == "mul" and n.args[1:] == (1,) for n in gm.graph.nodes)
    assert any(n.target == "sum" and n.kwargs == {"dim": 1} for n in gm.graph.nodes)


def test_redundant_has_what_the_cleanup_rules_remove() -> None:
    model = zoo.redundant()
    gm = fx.symbolic_trace(model)
    nodes = list(gm.graph.nodes)
    assert has_chain(gm, is_fn(torch.relu), is_fn(torch.relu))
    assert has_chain(gm, is_method("transpose"), is_method("transpose"))
    assert has_chain(gm, is_module(gm, nn.BatchNorm2d), is_module(gm, nn.Conv2d))
    assert nn.Dropout in module_types(gm)
    assert any(n.target is operator.mul and n.args[1] == 1 for n in nodes)
    assert any(n.target is operator.add and n.args[1] == 0 for n in nodes)
    assert any(n.target is operator.add and len(n.args) == 2 and n.args[0] is n.args[1] for n in nodes)
    zero_adds = [
        n for n in nodes if n.target is operator.add and isinstance(n.args[1], fx.Node) and n.args[1].op == "get_attr"
    ]
    assert [n.args[1].target for n in zero_adds] == ["zero_bias"]
    assert isinstance(model.zero_bias, nn.Parameter) and not model.zero_bias.any()
    # one flatten turns 4-D into 2-D; a second flattens the (already 2-D) result again
    flattens = [n for n in nodes if n.target is torch.flatten]
    assert len(flattens) == 2
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(*zoo.example_inputs("redundant"))
    assert sorted(len(n.args[0].meta["tensor_meta"].shape) for n in flattens) == [2, 4]


# -------------------------------------------------------------- deep generators


@pytest.mark.parametrize(
    "name, depth, minimum", [("deep_mlp", 100, 300), ("deep_cnn", 20, 140), ("deep_transformer", 5, 140)]
)
def test_deep_generators_scale(name: str, depth: int, minimum: int) -> None:
    small = len(fx.symbolic_trace(DEEP[name](1)).graph.nodes)
    gm = fx.symbolic_trace(DEEP[name](depth))
    big = len(gm.graph.nodes)
    assert big > minimum
    assert big - small >= (depth - 1) * 3  # grows at least linearly, a few nodes per layer
    with torch.no_grad():
        out = gm(*zoo.example_inputs(name))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("factory", list(DEEP.values()))
def test_deep_generators_reject_bad_depths(factory) -> None:
    for bad in (-1, 2.0, True, "3"):
        with pytest.raises(ValueError):
            factory(bad)


def test_deep_generators_allow_zero_depth() -> None:
    for name, factory in DEEP.items():
        gm = fx.symbolic_trace(factory(0))
        gm(*zoo.example_inputs(name))
