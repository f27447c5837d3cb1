"""The aten rule family on real models: transformers (v5) BERT, GPT-2, ViT, ResNet and MobileNetV2.

The models are built from small configs with random weights (nothing is downloaded),
exported with ``torch.export`` (they do not trace with ``torch.fx.symbolic_trace``), and
rewritten with ``fxrules/library/aten``; every output must be kept.

transformers is not a test dependency (it is large): ``pip install transformers==5.18.0
torch==2.13.0`` to run these; without it the module is skipped. Marker: ``transformers``.

The CNNs have eval-mode ``aten.batch_norm.default`` over ``aten.conv2d.default`` with
``get_attr`` parameters: ``aten_fold_conv2d_bn`` must fold every such pair (the tests also
fold them by hand with :func:`fxrules.builders.fold_conv_bn_tensors` and compare).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import fx
from torch.testing import assert_close

import fxrules
from fxrules.builders import fold_conv_bn_tensors

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.transformers

aten = torch.ops.aten
ATEN_RULES = fxrules.load_rules(fxrules.LIBRARY / "aten")


def _bert():
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    return transformers.BertModel(config), (torch.randint(0, 100, (2, 8)),)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32, use_cache=False,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), (torch.randint(0, 100, (2, 8)),)


def _vit():
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64)
    return transformers.ViTModel(config), (torch.randn(2, 3, 16, 16),)


def _resnet():
    config = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                       layer_type="basic")
    return transformers.ResNetModel(config), (torch.randn(2, 3, 32, 32),)


def _mobilenet_v2():
    config = transformers.MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25)
    return transformers.MobileNetV2Model(config), (torch.randn(2, 3, 32, 32),)


BUILD: dict[str, Callable[[], tuple]] = {"bert": _bert, "gpt2": _gpt2, "vit": _vit, "resnet": _resnet,
                                         "mobilenet_v2": _mobilenet_v2}

# The aten rules each model must fire (at least these, at least once) and how many
# eval-mode conv + batch norm pairs its exported graph has.
EXPECTED = {
    "bert": ({"aten_dropout_eval", "aten_add_zero"}, 0),
    "gpt2": ({"aten_dropout_eval", "aten_add_zero", "aten_remove_alias"}, 0),
    "vit": ({"aten_dropout_eval", "aten_add_zero"}, 0),
    "resnet": ({"aten_fold_conv2d_bn"}, 6),
    "mobilenet_v2": ({"aten_fold_conv2d_bn"}, 52),
}


def _randomize_batch_norms(model: torch.nn.Module) -> None:
    """Running statistics and affine parameters far from their initial values, which hide wrong folds."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.rand(n, generator=generator) * 2 - 1)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                if module.weight is not None:
                    module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                    module.bias.copy_(torch.rand(n, generator=generator) - 0.5)


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple]:
    """name -> (ExportedProgram, inputs), built once for the module."""
    programs = {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for name, build in BUILD.items():
            model, inputs = build()
            model.eval()
            _randomize_batch_norms(model)
            programs[name] = (torch.export.export(model, inputs), inputs)
    return programs


def _tensors(output: Any) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in _tensors(v)]
    return []


def _call_targets(gm: fx.GraphModule) -> dict:
    counts: dict = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            counts[node.target] = counts.get(node.target, 0) + 1
    return counts


@pytest.mark.parametrize("name", list(BUILD))
def test_aten_rules_keep_outputs(exported, name):
    program, inputs = exported[name]
    original = program.module()
    with torch.no_grad():
        reference = _tensors(original(*inputs))
    result = fxrules.apply_rules(program, ATEN_RULES)
    expected_rules, _ = EXPECTED[name]
    assert expected_rules <= set(result.counts), f"{name}: fired {dict(result.counts)}"
    with torch.no_grad():
        rewritten = _tensors(result.module(*inputs))
    assert len(rewritten) == len(reference) > 0
    only_exact = all(ATEN_RULES[rule].contract == "exact" for rule in result.counts)
    for got, want in zip(rewritten, reference):
        if only_exact:
            assert_close(got, want, rtol=0, atol=0)
        else:  # folds round differently; the error grows with depth
            assert_close(got, want, rtol=1e-4, atol=1e-4)
    if result.counts:
        assert len(result.module.graph.nodes) < len(original.graph.nodes)
    removed = _call_targets(original)
    kept = _call_targets(result.module)
    if "aten_dropout_eval" in result.counts:
        assert aten.dropout.default in removed and aten.dropout.default not in kept
    assert not result.report.rejected, result.report.rejected


