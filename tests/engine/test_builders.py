"""Tests for fxrules.builders: conv/bn and linear/bn folding.

Each property test draws the module hyperparameters with hypothesis, builds the modules
from a drawn seed (inside ``fork_rng``, so the global RNG is untouched), gives the batch
norm random running statistics and affine parameters (never the defaults), and checks:

* the folded module computes ``bn(conv(x))`` (assert_close, dtype-dependent tolerance);
* its parameters equal torch's own fuser's bit for bit, where torch can fold;
* device, dtype, class, eval mode and ``requires_grad`` are as promised;
* the inputs are unchanged: state dict values, parameter identities, training flags,
  and the folded module shares no storage with them.

Example counts and deadlines come from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

from fxrules import builders
from fxrules.builders import BUILDERS, BuilderError, fold_conv_bn, fold_linear_bn
from fxrules.errors import FxrulesError

CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_TRANSPOSES = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
BATCH_NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10)}


@pytest.fixture(scope="module", autouse=True)
def _warm_up() -> None:
    """Pay one-time costs (lazy imports inside assert_close, first dispatch of each conv kind)
    before any hypothesis test runs, so they don't land inside a deadline and read as flaky."""
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    for dims in (1, 2, 3):
        for dtype in (torch.float32, torch.float64):
            x = torch.zeros(1, 1, *([3] * dims), dtype=dtype)
            for conv in (CONVS[dims](1, 1, 1), CONV_TRANSPOSES[dims](1, 1, 1)):
                bn = BATCH_NORMS[dims](1).eval()
                fused = fold_conv_bn(conv.to(dtype).eval(), bn.to(dtype))
                torch.testing.assert_close(fused(x), bn(conv(x)))


# ----------------------------------------------------------------- helpers


def randomize_bn(bn: nn.modules.batchnorm._BatchNorm) -> None:
    """Running statistics and affine parameters far from their defaults (0, 1, 1, 0)."""
    with torch.no_grad():
        bn.running_mean.uniform_(-2.0, 2.0)
        bn.running_var.uniform_(0.25, 4.0)
        bn.num_batches_tracked.fill_(7)
        if bn.affine:
            bn.weight.uniform_(-2.0, 2.0)
            bn.bias.uniform_(-1.0, 1.0)


def _has_values(tensor: torch.Tensor) -> bool:
    """False for tensors without data to compare: uninitialised lazy ones and meta ones."""
    return not isinstance(tensor, nn.parameter.UninitializedTensorMixin) and tensor.device.type != "meta"


def snapshot(*modules: nn.Module) -> list[dict[str, Any]]:
    """What must not change: state values, parameter/buffer objects, flags."""
    taken = []
    for module in modules:
        taken.append(
            {
                "state": {k: v.detach().clone() for k, v in module.state_dict().items() if _has_values(v)},
                "ids": {k: id(v) for k, v in (*module.named_parameters(), *module.named_buffers())},
                "requires_grad": {k: p.requires_grad for k, p in module.named_parameters()},
                "training": [m.training for m in module.modules()],
                "dict_keys": sorted(module.__dict__),
            }
        )
    return taken


def assert_unchanged(before: list[dict[str, Any]], *modules: nn.Module) -> None:
    after = snapshot(*modules)
    for old, new in zip(before, after):
        assert old["ids"] == new["ids"], "a parameter or buffer object was replaced"
        assert old["requires_grad"] == new["requires_grad"]
        assert old["training"] == new["training"]
        assert old["dict_keys"] == new["dict_keys"]
        assert old["state"].keys() == new["state"].keys()
        for key, value in old["state"].items():
            assert torch.equal(value, new["state"][key]), f"{key} was modified"


def assert_no_shared_storage(fused: nn.Module, *inputs: nn.Module) -> None:
    pointers = {t.untyped_storage().data_ptr() for m in inputs for t in (*m.parameters(), *m.buffers())}
    for name, tensor in (*fused.named_parameters(), *fused.named_buffers()):
        assert tensor.untyped_storage().data_ptr() not in pointers, f"fused {name} shares storage with an input"


