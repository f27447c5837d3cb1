"""fuse/intrinsic.fxr and its builders: torch.ao.nn.intrinsic fusions for inference (issue 19).

The rules fuse what torch.ao.quantization.fuse_modules fuses (conv+relu, conv+bn+relu with the
batch norm folded, linear+relu, bn+relu), in any spelling of the ReLU; the result has the same
module classes and parameter values as torch's fuser, and the outputs are kept. What must not
be fused is left alone: a conv whose output is read again, a training model with trainable
parameters, a subclass torch.ao's modules do not take.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.ao.nn import intrinsic as nni
from torch.ao.quantization import fuse_modules

import fxrules
from fxrules import builders
from fxrules.builders import BuilderError
from fxrules.engine import aliasing
from fxrules.engine.matcher import computes_as
from fxrules.engine.refusals import RefusalCode

RULES = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "intrinsic.fxr")


def seeded(cls, *args):
    torch.manual_seed(0)
    model = cls(*args)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 2)
            module.bias.data.uniform_(-1, 1)
    return model


class Net(nn.Module):
    """Every fusion once, and the ReLU spelled four ways."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv1d(8, 4, 1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))  # conv + bn + relu (in place)
        x = F.relu(self.conv2(x))  # conv + relu
        x = self.bn2(x).relu()  # bn + relu
        x = torch.relu(self.conv3(x.mean(-1)))  # conv1d + relu
        return torch.relu(self.fc(x.mean(-1)))  # linear + relu


def test_every_fusion_fires_and_keeps_outputs():
    model = seeded(Net).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x.clone())
        result = fxrules.apply_rules(model, RULES, example_inputs=(x,))
        got = result.module(x.clone())
    assert result.counts == {"fuse_conv2d_bn_relu": 1, "fuse_conv_relu": 2, "fuse_bn_relu": 1, "fuse_linear_relu": 1}
    kinds = sorted(type(m).__name__ for m in result.module.modules() if isinstance(m, aliasing.FUSED_MODULES))
    assert kinds == ["BNReLU2d", "ConvReLU1d", "ConvReLU2d", "ConvReLU2d", "LinearReLU"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert result.report.rejected == ()


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.fc(x))


@pytest.mark.parametrize("model_class, names, x", [
    (ConvBnRelu, ["conv", "bn", "relu"], torch.randn(2, 3, 6, 6)),
    (LinearRelu, ["fc", "relu"], torch.randn(4, 6)),
])
def test_the_fused_module_is_torch_aos(model_class, names, x):
    """Same classes and parameter values as torch.ao.quantization.fuse_modules (inference)."""
    model = seeded(model_class).eval()
    theirs = fuse_modules(copy.deepcopy(model), [names])
    ours = fxrules.apply_rules(model, RULES, example_inputs=(x,)).module
    [fused_theirs] = [m for m in theirs.modules() if isinstance(m, nni.modules.fused._FusedModule)]
    [fused_ours] = [m for m in ours.modules() if isinstance(m, nni.modules.fused._FusedModule)]
    assert type(fused_ours) is type(fused_theirs)
    for (name, value), (other, theirs_value) in zip(fused_ours.state_dict().items(), fused_theirs.state_dict().items()):
        assert name == other and torch.equal(value, theirs_value), name
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


class ConvReadTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y), y


class MyConv(nn.Conv2d):
    pass


def subclass_conv() -> fx.GraphModule:
    """``relu(conv(x))`` with a Conv2d subclass called as a module (symbolic_trace would trace into it)."""
    root = nn.Module()
    root.conv = MyConv(3, 4, 3)
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.relu, (graph.call_module("conv", (x,)),)))
    return fx.GraphModule(root, graph).eval()


def test_a_conv_read_again_is_not_fused():
    model = ConvReadTwice().eval()
    result = fxrules.apply_rules(model, RULES, example_inputs=(torch.randn(1, 3, 6, 6),))
    assert result.counts == {}
    assert [r.code for r in result.report.rejected] == [RefusalCode.INTERIOR_USED_OUTSIDE]


def test_a_subclass_is_declined_by_the_builder():
    result = fxrules.apply_rules(subclass_conv(), RULES, example_inputs=(torch.randn(1, 3, 6, 6),))
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.code is RefusalCode.BUILDER_DECLINED and "MyConv" in rejected.reason


