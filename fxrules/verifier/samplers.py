"""The sampler catalogue: how to draw valid arguments for an op, so verification can build host graphs.

A :class:`Catalogue` maps call targets (functions and aten overloads, Tensor method
names, ``nn.Module`` classes) to samplers. A function or method sampler is a list of
:class:`Param` in call order, each with a *kind* that says how to draw a value for it
when the rule's pattern leaves it open (a capture, ``_`` or ``...``). A module
sampler says what input a module of that type takes and how to construct one, with
its parameters and buffers drawn too (never left at their initial values, which can
hide a wrong rule: a BatchNorm with running_mean 0 and running_var 1 is the identity).

The catalogue is an ordinary object built by :func:`default_catalogue`; nothing is
registered as an import side effect. Extend a copy for your own ops::

    catalogue = fxrules.verifier.samplers.default_catalogue()
    catalogue.add_function(my_pkg.ops.swish, Param("input", "tensor"))
    catalogue.add_module(my_pkg.Block, ModuleSampler(input_rank=(3, 3), build=make_block))
    fxrules.verify(rules, catalogue=catalogue)

Kinds (``of`` names the tensor parameter a kind depends on):

=================  ============================================================
``tensor``         a tensor of the host's dtype; rank between ``min_rank`` and ``max_rank``
``tensor_like``    a tensor broadcastable with ``of`` (same shape, a suffix, or a scalar)
``number``         a Python number (0, 1, -1, 0.5, 2 or a random one)
``dim``            a dimension of ``of`` (negative or not)
``dim_or_none``    a dimension of ``of``, or None
``dims``           a list of distinct dimensions of ``of``
``perm``           a permutation of ``of``'s dimensions (as a list)
``shape``          a shape with as many elements as ``of`` (may contain -1)
``prob``           a probability in [0, 1)
``bool``           True or False
``positive``       a small positive float (an epsilon, a slope ...)
``matmul_rhs``     a tensor whose first dimension (after batching) fits ``of``'s last
``tensor_list``    a list of 1-3 tensors of ``of``'s shape (for cat/stack)
``gelu_approx``    "none" or "tanh"
``tensor_partner`` like ``tensor_like`` but never a Python number (``torch.maximum`` takes tensors)
``matrix_rhs``     a 2-D tensor ``[k, n]`` for ``of`` of shape ``[m, k]`` (``mm``)
``bmm_rhs``        a 3-D tensor ``[b, k, n]`` for ``of`` of shape ``[b, m, k]`` (``bmm``)
``mask``           a bool tensor broadcastable with ``of`` (``masked_fill``, ``where``)
``dtype``          a dtype to convert to (``Tensor.to``)
``index_or_none``  a slice bound: a small int (negative or not) or None
``step``           a slice step: 1 or 2
``false``          False (a flag the CPU accepts only so: ``_softmax``'s ``half_to_float``)
``end_dim``        a dim of ``of`` at or after the ``start_dim`` drawn before it (``flatten``)
``conv_weight``    a convolution weight ``[out, in/groups, k...]`` for ``of`` (N, C, spatial...)
``conv_bias``      a bias ``[out]`` for the weight ``of``, or None
``stride``         a list of 1s and 2s, one per spatial dim of ``of``
``padding``        a list of 0s and 1s, one per spatial dim of ``of``
``dilation``       a list of 1s and 2s, one per spatial dim of ``of``
``groups``         the groups that make the weight ``of`` fit the input (``in / weight.shape[1]``)
``channels``       a vector of ``of``'s channel count (``of.shape[1]``): running means ...
``channels_or_none``  the same, or None (batch norm's optional weight and bias)
``variance``       a positive vector of ``of``'s channel count (running variances)
``addmm_mat1``     ``[m, k]`` fitting ``of`` (addmm's input, ``[n]`` or ``[m, n]``)
``addmm_mat2``     ``[k, n]`` fitting ``of`` (the ``mat1``) and addmm's input
``length``         a small positive int, a length (``randperm``'s ``n``): 1 to 5, the sizes hosts draw
``index``          an int64 input of distinct row indices into ``of`` along the ``dim`` drawn before it
``index_list``     a list of one ``index`` (``aten.index.Tensor``'s indices)
``index_source``   ``self``'s shape with the ``dim`` drawn before it as long as the index ``of`` (``index_add``)
=================  ============================================================

A tensor a kind draws is sometimes a model input and sometimes a parameter (trainable or
frozen) or buffer of the host (:mod:`fxrules.verifier.hosts` says how often).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from fxrules.engine import fxaccess

KINDS = frozenset({
    "tensor", "tensor_like", "number", "dim", "dim_or_none", "dims", "perm", "shape", "prob", "bool", "positive",
    "matmul_rhs", "tensor_list", "gelu_approx", "tensor_partner", "matrix_rhs", "bmm_rhs", "mask", "dtype",
    "index_or_none", "step", "false", "end_dim", "conv_weight", "conv_bias", "stride", "padding", "dilation",
    "groups", "channels", "channels_or_none", "variance", "addmm_mat1", "addmm_mat2", "length",
    "index", "index_list", "index_source",
})
TENSOR_KINDS = frozenset({
    "tensor", "tensor_like", "tensor_partner", "matmul_rhs", "matrix_rhs", "bmm_rhs", "mask", "conv_weight",
    "conv_bias", "channels", "channels_or_none", "variance", "addmm_mat1", "addmm_mat2",
})
"""The kinds that draw a tensor (which a host may hold as an input, a parameter or a buffer)."""


@dataclass(frozen=True)
class Param:
    """One parameter of an op: its name (as the signature spells it), kind, and what it depends on.

    ``optional``: the parameter has a default, so it is left out unless the pattern names it.
    ``var``: it takes the remaining positional arguments (``x.permute(1, 0)``, ``x.view(2, -1)``).
    """

    name: str
    kind: str
    of: Optional[str] = None
    optional: bool = False
    var: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown sampler kind {self.kind!r}; one of {sorted(KINDS)}")


@dataclass(frozen=True)
class OpSampler:
    """How to call a function or method: its parameters in order; rank bounds for its first tensor."""

    params: tuple[Param, ...]
    min_rank: int = 0
    max_rank: int = 4
    floating_only: bool = True  # the op needs floating inputs (most do); else ints work too
    at_least_one: tuple[str, ...] = ()  # optional parameters of which a call must pass one (clamp's min/max)


@dataclass(frozen=True)
class ModuleSampler:
    """How to construct a module: the rank of its input, and ``build(draw, x, overrides) -> module``.

    ``build`` receives hypothesis' ``draw``, the concrete input tensor (so channels and
    features fit it) and the constructor values the pattern fixes (``Dropout{p=0.0}``).
    It returns the module with drawn parameters and buffers, or None when the input does
    not suit the module (the host is then discarded).
    """

    input_rank: tuple[int, int]
    build: Callable[..., Optional[nn.Module]]


@dataclass
class Catalogue:
    """Samplers by target. ``functions`` keys are callables (functions, aten overloads); ``methods``
    are Tensor method names; ``modules`` are module classes (looked up along the MRO)."""

    functions: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    modules: dict = field(default_factory=dict)

    def add_function(self, target: Any, *params: Param, min_rank: int = 0, max_rank: int = 4,
                     floating_only: bool = True, at_least_one: tuple[str, ...] = ()) -> None:
        self.functions[target] = OpSampler(tuple(params), min_rank, max_rank, floating_only, at_least_one)

    def add_method(self, name: str, *params: Param, min_rank: int = 0, max_rank: int = 4,
                   floating_only: bool = True, at_least_one: tuple[str, ...] = ()) -> None:
        self.methods[name] = OpSampler(tuple(params), min_rank, max_rank, floating_only, at_least_one)

    def add_module(self, cls: type, sampler: ModuleSampler) -> None:
        self.modules[cls] = sampler

    def function(self, target: Any) -> Optional[OpSampler]:
        try:
            return self.functions.get(target)
        except TypeError:  # unhashable target
            return None

    def method(self, name: str) -> Optional[OpSampler]:
        return self.methods.get(name)

    def module(self, cls: type) -> Optional[ModuleSampler]:
        """The sampler of ``cls`` or of its nearest base class that has one (a pattern naming a
        subclass of ``nn.Linear`` is drawn as a Linear turned into that subclass: see
        :func:`fxrules.verifier.hosts.HostGraphWriter.module_call`)."""
        for base in getattr(cls, "__mro__", ()):
            if base in self.modules:
                return self.modules[base]
        return None

    def copy(self) -> "Catalogue":
        return Catalogue(dict(self.functions), dict(self.methods), dict(self.modules))


# ---------------------------------------------------------------------------
# Module builders
# ---------------------------------------------------------------------------

def _st():
    from hypothesis import strategies as st

    return st


def _randomize(draw, module: nn.Module) -> nn.Module:
    """Draw every parameter and floating buffer (never the initial values)."""
    st = _st()
    seed = draw(st.integers(0, 2**31 - 1), label="parameter seed")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters(recurse=False):
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64).to(param.dtype) * 0.5)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is None or not buffer.dtype.is_floating_point:
                continue
            values = torch.randn(buffer.shape, generator=generator, dtype=torch.float64)
            if "var" in name:  # variances are positive
                values = values.abs() * 2 + 0.1
            buffer.copy_(values.to(buffer.dtype))
    return module


def _fixed(overrides: dict, name: str, strategy, draw):
    return overrides[name] if name in overrides else draw(strategy, label=name)


def _elementwise_module(cls: type, **drawn: Callable) -> ModuleSampler:
    """A module that takes any tensor and whose constructor arguments are drawn independently."""

    def build(draw, x, overrides):
        kwargs = {name: _fixed(overrides, name, make(), draw) for name, make in drawn.items()}
        kwargs.update({k: v for k, v in overrides.items() if k not in kwargs})
        return _randomize(draw, cls(**kwargs))

    return ModuleSampler((1, 4), build)


def _dropout(cls: type) -> ModuleSampler:
    return _elementwise_module(cls, p=lambda: _st().sampled_from([0.0, 0.1, 0.5, 0.9]))


def _linear(draw, x, overrides):
    st = _st()
    in_features = x.shape[-1]
    out_features = _fixed(overrides, "out_features", st.integers(1, 6), draw)
    bias = _fixed(overrides, "bias", st.booleans(), draw)
    if overrides.get("in_features", in_features) != in_features:
        return None
    return _randomize(draw, nn.Linear(in_features, out_features, bias=bias))


def _conv(cls: type, spatial: int, transposed: bool = False) -> ModuleSampler:
    def build(draw, x, overrides):
        st = _st()
        if x.ndim != spatial + 2:
            return None
        channels = x.shape[1]
        size = min(x.shape[2:])
        groups = _fixed(overrides, "groups", st.sampled_from([g for g in (1, 2) if channels % g == 0]), draw)
        if channels % groups:
            return None
        out = _fixed(overrides, "out_channels", st.integers(1, 4).map(lambda k: k * groups), draw)
        if out % groups:
            return None
        kernel = _fixed(overrides, "kernel_size", st.integers(1, max(1, min(3, size))), draw)
        stride = _fixed(overrides, "stride", st.integers(1, 2), draw)
        dilation = _fixed(overrides, "dilation", st.integers(1, 2) if size >= 3 else st.just(1), draw)
        padding = _fixed(overrides, "padding", st.integers(0, 1), draw)
        bias = _fixed(overrides, "bias", st.booleans(), draw)
        kwargs = dict(in_channels=channels, out_channels=out, kernel_size=kernel, stride=stride, padding=padding,
                      dilation=dilation, groups=groups, bias=bias)
        if not transposed:
            kwargs["padding_mode"] = overrides.get("padding_mode", "zeros")
        try:
            module = cls(**kwargs)
            module(x.detach().to(next(module.parameters()).dtype))
        except (RuntimeError, ValueError):
            return None
        return _randomize(draw, module)

    return ModuleSampler((spatial + 2, spatial + 2), build)


def _batch_norm(cls: type, ranks: tuple[int, int]) -> ModuleSampler:
    def build(draw, x, overrides):
        st = _st()
        if not ranks[0] <= x.ndim <= ranks[1]:
            return None
        features = x.shape[1]
        if overrides.get("num_features", features) != features:
            return None
        eps = _fixed(overrides, "eps", st.sampled_from([1e-5, 1e-3, 0.1, 0.5]), draw)
        momentum = _fixed(overrides, "momentum", st.sampled_from([0.1, 0.5]), draw)
        affine = _fixed(overrides, "affine", st.booleans(), draw)
        track = _fixed(overrides, "track_running_stats", st.just(True), draw)
        return _randomize(draw, cls(features, eps=eps, momentum=momentum, affine=affine, track_running_stats=track))

    return ModuleSampler(ranks, build)


def _layer_norm(draw, x, overrides):
    st = _st()
    last = _fixed(overrides, "elementwise_affine", st.booleans(), draw)
    eps = _fixed(overrides, "eps", st.sampled_from([1e-5, 1e-3, 0.1]), draw)
    return _randomize(draw, nn.LayerNorm(x.shape[-1], eps=eps, elementwise_affine=last))


def _flatten(draw, x, overrides):
    st = _st()
    start = _fixed(overrides, "start_dim", st.integers(0, max(0, x.ndim - 1)), draw)
    end = _fixed(overrides, "end_dim", st.sampled_from([-1, max(0, x.ndim - 1)]), draw)
    return nn.Flatten(start, end)


def _softmax(cls: type) -> ModuleSampler:
    def build(draw, x, overrides):
        dim = _fixed(overrides, "dim", _st().integers(-x.ndim, x.ndim - 1), draw) if x.ndim else 0
        return cls(dim=dim)

    return ModuleSampler((1, 4), build)


def _pool(cls: type, spatial: int) -> ModuleSampler:
    def build(draw, x, overrides):
        st = _st()
        if x.ndim != spatial + 2:
            return None
        size = min(x.shape[2:])
        kernel = _fixed(overrides, "kernel_size", st.integers(1, max(1, min(3, size))), draw)
        stride = _fixed(overrides, "stride", st.sampled_from([None, 1, 2]), draw)
        return cls(kernel, stride=stride)

    return ModuleSampler((spatial + 2, spatial + 2), build)


def _adaptive_pool(cls: type, spatial: int) -> ModuleSampler:
    def build(draw, x, overrides):
        if x.ndim != spatial + 2:
            return None
        return cls(_fixed(overrides, "output_size", _st().integers(1, 3), draw))

    return ModuleSampler((spatial + 2, spatial + 2), build)


def _group_norm(draw, x, overrides):
    if x.ndim < 2:
        return None
    channels = x.shape[1]
    groups = _fixed(overrides, "num_groups", _st().sampled_from([g for g in (1, 2, channels) if channels % g == 0]),
                    draw)
    if channels % groups:
        return None
    return _randomize(draw, nn.GroupNorm(groups, channels, affine=_fixed(overrides, "affine", _st().booleans(), draw)))


# ---------------------------------------------------------------------------
# The default catalogue
# ---------------------------------------------------------------------------

_UNARY = (
    "relu", "sigmoid", "tanh", "exp", "neg", "abs", "sin", "cos", "sqrt", "rsqrt", "log", "erf", "reciprocal",
    "square", "floor", "ceil", "round", "sign", "clone", "detach", "exp2", "expm1", "log1p", "trunc", "frac",
    "relu_", "sigmoid_", "tanh_", "neg_", "abs_", "exp_", "positive", "logical_not", "isnan", "isfinite", "conj",
)
_F_UNARY = ("relu", "relu6", "sigmoid", "tanh", "silu", "mish", "hardswish", "hardsigmoid", "elu", "selu",
            "softplus", "logsigmoid", "tanhshrink", "softsign", "gelu", "leaky_relu")
_BINARY_OPERATOR = ("add", "sub", "mul", "truediv", "pow", "iadd", "isub", "imul", "itruediv")
_BINARY_TORCH = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "true_divide", "multiply", "subtract")


def default_catalogue() -> Catalogue:
    """The bundled samplers: common torch / torch.nn.functional / Tensor ops, aten ops and nn modules."""
    cat = Catalogue()
    x = Param("input", "tensor")
    aten = torch.ops.aten

    for name in _UNARY:
        function = getattr(torch, name, None)
        if function is not None:
            cat.add_function(function, x)
        cat.add_method(name, Param("self", "tensor"))
        overload = getattr(getattr(aten, name, None), "default", None)
        if overload is not None:
            cat.add_function(overload, Param("self", "tensor"))
    for name in _F_UNARY:
        cat.add_function(getattr(F, name), x, Param("inplace", "bool", optional=True)) \
            if name in ("relu", "relu6", "elu", "selu", "hardswish", "hardsigmoid", "silu", "mish") else \
            cat.add_function(getattr(F, name), x)
    cat.add_function(F.gelu, x, Param("approximate", "gelu_approx", optional=True))
    cat.add_function(F.leaky_relu, x, Param("negative_slope", "positive", optional=True),
                     Param("inplace", "bool", optional=True))
    cat.add_method("contiguous", Param("self", "tensor"))
    cat.add_method("float", Param("self", "tensor"), floating_only=False)
    cat.add_method("double", Param("self", "tensor"), floating_only=False)

    for name in _BINARY_OPERATOR:
        cat.add_function(getattr(operator, name), Param("a", "tensor"), Param("b", "tensor_like", of="a"))
    cat.add_function(operator.neg, Param("a", "tensor"))
    cat.add_function(operator.pos, Param("a", "tensor"))
    cat.add_function(operator.matmul, Param("a", "tensor"), Param("b", "matmul_rhs", of="a"), min_rank=1)
    for name in _BINARY_TORCH:
        function = getattr(torch, name)
        cat.add_function(function, x, Param("other", "tensor_like", of="input"))
        cat.add_method(name, Param("self", "tensor"), Param("other", "tensor_like", of="self"))
    for name in ("add", "sub", "mul", "div"):
        cat.add_function(getattr(aten, name).Tensor, Param("self", "tensor"), Param("other", "tensor_like", of="self"))
        cat.add_function(getattr(aten, name).Scalar, Param("self", "tensor"), Param("other", "number"))

    # shapes and layouts
    cat.add_function(torch.transpose, x, Param("dim0", "dim", of="input"), Param("dim1", "dim", of="input"), min_rank=1)
    cat.add_method("transpose", Param("self", "tensor"), Param("dim0", "dim", of="self"),
                   Param("dim1", "dim", of="self"), min_rank=1)
    cat.add_function(aten.transpose.int, Param("self", "tensor"), Param("dim0", "dim", of="self"),
                     Param("dim1", "dim", of="self"), min_rank=1)
    cat.add_function(torch.t, x, max_rank=2)
    cat.add_method("t", Param("self", "tensor"), max_rank=2)
    cat.add_function(aten.t.default, Param("self", "tensor"), max_rank=2)
    cat.add_function(torch.permute, x, Param("dims", "perm", of="input"))
    cat.add_method("permute", Param("self", "tensor"), Param("dims", "perm", of="self", var=True))
    cat.add_function(aten.permute.default, Param("self", "tensor"), Param("dims", "perm", of="self"))
    cat.add_function(torch.reshape, x, Param("shape", "shape", of="input"))
    cat.add_method("reshape", Param("self", "tensor"), Param("shape", "shape", of="self", var=True))
    cat.add_method("view", Param("self", "tensor"), Param("size", "shape", of="self", var=True))
    cat.add_function(aten.view.default, Param("self", "tensor"), Param("size", "shape", of="self"))
    cat.add_function(aten.reshape.default, Param("self", "tensor"), Param("shape", "shape", of="self"))
    cat.add_function(aten._unsafe_view.default, Param("self", "tensor"), Param("size", "shape", of="self"))
    cat.add_function(torch.flatten, x, Param("start_dim", "dim", of="input", optional=True),
                     Param("end_dim", "end_dim", of="input", optional=True))
    cat.add_method("flatten", Param("self", "tensor"), Param("start_dim", "dim", of="self", optional=True),
                   Param("end_dim", "end_dim", of="self", optional=True))
    cat.add_function(torch.squeeze, x, Param("dim", "dim", of="input", optional=True))
    cat.add_function(torch.unsqueeze, x, Param("dim", "dim", of="input"))
    cat.add_method("unsqueeze", Param("self", "tensor"), Param("dim", "dim", of="self"))
    cat.add_method("squeeze", Param("self", "tensor"), Param("dim", "dim", of="self", optional=True))
    cat.add_function(aten.clone.default, Param("self", "tensor"))
    cat.add_function(aten.alias.default, Param("self", "tensor"))
    cat.add_function(aten.detach.default, Param("self", "tensor"))
    # what torch.export reads a constant written in forward as: detach_(lift_fresh_copy(c))
    cat.add_function(aten.lift_fresh_copy.default, Param("self", "tensor"))
    cat.add_function(aten.detach_.default, Param("self", "tensor"))
    cat.add_function(torch.cat, Param("tensors", "tensor_list", of=None), Param("dim", "dim", of="tensors",
                                                                                  optional=True), min_rank=1)

    # reductions and normalisations
    for name in ("sum", "mean", "amax", "amin"):
        cat.add_function(getattr(torch, name), x, Param("dim", "dim", of="input", optional=True),
                         Param("keepdim", "bool", optional=True), min_rank=1)
        cat.add_method(name, Param("self", "tensor"), Param("dim", "dim", of="self", optional=True),
                       Param("keepdim", "bool", optional=True), min_rank=1)
    for function in (torch.softmax, F.softmax, torch.log_softmax, F.log_softmax):
        cat.add_function(function, x, Param("dim", "dim", of="input"), min_rank=1)
    cat.add_method("softmax", Param("self", "tensor"), Param("dim", "dim", of="self"), min_rank=1)
    cat.add_function(aten._softmax.default, Param("self", "tensor"), Param("dim", "dim", of="self"),
                     Param("half_to_float", "false"), min_rank=1)
    # attention's spellings (fxrules/library/fuse/attention.fxr): export's softmax and casts
    cat.add_function(aten.softmax.int, Param("self", "tensor"), Param("dim", "dim", of="self"), min_rank=1)
    cat.add_function(aten.to.dtype, Param("self", "tensor"), Param("dtype", "dtype"), floating_only=False)
    cat.add_method("type", Param("self", "tensor"), Param("dtype", "dtype"), floating_only=False)
    cat.add_function(F.dropout, x, Param("p", "prob", optional=True), Param("training", "bool", optional=True),
                     Param("inplace", "bool", optional=True))
    for function in (F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout):
        rank = {F.dropout1d: (2, 3), F.dropout2d: (3, 4), F.dropout3d: (4, 5)}.get(function, (1, 4))
        cat.add_function(function, x, Param("p", "prob", optional=True), Param("training", "bool", optional=True),
                         Param("inplace", "bool", optional=True), min_rank=rank[0], max_rank=rank[1])
    cat.add_function(torch.dropout, x, Param("p", "prob"), Param("train", "bool"))
    for name in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"):
        rank = (2, 4) if name.startswith("feature") else (1, 4)
        cat.add_function(getattr(aten, name).default, Param("input", "tensor"), Param("p", "prob"),
                         Param("train", "bool"), min_rank=rank[0], max_rank=rank[1])
    cat.add_function(aten.flatten.using_ints, Param("self", "tensor"),
                     Param("start_dim", "dim", of="self", optional=True), Param("end_dim", "end_dim", of="self",
                                                                                 optional=True))
    cat.add_function(torch.matmul, x, Param("other", "matmul_rhs", of="input"), min_rank=1)
    cat.add_method("matmul", Param("self", "tensor"), Param("other", "matmul_rhs", of="self"), min_rank=1)
    cat.add_function(aten.matmul.default, Param("self", "tensor"), Param("other", "matmul_rhs", of="self"),
                     min_rank=1)
    cat.add_function(torch.mm, x, Param("mat2", "matrix_rhs", of="input"), min_rank=2, max_rank=2)
    cat.add_method("mm", Param("self", "tensor"), Param("mat2", "matrix_rhs", of="self"), min_rank=2, max_rank=2)
    cat.add_function(aten.mm.default, Param("self", "tensor"), Param("mat2", "matrix_rhs", of="self"),
                     min_rank=2, max_rank=2)
    cat.add_function(torch.bmm, x, Param("mat2", "bmm_rhs", of="input"), min_rank=3, max_rank=3)
    cat.add_method("bmm", Param("self", "tensor"), Param("mat2", "bmm_rhs", of="self"), min_rank=3, max_rank=3)
    cat.add_function(aten.bmm.default, Param("self", "tensor"), Param("mat2", "bmm_rhs", of="self"),
                     min_rank=3, max_rank=3)
    for addmm in (torch.addmm, aten.addmm.default):
        cat.add_function(addmm, Param("input" if addmm is torch.addmm else "self", "tensor"),
                         Param("mat1", "addmm_mat1", of="input" if addmm is torch.addmm else "self"),
                         Param("mat2", "addmm_mat2", of="mat1"), min_rank=1, max_rank=2)
    cat.add_function(torch.clamp, x, Param("min", "number", optional=True), Param("max", "number", optional=True),
                     at_least_one=("min", "max"))
    cat.add_method("clamp", Param("self", "tensor"), Param("min", "number", optional=True),
                   Param("max", "number", optional=True), at_least_one=("min", "max"))
    # dim is always passed: its default (1) is out of range for a 1-D input
    cat.add_function(F.normalize, x, Param("p", "positive", optional=True), Param("dim", "dim", of="input"),
                     min_rank=1)

    # selections, conversions, masks
    for target in ("maximum", "minimum"):  # tensors only: torch.maximum(x, 2) raises
        cat.add_function(getattr(torch, target), x, Param("other", "tensor_partner", of="input"))
        cat.add_method(target, Param("self", "tensor"), Param("other", "tensor_partner", of="self"))
        cat.add_function(getattr(aten, target).default, Param("self", "tensor"),
                         Param("other", "tensor_partner", of="self"))
    cat.add_method("to", Param("self", "tensor"), Param("dtype", "dtype"), floating_only=False)
    cat.add_function(aten._to_copy.default, Param("self", "tensor"), Param("dtype", "dtype", optional=True),
                     floating_only=False)
    cat.add_method("masked_fill", Param("self", "tensor"), Param("mask", "mask", of="self"),
                   Param("value", "number"), floating_only=False)
    cat.add_function(torch.masked_fill, x, Param("mask", "mask", of="input"), Param("value", "number"),
                     floating_only=False)
    cat.add_function(aten.masked_fill.Scalar, Param("self", "tensor"), Param("mask", "mask", of="self"),
                     Param("value", "number"), floating_only=False)
    cat.add_function(aten.masked_fill.Tensor, Param("self", "tensor"), Param("mask", "mask", of="self"),
                     Param("value", "tensor_partner", of="self"), floating_only=False)  # a 0-d value only: others raise
    for where in (torch.where, aten.where.self):
        cat.add_function(where, Param("condition", "mask", of=None), Param("input" if where is torch.where else "self",
                                                                          "tensor_partner", of="condition"),
                         Param("other", "tensor_partner", of="condition"), floating_only=False)
    cat.add_function(aten.where.ScalarOther, Param("condition", "mask", of=None),
                     Param("self", "tensor_partner", of="condition"), Param("other", "number"), floating_only=False)
    cat.add_function(aten.slice.Tensor, Param("self", "tensor"), Param("dim", "dim", of="self", optional=True),
                     Param("start", "index_or_none", optional=True), Param("end", "index_or_none", optional=True),
                     Param("step", "step", optional=True), min_rank=1, floating_only=False)

    # inductor's randperm index patterns (post-grad, aten): a permutation, an index by it, an index_add at it
    cat.add_function(aten.randperm.default, Param("n", "length"), floating_only=False)
    cat.add_function(aten.index.Tensor, Param("self", "tensor"), Param("indices", "index_list", of="self"),
                     min_rank=1, floating_only=False)
    cat.add_function(aten.index_add.default, Param("self", "tensor"), Param("dim", "dim", of="self"),
                     Param("index", "index", of="self"), Param("source", "index_source", of="index"), min_rank=1)

    # convolutions and batch norm as functions (aten graphs from torch.export, and F.convNd)
    for spatial, (aten_conv, f_conv) in enumerate(((aten.conv1d.default, F.conv1d), (aten.conv2d.default, F.conv2d),
                                                   (aten.conv3d.default, F.conv3d)), start=1):
        for conv in (aten_conv, f_conv):
            cat.add_function(conv, Param("input", "tensor"), Param("weight", "conv_weight", of="input"),
                             Param("bias", "conv_bias", of="weight", optional=True),
                             Param("stride", "stride", of="input", optional=True),
                             Param("padding", "padding", of="input", optional=True),
                             Param("dilation", "dilation", of="input", optional=True),
                             Param("groups", "groups", of="weight", optional=True),
                             min_rank=spatial + 2, max_rank=spatial + 2)
    cat.add_function(aten.batch_norm.default, Param("input", "tensor"),
                     Param("weight", "channels_or_none", of="input"), Param("bias", "channels_or_none", of="input"),
                     Param("running_mean", "channels", of="input"), Param("running_var", "variance", of="input"),
                     Param("training", "bool"), Param("momentum", "prob"), Param("eps", "positive"),
                     Param("cudnn_enabled", "bool"), min_rank=2, max_rank=5)

    # modules
    for cls in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout):
        cat.add_module(cls, _dropout(cls))
    for cls in (nn.Identity, nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Mish, nn.Hardswish,
                nn.Hardsigmoid, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid, nn.SELU):
        cat.add_module(cls, _elementwise_module(cls))
    cat.add_module(nn.GELU, _elementwise_module(nn.GELU, approximate=lambda: _st().sampled_from(["none", "tanh"])))
    cat.add_module(nn.LeakyReLU, _elementwise_module(
        nn.LeakyReLU, negative_slope=lambda: _st().sampled_from([0.01, 0.1, 0.2])))
    cat.add_module(nn.ELU, _elementwise_module(nn.ELU, alpha=lambda: _st().sampled_from([1.0, 0.5])))
    cat.add_module(nn.Softplus, _elementwise_module(nn.Softplus, beta=lambda: _st().sampled_from([1.0, 2.0])))
    cat.add_module(nn.Linear, ModuleSampler((1, 4), _linear))
    for spatial, (conv, transposed) in enumerate(((nn.Conv1d, nn.ConvTranspose1d), (nn.Conv2d, nn.ConvTranspose2d),
                                                  (nn.Conv3d, nn.ConvTranspose3d)), start=1):
        cat.add_module(conv, _conv(conv, spatial))
        cat.add_module(transposed, _conv(transposed, spatial, transposed=True))
    cat.add_module(nn.BatchNorm1d, _batch_norm(nn.BatchNorm1d, (2, 3)))
    cat.add_module(nn.BatchNorm2d, _batch_norm(nn.BatchNorm2d, (4, 4)))
    cat.add_module(nn.BatchNorm3d, _batch_norm(nn.BatchNorm3d, (5, 5)))
    cat.add_module(nn.LayerNorm, ModuleSampler((1, 4), _layer_norm))
    cat.add_module(nn.GroupNorm, ModuleSampler((2, 4), _group_norm))
    cat.add_module(nn.Flatten, ModuleSampler((1, 4), _flatten))
    cat.add_module(nn.Softmax, _softmax(nn.Softmax))
    cat.add_module(nn.LogSoftmax, _softmax(nn.LogSoftmax))
    cat.add_module(nn.MaxPool2d, _pool(nn.MaxPool2d, 2))
    cat.add_module(nn.AvgPool2d, _pool(nn.AvgPool2d, 2))
    cat.add_module(nn.MaxPool1d, _pool(nn.MaxPool1d, 1))
    cat.add_module(nn.AvgPool1d, _pool(nn.AvgPool1d, 1))
    cat.add_module(nn.AdaptiveAvgPool2d, _adaptive_pool(nn.AdaptiveAvgPool2d, 2))
    cat.add_module(nn.AdaptiveAvgPool1d, _adaptive_pool(nn.AdaptiveAvgPool1d, 1))
    return cat


def describe_target(op: str, target: Any) -> str:
    """A readable name for ``no sampler for <op>`` messages."""
    if op == "call_method":
        return f"Tensor.{target}"
    if isinstance(target, type):
        return f"{target.__module__}.{target.__qualname__}"
    if fxaccess.is_op_overload(target):
        return f"aten.{target.__name__}" if not str(target).startswith("aten.") else str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    if module in ("_operator",):
        module = "operator"
    if module.startswith("torch._C"):
        module = "torch"
    return f"{module}.{name}" if module else name

