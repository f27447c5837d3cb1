"""Exported CNNs fold: the aten conv + batch-norm rules (module builders fed captured parameters)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxrules
from fxrules import zoo

ATEN = fxrules.load_rules(fxrules.LIBRARY / "aten")


def _export(model: nn.Module, *inputs):
    return torch.export.export(model.eval(), inputs)


def _randomize_bn(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)


class Scaled(nn.Module):
    """A conv whose weight the graph computes (w * 2): not a parameter a fold may read."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(torch.nn.functional.conv2d(x, self.w * 2))


def test_the_zoo_resnet_folds_when_exported():
    model = zoo.resnet()
    (x,) = zoo.example_inputs("resnet")
    program = _export(model, x)
    batch_norms = sum(n.target == torch.ops.aten.batch_norm.default for n in program.module().graph.nodes)
    assert batch_norms >= 2
    result = fxrules.apply_rules(program, ATEN)
    assert result.report.counts.get("aten_fold_conv2d_bn") == batch_norms
    assert not any(n.target == torch.ops.aten.batch_norm.default for n in result.module.graph.nodes)
    torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("bias, affine, groups", [(True, True, 1), (False, False, 2), (True, False, 2)])
def test_conv_bn_pairs_fold_in_every_dimensionality(dims, bias, affine, groups):
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims](4, 6, 3, stride=2, padding=1, dilation=1, groups=groups,
                                                             bias=bias)
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims](6, affine=affine, eps=0.01)
    model = nn.Sequential(conv, bn, nn.ReLU())
    _randomize_bn(model)
    x = torch.randn(2, 4, *([7] * dims))
    program = _export(model, x)
    result = fxrules.apply_rules(program, ATEN)
    assert result.report.counts == {f"aten_fold_conv{dims}d_bn": 1}
    folded = [m for m in result.module.modules() if isinstance(m, type(conv))]
    assert len(folded) == 1 and folded[0].groups == groups and folded[0].stride == conv.stride
    torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_training_mode_batch_norm_is_left_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(2, 3, 8, 8)
    program = torch.export.export(model.train(), (x,))
    result = fxrules.apply_rules(program, ATEN)
    assert "aten_fold_conv2d_bn" not in result.report.counts


def test_a_weight_computed_by_the_graph_is_declined_not_folded():
    model = Scaled().eval()
    x = torch.randn(2, 3, 8, 8)
    result = fxrules.apply_rules(_export(model, x), ATEN)
    assert "aten_fold_conv2d_bn" not in result.report.counts  # the pattern wants get_attr weights
    torch.testing.assert_close(result.module(x), model(x))


def test_a_builder_argument_computed_by_the_graph_is_a_reported_refusal():
    rules = fxrules.parse_rules(
        "rule fold [approx]:\n"
        "    call_function aten.batch_norm.default(call_function aten.conv2d.default($x, $w, $b, $s, $p, $d, $g),"
        " $gamma, $beta, get_attr $mean, get_attr $var, False, _, $eps, _)\n"
        "    -> call_module fxrules.builders.fold_aten_conv_bn($w, $b, $gamma, $beta, $mean, $var, $eps, $s, $p, $d,"
        " $g)($x)\n")

    model = Scaled().eval()
    x = torch.randn(2, 3, 8, 8)
    result = fxrules.apply_rules(_export(model, x), rules)
    assert not result.report.applied
    (refused,) = result.report.rejected
    assert refused.code == "builder-declined"
    assert "fold_aten_conv_bn declined" in refused.reason and "$w is computed by node %mul" in refused.reason
    torch.testing.assert_close(result.module(x), model(x))