def assert_fused_properties(fused: nn.Module, original: nn.Module, out_features: int) -> None:
    assert fused is not original
    assert type(fused) is type(original)
    assert not any(m.training for m in fused.modules())
    assert fused.bias is not None and fused.bias.shape == (out_features,)
    assert fused.weight.shape == original.weight.shape
    for param in (fused.weight, fused.bias):
        assert isinstance(param, nn.Parameter)
        assert param.dtype == original.weight.dtype
        assert param.device == original.weight.device
        assert param.requires_grad == original.weight.requires_grad
        assert param.is_leaf


# --------------------------------------------------------------- strategies


@st.composite
def conv_bn_cases(draw: st.DrawFn, transposed: bool = False) -> dict[str, Any]:
    dims = draw(st.sampled_from([1, 2, 3]))
    groups = draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(dims))
    dilation = draw(st.integers(1, 2))
    if transposed:
        padding: Any = draw(st.integers(0, 2))
        padding_mode = "zeros"  # the only mode transposed convs accept
        output_padding = tuple(draw(st.integers(0, max(s, dilation) - 1)) for s in stride)
    else:
        choices = [st.integers(0, 2), st.just("valid")]
        if stride == (1,) * dims:
            choices.append(st.just("same"))
        padding = draw(st.one_of(*choices))
        padding_mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
        output_padding = (0,) * dims
    pad = padding if isinstance(padding, int) else 0
    # Big enough for the kernel, for reflect padding (size > pad) and for positive transposed outputs.
    size = tuple(dilation * (k - 1) + 2 * pad + 3 + draw(st.integers(0, 1)) for k in kernel)
    return dict(
        dims=dims,
        in_channels=groups * draw(st.integers(1, 3)),
        out_channels=groups * draw(st.integers(1, 3)),
        kernel=kernel,
        stride=stride,
        padding=padding,
        padding_mode=padding_mode,
        output_padding=output_padding,
        dilation=dilation,
        groups=groups,
        bias=draw(st.booleans()),
        affine=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        conv_training=draw(st.booleans()),
        requires_grad=draw(st.booleans()),
        size=size,
        seed=draw(st.integers(0, 2**31 - 1)),
        transposed=transposed,
    )


def build_conv_bn(case: dict[str, Any]) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        common = dict(
            stride=case["stride"],
            padding=case["padding"],
            dilation=case["dilation"],
            groups=case["groups"],
            bias=case["bias"],
            padding_mode=case["padding_mode"],
        )
        if case["transposed"]:
            cls = CONV_TRANSPOSES[case["dims"]]
            common["output_padding"] = case["output_padding"]
        else:
            cls = CONVS[case["dims"]]
        conv = cls(case["in_channels"], case["out_channels"], case["kernel"], **common).to(case["dtype"])
        conv.train(case["conv_training"])
        conv.weight.requires_grad_(case["requires_grad"])
        bn = BATCH_NORMS[case["dims"]](case["out_channels"], eps=case["eps"], affine=case["affine"])
        bn = bn.to(case["dtype"]).eval()
        randomize_bn(bn)
        x = torch.randn(2, case["in_channels"], *case["size"], dtype=case["dtype"])
    return conv, bn, x


@st.composite
def linear_bn_cases(draw: st.DrawFn) -> dict[str, Any]:
    out_features = draw(st.integers(1, 8))
    return dict(
        in_features=draw(st.integers(1, 8)),
        out_features=out_features,
        num_features=draw(st.sampled_from(sorted({out_features, 1}))),
        bias=draw(st.booleans()),
        affine=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        linear_training=draw(st.booleans()),
        requires_grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build_linear_bn(case: dict[str, Any]) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])
        linear = nn.Linear(case["in_features"], case["out_features"], bias=case["bias"]).to(case["dtype"])
        linear.train(case["linear_training"])
        linear.weight.requires_grad_(case["requires_grad"])
        bn = nn.BatchNorm1d(case["num_features"], eps=case["eps"], affine=case["affine"]).to(case["dtype"]).eval()
        randomize_bn(bn)
        if case["num_features"] == case["out_features"]:
            x = torch.randn(4, case["in_features"], dtype=case["dtype"])  # (N, features)
        else:
            x = torch.randn(4, 1, case["in_features"], dtype=case["dtype"])  # (N, 1 channel, L)
    return linear, bn, x