def _conv_bn_pairs(gm: fx.GraphModule) -> list:
    """Eval-mode aten.batch_norm over aten.conv2d, parameters read with get_attr."""
    pairs = []
    for bn in gm.graph.find_nodes(op="call_function", target=aten.batch_norm.default):
        conv, weight, bias, mean, var, training, _momentum, eps, _cudnn = bn.args
        if training or not (isinstance(conv, fx.Node) and conv.target is aten.conv2d.default):
            continue
        if len(conv.users) != 1:
            continue
        attrs = [conv.args[1], *(a for a in (conv.args[2] if len(conv.args) > 2 else None, weight, bias, mean, var)
                                  if a is not None)]
        if all(isinstance(a, fx.Node) and a.op == "get_attr" for a in attrs):
            pairs.append((conv, bn))
    return pairs


def _fold_with_builder(gm: fx.GraphModule) -> int:
    """What an aten fold rule would do, by hand: new get_attr parameters from fold_conv_bn_tensors."""
    def attr(node):
        if node is None:
            return None
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        return value

    pairs = _conv_bn_pairs(gm)
    for index, (conv, bn) in enumerate(pairs):
        _, weight, bias, mean, var, _, _, eps, _ = bn.args
        conv_bias = conv.args[2] if len(conv.args) > 2 else None
        folded_w, folded_b = fold_conv_bn_tensors(attr(conv.args[1]), attr(conv_bias), attr(mean), attr(var), eps,
                                                  attr(weight), attr(bias))
        gm.register_parameter(f"_folded_{index}_weight", folded_w)
        gm.register_parameter(f"_folded_{index}_bias", folded_b)
        with gm.graph.inserting_before(conv):
            w_node = gm.graph.get_attr(f"_folded_{index}_weight")
            b_node = gm.graph.get_attr(f"_folded_{index}_bias")
            args = list(conv.args) + [None] * max(0, 3 - len(conv.args))
            args[1], args[2] = w_node, b_node
            new_conv = gm.graph.call_function(aten.conv2d.default, tuple(args), dict(conv.kwargs))
        bn.replace_all_uses_with(new_conv)
        gm.graph.erase_node(bn)
        gm.graph.erase_node(conv)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return len(pairs)


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2"])
def test_cnn_conv_bn_pairs_fold_with_the_tensor_builder(exported, name):
    program, inputs = exported[name]
    _, pairs_expected = EXPECTED[name]
    gm = program.module()
    with torch.no_grad():
        reference = _tensors(gm(*inputs))
    assert len(_conv_bn_pairs(gm)) == pairs_expected
    assert _fold_with_builder(gm) == pairs_expected
    assert aten.batch_norm.default not in _call_targets(gm)
    gm.graph.lint()
    with torch.no_grad():
        folded = _tensors(gm(*inputs))
    for got, want in zip(folded, reference):
        assert_close(got, want, rtol=1e-4, atol=1e-4)
    # and the library's aten rules still apply to the folded graph, keeping its outputs
    result = fxrules.apply_rules(gm, ATEN_RULES, example_inputs=inputs)
    with torch.no_grad():
        for got, want in zip(_tensors(result.module(*inputs)), folded):
            assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2"])
def test_aten_fold_rule_folds_every_conv_bn_pair(exported, name):
    program, inputs = exported[name]
    _, pairs = EXPECTED[name]
    original = program.module()
    with torch.no_grad():
        reference = _tensors(original(*inputs))
    result = fxrules.apply_rules(program, ATEN_RULES)
    assert result.counts.get("aten_fold_conv2d_bn") == pairs
    assert aten.batch_norm.default not in _call_targets(result.module)
    assert len(result.module.graph.nodes) < len(original.graph.nodes) - pairs
    with torch.no_grad():
        for got, want in zip(_tensors(result.module(*inputs)), reference):
            assert_close(got, want, rtol=1e-4, atol=1e-4)