def test_a_training_model_with_trainable_parameters_is_left_alone():
    model = seeded(LinearRelu).train()
    x = torch.randn(4, 6)
    result = fxrules.apply_rules(model, RULES, example_inputs=(x,))
    assert result.counts == {}
    assert [r.code for r in result.report.rejected] == [RefusalCode.TRAINABLE_PARAMETER_DROPPED]
    for p in model.parameters():
        p.requires_grad_(False)
    assert fxrules.apply_rules(model, RULES, example_inputs=(x,)).counts == {"fuse_linear_relu": 1}


# ---------------------------------------------------------------------------
# The builders
# ---------------------------------------------------------------------------


def _storages(module: nn.Module) -> set:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


@pytest.mark.parametrize("build, parts", [
    (builders.fuse_conv_relu, lambda: (nn.Conv2d(3, 4, 3),)),
    (builders.fuse_conv_relu, lambda: (nn.Conv3d(3, 4, 3),)),
    (builders.fuse_conv_bn_relu, lambda: (nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4).eval())),
    (builders.fuse_linear_relu, lambda: (nn.Linear(3, 4),)),
    (builders.fuse_bn_relu, lambda: (nn.BatchNorm3d(4).eval(),)),
])
def test_a_builder_shares_no_storage_and_leaves_its_inputs(build, parts):
    inputs = parts()
    before = [copy.deepcopy(m.state_dict()) for m in inputs]
    fused = build(*inputs)
    assert isinstance(fused, aliasing.FUSED_MODULES) and not fused.training
    assert not _storages(fused) & set().union(*(_storages(m) for m in inputs))
    for module, state in zip(inputs, before):
        assert all(torch.equal(v, module.state_dict()[k]) for k, v in state.items())
    assert builders.BUILDERS[build.__name__] is build


@pytest.mark.parametrize("call, words", [
    (lambda: builders.fuse_conv_relu(MyConv(3, 4, 3)), "not a subclass"),
    (lambda: builders.fuse_conv_relu(nn.ConvTranspose2d(3, 4, 3)), "Conv1d, Conv2d or Conv3d"),
    (lambda: builders.fuse_linear_relu(nn.Bilinear(3, 3, 4)), "nn.Linear"),
    (lambda: builders.fuse_bn_relu(nn.BatchNorm2d(3).train()), "training mode"),
    (lambda: builders.fuse_bn_relu(nn.BatchNorm1d(3).eval()), "BatchNorm2d or BatchNorm3d"),
    (lambda: builders.fuse_conv_bn_relu(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(5).eval()), "num_features=5"),
    (lambda: builders.fuse_conv_bn_relu(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4).train()), "training mode"),
])
def test_a_builder_refuses_what_it_cannot_fuse(call, words):
    with pytest.raises(BuilderError, match=words):
        call()


def test_a_hooked_part_is_refused():
    conv = nn.Conv2d(3, 4, 3)
    conv.register_forward_hook(lambda *args: None)
    with pytest.raises(BuilderError, match="hooks"):
        builders.fuse_conv_relu(conv)


def test_the_fused_modules_are_known_and_a_training_bn_relu_updates_statistics():
    for cls in aliasing.FUSED_MODULES:
        assert aliasing.module_class_is_known(cls, computes_as)
    assert not aliasing.module_class_is_known(nni.ConvBnReLU2d, computes_as)  # not made by fxrules: unknown
    fused = nni.BNReLU2d(nn.BatchNorm2d(3), nn.ReLU())
    assert aliasing.module_updates_statistics(fused.train())
    assert not aliasing.module_updates_statistics(fused.eval())


def test_a_fused_module_at_the_output_is_a_fresh_value():
    """Known, not unknown: the output-alias check does not refuse a fused module that the graph returns."""
    gm = fx.symbolic_trace(seeded(LinearRelu).eval())
    result = fxrules.apply_rules(gm, RULES, example_inputs=(torch.randn(2, 6),))
    assert result.counts == {"fuse_linear_relu": 1}
    output = [n for n in result.module.graph.nodes if n.op == "output"][0]
    assert output.args[0].op == "call_module"