# ------------------------------------------------------------ fold_conv_bn


def check_conv_fold(case: dict[str, Any]) -> None:
    conv, bn, x = build_conv_bn(case)
    before = snapshot(conv, bn)

    fused = fold_conv_bn(conv, bn)

    assert_unchanged(before, conv, bn)
    assert_no_shared_storage(fused, conv, bn)
    assert_fused_properties(fused, conv, case["out_channels"])
    for attr in ("stride", "padding", "dilation", "groups", "padding_mode", "output_padding", "kernel_size"):
        assert getattr(fused, attr) == getattr(conv, attr)

    with torch.no_grad():
        expected = bn(conv(x))
        actual = fused(x)
    torch.testing.assert_close(actual, expected, **TOLERANCE[case["dtype"]])

    if not (case["transposed"] and case["groups"] > 1):  # torch's fuser cannot fold grouped transposed convs
        reference = fuse_conv_bn_eval(copy.deepcopy(conv).eval(), bn, transpose=case["transposed"])
        assert torch.equal(fused.weight, reference.weight)
        assert torch.equal(fused.bias, reference.bias)
    assert_unchanged(before, conv, bn)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths:UserWarning")
@given(conv_bn_cases())
@pytest.mark.slow
def test_fold_conv_bn_matches_eager_and_torch(case: dict[str, Any]) -> None:
    check_conv_fold(case)


@given(conv_bn_cases(transposed=True))
def test_fold_conv_transpose_bn_matches_eager_and_torch(case: dict[str, Any]) -> None:
    check_conv_fold(case)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_fold_conv_bn_grouped_transposed_is_refused_by_torch_but_folded_here(dims: int) -> None:
    conv = CONV_TRANSPOSES[dims](4, 6, 3, stride=2, groups=2).eval()
    bn = BATCH_NORMS[dims](6).eval()
    randomize_bn(bn)
    with pytest.raises(RuntimeError):
        fuse_conv_bn_eval(conv, bn, transpose=True)
    x = torch.randn(2, 4, *([4] * dims))
    with torch.no_grad():
        torch.testing.assert_close(fold_conv_bn(conv, bn)(x), bn(conv(x)))


def test_fold_conv_bn_does_not_share_or_alias_parameters() -> None:
    conv = nn.Conv2d(3, 4, 3).eval()
    bn = nn.BatchNorm2d(4).eval()
    randomize_bn(bn)
    original = conv.weight.detach().clone()
    fused = fold_conv_bn(conv, bn)
    with torch.no_grad():
        fused.weight.add_(1.0)
        fused.bias.add_(1.0)
    assert torch.equal(conv.weight, original)
    assert conv.bias is not None and fused.bias is not conv.bias


def test_fold_conv_bn_bias_follows_weight_requires_grad_even_without_conv_bias() -> None:
    conv = nn.Conv1d(2, 3, 1, bias=False).eval()
    bn = nn.BatchNorm1d(3).eval()
    randomize_bn(bn)
    fused = fold_conv_bn(conv, bn)
    assert fused.weight.requires_grad and fused.bias.requires_grad
    fused(torch.randn(1, 2, 5)).sum().backward()
    assert fused.bias.grad is not None
    assert conv.weight.grad is None  # the fused module is not connected to the original


def test_fold_conv_bn_mixed_dtypes_follow_the_conv() -> None:
    conv = nn.Conv2d(2, 3, 3).eval()
    bn = nn.BatchNorm2d(3).double().eval()
    randomize_bn(bn)
    fused = fold_conv_bn(conv, bn)
    assert fused.weight.dtype == fused.bias.dtype == torch.float32
    reference = fuse_conv_bn_eval(conv, bn)
    assert torch.equal(fused.weight, reference.weight) and torch.equal(fused.bias, reference.bias)


# ----------------------------------------------------------- fold_linear_bn


@given(linear_bn_cases())
def test_fold_linear_bn_matches_eager_and_torch(case: dict[str, Any]) -> None:
    linear, bn, x = build_linear_bn(case)
    before = snapshot(linear, bn)

    fused = fold_linear_bn(linear, bn)

    assert_unchanged(before, linear, bn)
    assert_no_shared_storage(fused, linear, bn)
    assert_fused_properties(fused, linear, case["out_features"])
    assert (fused.in_features, fused.out_features) == (linear.in_features, linear.out_features)

    with torch.no_grad():
        expected = bn(linear(x))
        actual = fused(x)
    torch.testing.assert_close(actual, expected, **TOLERANCE[case["dtype"]])

    if case["affine"]:  # torch's fuser needs bn.weight and bn.bias
        reference = fuse_linear_bn_eval(copy.deepcopy(linear).eval(), bn)
        assert torch.equal(fused.weight, reference.weight)
        # torch leaves a (1,)-shaped bias for a one-channel bn after a bias-free linear
        assert torch.equal(fused.bias, reference.bias.expand(case["out_features"]))
    assert_unchanged(before, linear, bn)


# ------------------------------------------------------------------ errors


def _bn2d(**kwargs: Any) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(4, **kwargs).eval()
    if bn.running_mean is not None:
        randomize_bn(bn)
    return bn


def _lazy_conv() -> nn.Module:
    return nn.LazyConv2d(4, 3)


def _hooked_conv() -> nn.Module:
    conv = nn.Conv2d(3, 4, 3)
    conv.register_forward_hook(lambda module, args, out: None)
    return conv


def _parametrized_conv() -> nn.Module:
    return nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 4, 3))


CONV_ERRORS = [
    pytest.param(lambda: nn.Conv2d(3, 4, 3), lambda: nn.BatchNorm2d(4).train(), "in training mode", id="bn-training"),
    pytest.param(
        lambda: nn.Conv2d(3, 4, 3),
        lambda: _bn2d(track_running_stats=False),
        "without running statistics (it was built with track_running_stats=False",
        id="no-running-stats",
    ),
    pytest.param(
        lambda: nn.Conv2d(3, 5, 3),
        _bn2d,
        "the batch norm has num_features=4 but the convolution has out_channels=5",
        id="channels",
    ),
    pytest.param(
        lambda: nn.Linear(3, 4),
        _bn2d,
        "fold_conv_bn expects a Conv1d/2d/3d or ConvTranspose1d/2d/3d as its first module, got Linear",
        id="not-a-conv",
    ),
    pytest.param(
        lambda: nn.Conv2d(3, 4, 3),
        lambda: nn.LayerNorm(4),
        "fold_conv_bn expects a BatchNorm1d/2d/3d as its second module, got LayerNorm",
        id="not-a-bn",
    ),
    pytest.param(
        lambda: nn.Conv2d(3, 4, 3),
        lambda: nn.BatchNorm1d(4).eval(),
        "their dimensionalities differ (1d batch norm after a 2d convolution)",
        id="dims",
    ),
    pytest.param(lambda: nn.Conv2d(3, 4, 3), lambda: _bn2d().to("meta"), "on different devices", id="devices"),
    pytest.param(_lazy_conv, _bn2d, "lazy module that has not been initialised", id="lazy"),
    pytest.param(_hooked_conv, _bn2d, "has registered hooks (forward_hooks)", id="hooks"),
    pytest.param(_parametrized_conv, _bn2d, "has parametrizations", id="parametrized"),
    pytest.param(lambda: "conv", _bn2d, "got str", id="not-a-module"),
]


@pytest.mark.parametrize("make_conv, make_bn, message", CONV_ERRORS)
def test_fold_conv_bn_refusals(make_conv, make_bn, message: str) -> None:
    conv, bn = make_conv(), make_bn()
    modules = [m for m in (conv, bn) if isinstance(m, nn.Module)]
    before = snapshot(*modules)
    with pytest.raises(BuilderError) as info:
        fold_conv_bn(conv, bn)
    assert message in str(info.value)
    assert_unchanged(before, *modules)


LINEAR_ERRORS = [
    pytest.param(lambda: nn.Linear(3, 4), lambda: nn.BatchNorm1d(4).train(), "in training mode", id="bn-training"),
    pytest.param(
        lambda: nn.Linear(3, 4),
        lambda: nn.BatchNorm1d(4, track_running_stats=False).eval(),
        "without running statistics",
        id="no-running-stats",
    ),
    pytest.param(
        lambda: nn.Linear(3, 5),
        lambda: nn.BatchNorm1d(4).eval(),
        "the batch norm has num_features=4 but the linear has out_features=5 "
        "(they must be equal, or num_features must be 1)",
        id="features",
    ),
    pytest.param(
        lambda: nn.Conv1d(3, 4, 1),
        lambda: nn.BatchNorm1d(4).eval(),
        "fold_linear_bn expects an nn.Linear as its first module, got Conv1d",
        id="not-a-linear",
    ),
    pytest.param(
        lambda: nn.Linear(3, 4),
        lambda: nn.BatchNorm2d(4).eval(),
        "fold_linear_bn expects a BatchNorm1d as its second module, got BatchNorm2d",
        id="not-a-bn1d",
    ),
    pytest.param(lambda: nn.LazyLinear(4), lambda: nn.BatchNorm1d(4).eval(), "lazy module", id="lazy"),
    pytest.param(
        lambda: nn.Linear(3, 4), lambda: nn.BatchNorm1d(4).eval().to("meta"), "on different devices", id="devices"
    ),
]


@pytest.mark.parametrize("make_linear, make_bn, message", LINEAR_ERRORS)
def test_fold_linear_bn_refusals(make_linear, make_bn, message: str) -> None:
    linear, bn = make_linear(), make_bn()
    before = snapshot(linear, bn)
    with pytest.raises(BuilderError) as info:
        fold_linear_bn(linear, bn)
    assert message in str(info.value)
    assert_unchanged(before, linear, bn)


def test_builder_error_is_a_value_error_and_an_fxrules_error() -> None:
    assert issubclass(BuilderError, ValueError)
    assert issubclass(BuilderError, FxrulesError)


# ---------------------------------------------------------------- registry


def test_builders_table_lists_the_public_builders() -> None:
    assert BUILDERS == {"fold_conv_bn": fold_conv_bn, "fold_linear_bn": fold_linear_bn,
                        "fuse_conv_relu": builders.fuse_conv_relu, "fuse_conv_bn_relu": builders.fuse_conv_bn_relu,
                        "fuse_linear_relu": builders.fuse_linear_relu, "fuse_bn_relu": builders.fuse_bn_relu}
    for name, function in BUILDERS.items():
        assert getattr(builders, name) is function
        assert function.__doc__
    assert set(BUILDERS) <= set(builders.__all__)


def test_module_docstring_states_the_builder_contract() -> None:
    doc = builders.__doc__ or ""
    for phrase in ("in the order the", "new", "never changes its inputs", "BuilderError"):
        assert phrase in doc


# ----------------------------------------------------------- fold_conv_bn_tensors


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("conv_bias", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_fold_conv_bn_tensors_equals_the_module_fold(dims, conv_bias, affine):
    """The tensor form gives fold_conv_bn's parameters bit for bit, and the aten conv with them
    computes batch_norm(conv(x)), as the aten ops a torch.export graph holds."""
    with torch.random.fork_rng():
        torch.manual_seed(dims * 4 + 2 * conv_bias + affine)
        conv = CONVS[dims](3, 5, 3, padding=1, bias=conv_bias).eval()
        bn = BATCH_NORMS[dims](5, affine=affine).eval()
        randomize_bn(bn)
        if affine:
            with torch.no_grad():
                bn.weight.uniform_(0.5, 2.0)
                bn.bias.uniform_(-1.0, 1.0)
        x = torch.randn(2, 3, *([6] * dims))
    before = {k: v.clone() for k, v in (*conv.state_dict().items(), *bn.state_dict().items())}
    weight, bias = builders.fold_conv_bn_tensors(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                                 bn.weight, bn.bias)
    module = fold_conv_bn(conv, bn)
    assert torch.equal(weight, module.weight) and torch.equal(bias, module.bias)
    assert isinstance(weight, nn.Parameter) and weight.requires_grad and bias.requires_grad
    conv_op = {1: torch.ops.aten.conv1d.default, 2: torch.ops.aten.conv2d.default, 3: torch.ops.aten.conv3d.default}[dims]
    with torch.no_grad():
        expected = torch.ops.aten.batch_norm.default(conv_op(x, conv.weight, conv.bias, [1] * dims, [1] * dims),
                                                     bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                                     False, 0.1, bn.eps, False)
        folded = conv_op(x, weight, bias, [1] * dims, [1] * dims)
    torch.testing.assert_close(folded, expected, **TOLERANCE[torch.float32])
    after = {k: v for k, v in (*conv.state_dict().items(), *bn.state_dict().items())}
    assert all(torch.equal(before[k], after[k]) for k in before), "an input tensor was modified"
    inputs = [t for t in (conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias) if t is not None]
    pointers = {t.untyped_storage().data_ptr() for t in inputs}
    assert weight.untyped_storage().data_ptr() not in pointers and bias.untyped_storage().data_ptr() not in pointers


def test_fold_conv_bn_tensors_keeps_dtype_and_requires_grad():
    conv = nn.Conv2d(2, 4, 1, bias=False).double().requires_grad_(False)
    bn = nn.BatchNorm2d(4, affine=False).double().eval()
    randomize_bn(bn)
    weight, bias = builders.fold_conv_bn_tensors(conv.weight, None, bn.running_mean, bn.running_var, bn.eps)
    assert weight.dtype == bias.dtype == torch.float64
    assert not weight.requires_grad and not bias.requires_grad
    assert bias.shape == (4,)
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.conv2d(x, weight, bias), bn(conv(x)), **TOLERANCE[torch.float64])


def test_fold_conv_bn_tensors_transposed():
    conv = nn.ConvTranspose2d(3, 5, 2).eval()
    bn = nn.BatchNorm2d(5).eval()
    randomize_bn(bn)
    weight, bias = builders.fold_conv_bn_tensors(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                                 bn.weight, bn.bias, transposed=True)
    module = fold_conv_bn(conv, bn)
    assert torch.equal(weight, module.weight) and torch.equal(bias, module.bias)


@pytest.mark.parametrize("change, message", [
    (dict(weight="w"), "weight must be a tensor, got str"),
    (dict(running_var=None), "running_var must be a tensor, got NoneType"),
    (dict(eps=0.0), "eps must be a positive number, got 0.0"),
    (dict(eps=True), "eps must be a positive number, got True"),
    (dict(weight=torch.zeros(4, 3)), "a convolution weight has at least 3 dims, got shape (4, 3)"),
    (dict(running_mean=torch.zeros(5)), "running_mean has shape (5,), but the convolution has 4 output channels"),
    (dict(bn_bias=torch.zeros(4, 1)), "bn_bias has shape (4, 1), but the convolution has 4 output channels"),
], ids=["weight-not-tensor", "no-running-var", "eps-zero", "eps-bool", "weight-rank", "mean-shape", "beta-shape"])
def test_fold_conv_bn_tensors_refuses_bad_input(change, message):
    arguments = dict(weight=torch.randn(4, 3, 3, 3), bias=torch.randn(4), running_mean=torch.zeros(4),
                     running_var=torch.ones(4), eps=1e-5, bn_weight=torch.ones(4), bn_bias=torch.zeros(4))
    arguments.update(change)
    with pytest.raises(BuilderError) as info:
        builders.fold_conv_bn_tensors(**arguments)
    assert message in str(info.value)


@pytest.mark.parametrize("make", [
    lambda: nn.Conv1d(3, 4, 3), lambda: nn.Conv2d(2, 6, (3, 1), stride=2, padding="valid", bias=False),
    lambda: nn.Conv3d(2, 2, 1, groups=2, padding_mode="reflect"), lambda: nn.ConvTranspose2d(4, 2, 3, output_padding=1, stride=2),
    lambda: nn.Linear(5, 3), lambda: nn.Linear(5, 3, bias=False),
])
def test_the_fold_copy_is_a_deep_copy_but_for_the_replaced_tensors(make) -> None:
    """``builders._copy`` makes what ``copy.deepcopy`` makes (same state, nothing shared with the
    original) except that the weight and bias, replaced by every fold, are not copied."""
    module = make()
    module.extra = [1, {"a": torch.ones(2)}]  # a mutable attribute must be copied, not shared
    object.__setattr__(module, "me", module)  # a reference to itself becomes one to the copy
    ours, theirs = builders._copy(module), copy.deepcopy(module)
    assert type(ours) is type(theirs) is type(module)
    assert ours.weight is module.weight
    assert ours._parameters is not module._parameters
    assert ours.me is ours and theirs.me is theirs
    assert set(vars(ours)) == set(vars(theirs))
    for key, value in vars(theirs).items():
        mine = vars(ours)[key]
        assert type(mine) is type(value), key
        if key in ("_parameters", "me"):
            continue
        if isinstance(value, (dict, list, set)):
            assert mine is not vars(module)[key], key
        assert repr(mine) == repr(value), key
    assert ours.extra[1]["a"] is not module.extra[1]["a"]
    x = torch.randn(2, 5) if isinstance(module, nn.Linear) else None
    if x is not None:
        assert torch.equal(ours(x), module(x))
    ours.weight = nn.Parameter(torch.zeros_like(module.weight))
    assert not torch.equal(module.weight, ours.weight)  # replacing the copy's weight leaves the original's


# -- the finiteness check, asked once for a fold's small tensors (builders._all_finite) ---------------

_BAD = (float("inf"), float("-inf"), float("nan"))


@pytest.mark.parametrize("bad", _BAD)
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 4, (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                                    (torch.bfloat16,) * 4])
def test_the_finiteness_check_finds_a_bad_value_in_any_tensor_and_names_the_first(bad, dtypes):
    for where in range(len(dtypes)):
        tensors = [torch.randn(3, 2, dtype=dtype) for dtype in dtypes]
        assert builders._all_finite(tensors)
        tensors[where].view(-1)[4] = bad
        assert not builders._all_finite(tensors)
        named = {f"t{i}": t for i, t in enumerate(tensors)}
        with pytest.raises(BuilderError, match=f"t{where} is not finite"):
            builders._check_finite("x into y", named)
        tensors[-1].view(-1)[0] = float("nan")  # a later one too: the first is named
        with pytest.raises(BuilderError, match=f"t{where} is not finite"):
            builders._check_finite("x into y", {f"t{i}": t for i, t in enumerate(tensors)})


def test_the_finiteness_check_keeps_every_finite_value_finite_across_dtypes():
    """Concatenated, the values take a dtype that holds each exactly: 3e38 in bfloat16 beside float16
    values is finite (float16 would make it inf), and so is 1e300 in float64 beside float32."""
    assert builders._all_finite([torch.ones(3, dtype=torch.float16), torch.full((2,), 3e38, dtype=torch.bfloat16)])
    assert builders._all_finite([torch.ones(3, dtype=torch.float32), torch.full((2,), 1e300, dtype=torch.float64)])
    assert builders._all_finite([torch.full((2,), 60000.0, dtype=torch.float16), torch.ones(2, dtype=torch.bfloat16)])
    assert not builders._all_finite([torch.ones(3, dtype=torch.float16), torch.full((2,), float("inf"),
                                                                                    dtype=torch.bfloat16)])


def test_the_finiteness_check_of_large_tensors_is_asked_one_by_one(monkeypatch):
    big = torch.zeros(builders._FUSED_CHECK_MAX_VALUES + 1)
    small = torch.zeros(3)
    asked: list = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: asked.append(t.numel()) or real(t))
    assert builders._all_finite([big, small]) and asked == [big.numel(), 3]
    asked.clear()
    assert builders._all_finite([small, small]) and asked == [6]  # one call for both
    big[-1] = float("nan")
    asked.clear()
    assert not builders._all_finite([small, big])
    asked.clear()
    assert builders._all_finite([]) and builders._all_finite([small]) and asked == [3]


def test_folds_with_a_non_finite_parameter_decline_naming_it():
    conv, bn = nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4).eval()
    for tensor, name in ((conv.bias, "the convolution's bias"), (bn.running_var, "the running variance"),
                         (bn.weight, "the batch norm's weight")):
        with torch.no_grad():
            saved = tensor.clone()
            tensor[1] = float("nan")
        with pytest.raises(BuilderError, match=f"{name} is not finite"):
            fold_conv_bn(conv, bn)
        with torch.no_grad():
            tensor.copy_(saved)
    with torch.no_grad():
        bn.weight[2] = 3e38  # finite, but the folded weight overflows float32
        conv.weight.fill_(10.0)
    with pytest.raises(BuilderError, match="the folded weight is not finite"):
        fold_conv_bn(conv, bn)
