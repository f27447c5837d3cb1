"""Module builders: functions that rewrite rules call to build replacement modules.

A rule's replacement may construct a module from modules its pattern matched::

    rule fold_conv_bn:
        call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
        where not bn.training
        -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)

The builder contract
--------------------
* **Inputs**: the matched ``nn.Module`` instances, positionally, in the order the
  rule names them (``fold_conv_bn(conv, bn)`` above gets the conv, then the bn).
* **Output**: a *new* ``nn.Module`` that computes what the matched modules
  computed together. It lives on the same device and has the same dtype as the
  module it replaces, and it is in eval mode.
* **No mutation**: a builder never changes its inputs: not their parameters,
  buffers, training flags, hooks or attributes. The engine may still hold the
  original graph (to roll back a rewrite, or to compare against it), so the new
  module shares no parameter or buffer storage with the inputs. The engine checks
  this: a result that is an input module, holds one, or shares an input tensor's
  storage fails the run with an error naming the builder (it then sets the new
  module's training mode, device and dtype, which would change the inputs).
* **Refusal**: a builder raises :class:`BuilderError` with a message saying
  what is wrong on any input it cannot handle exactly (wrong types, training
  mode, mismatched shapes, ...). It never returns a module that is only
  approximately right, and never raises anything else on bad input.

:data:`BUILDERS` lists the public builders by name. It is an explicit table:
adding a builder means writing the function *and* listing it there.

This module imports torch; only the engine imports it.
"""

from __future__ import annotations

import copy
import copyreg
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.ao.nn import intrinsic as nni
from torch.nn.utils import parametrize
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights



from fxrules.engine import fxaccess
from fxrules.engine.errors import BuilderError

__all__ = ["BUILDERS", "BuilderError", "fold_conv_bn", "fold_conv_bn_tensors", "fold_linear_bn", "fuse_bn_relu",
           "fuse_conv_bn_relu", "fuse_conv_relu", "fuse_linear_relu"]


# Spatial dimensionality of each supported conv and batch-norm class. Subclasses
# (e.g. the Lazy* modules once initialised, QAT convs) count as their base.
_CONV_DIMS: tuple[tuple[type, int], ...] = (
    (nn.Conv1d, 1),
    (nn.Conv2d, 2),
    (nn.Conv3d, 3),
    (nn.ConvTranspose1d, 1),
    (nn.ConvTranspose2d, 2),
    (nn.ConvTranspose3d, 3),
)
_BN_DIMS: tuple[tuple[type, int], ...] = (
    (nn.BatchNorm1d, 1),
    (nn.BatchNorm2d, 2),
    (nn.BatchNorm3d, 3),
)

def _type_name(obj: object) -> str:
    return type(obj).__name__


def _dims_of(module: object, table: tuple[tuple[type, int], ...]) -> Optional[int]:
    for cls, dims in table:
        if isinstance(module, cls):
            return dims
    return None


def _check_plain(module: nn.Module, role: str) -> None:
    """Refuse modules whose behaviour a fold would silently change or could not copy."""
    # (the module's own tensors from its dictionaries, fxaccess.own_parameters/own_buffers: the
    # generators of parameters()/buffers() cost a sixth of a fold)
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in fxaccess.own_parameters(module).values()) \
            or any(isinstance(b, nn.parameter.UninitializedBuffer) for b in fxaccess.own_buffers(module).values()):
        raise BuilderError(
            f"cannot fold: the {role} ({_type_name(module)}) is a lazy module that has not been "
            "initialised yet; run it once on an input first"
        )
    if parametrize.is_parametrized(module):
        raise BuilderError(
            f"cannot fold: the {role} ({_type_name(module)}) has parametrizations "
            "(e.g. weight norm); remove them before folding"
        )
    hooked = fxaccess.hooked_kinds(module)
    if hooked:
        raise BuilderError(
            f"cannot fold: the {role} ({_type_name(module)}) has registered hooks "
            f"({', '.join(hooked)}); folding would change what they observe"
        )


def _check_bn(bn: nn.Module, role: str = "batch norm") -> None:
    """Checks shared by every ``*_bn`` fold: eval mode, running statistics, no hooks."""
    if bn.training:
        raise BuilderError(
            f"cannot fold {_type_name(bn)} in training mode: it normalises with batch statistics; "
            "call .eval() on the model first"
        )
    if bn.running_mean is None or bn.running_var is None:
        raise BuilderError(
            f"cannot fold {_type_name(bn)} without running statistics "
            "(it was built with track_running_stats=False, so it always uses batch statistics)"
        )
    _check_plain(bn, role)


def _check_same_device(first: nn.Module, second: nn.Module, what: str) -> None:
    devices = {t.device for module in (first, second)
               for own in (fxaccess.own_parameters(module), fxaccess.own_buffers(module)) for t in own.values()}
    if len(devices) > 1:
        listed = ", ".join(sorted(str(d) for d in devices))
        raise BuilderError(f"cannot fold {what}: the modules' tensors are on different devices ({listed})")


def _check_finite(what: str, tensors: dict) -> None:
    """Refuse a fold whose parameters or folded results are not all finite (``tensors``: name -> tensor
    or None). The fold multiplies the weight by ``gamma / sqrt(var + eps)`` before the convolution
    instead of scaling its result: an infinite or NaN factor, or a product that overflows the dtype
    (a huge batch-norm weight), makes every output of the channel inf or NaN where the original, which
    scales after summing, is finite or another inf. A model with such parameters is left as it is."""
    floating = [(name, t) for name, t in tensors.items() if t is not None and t.is_floating_point()]
    if _all_finite([t for _, t in floating]):
        return
    for name, tensor in floating:  # the first that is not, named
        if not bool(torch.isfinite(tensor).all()):
            raise BuilderError(f"cannot fold {what}: {name} is not finite (inf or NaN, or the folded value "
                               f"overflows {str(tensor.dtype).removeprefix('torch.')}), and the folded model "
                               f"would not compute the same values")


_FUSED_CHECK_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_FUSED_CHECK_MAX_VALUES = 1 << 16


def _all_finite(tensors: list) -> bool:
    """Whether every value of ``tensors`` is finite. For a fold's usual tensors (a few small ones) in one
    pass: their values concatenated, then one ``isfinite`` and one ``all``, three operator calls where
    three per tensor cost 65 us of a 178 us fold (small tensors cost their calls, not their values).
    Concatenating promotes to a dtype that holds every value exactly (float16 with bfloat16 gives
    float32, float64 with any of them float64), so an inf or a NaN stays one and no finite value
    becomes one. Tensors on several devices, of other dtypes (float8 kinds do not promote) or layouts
    (sparse), or of more than :data:`_FUSED_CHECK_MAX_VALUES` values together (copying them would cost
    more than the calls) are asked one by one."""
    if not tensors:
        return True
    if len(tensors) > 1 and all(t.dtype in _FUSED_CHECK_DTYPES and t.layout is torch.strided for t in tensors) \
            and len({t.device for t in tensors}) == 1 and sum(t.numel() for t in tensors) <= _FUSED_CHECK_MAX_VALUES:
        with torch.no_grad():
            return bool(torch.isfinite(torch.cat([t.reshape(-1) for t in tensors])).all())
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _bn_affine(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch norm's weight and bias, or 1 and 0 when it was built with ``affine=False``.

    This is the substitution torch's ``fuse_conv_bn_weights`` makes itself.
    """
    weight = bn.weight if bn.weight is not None else torch.ones_like(bn.running_mean)
    bias = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_mean)
    return weight, bias


def _copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` except its weight and bias, which the copy shares until
    :func:`_finish` replaces them (copying tensors about to be thrown away was two thirds of a
    fold's time). The caller's parameters are never written: the copy has its own parameter dict.

    For a module copied the default way this is what ``copy.deepcopy`` does (a new instance
    given a deep copy of its ``__getstate__()`` through ``__setstate__``), except that
    values deepcopy would return unchanged (numbers, strings, tuples of them) are not walked and
    empty containers (the hook dictionaries) are made new directly: a third of the time.
    """
    memo: dict = {}
    for name in ("weight", "bias"):
        tensor = fxaccess.own_parameter(module, name)
        if tensor is not None:
            memo[id(tensor)] = tensor
    cls = type(module)
    try:
        if not _copies_plainly(cls):
            return copy.deepcopy(module, memo)
        fresh = cls.__new__(cls)
        memo[id(module)] = fresh  # as deepcopy does: a reference to the module itself is to the copy
        state = {}
        for key, value in module.__getstate__().items():
            kind = type(value)
            if kind in _IMMUTABLE or (kind is tuple and all(type(v) in _IMMUTABLE for v in value)):
                state[key] = value
            elif kind in _EMPTY_CONTAINERS and not value:
                state[key] = kind()
            else:
                state[key] = copy.deepcopy(value, memo)
        fresh.__setstate__(state)
        return fresh
    except Exception as error:  # an attribute that cannot be copied
        raise BuilderError(f"cannot fold: the {_type_name(module)} cannot be deep-copied ({error})") from error


_IMMUTABLE = frozenset({bool, int, float, str, type(None)})
_EMPTY_CONTAINERS = frozenset({dict, OrderedDict, set})


def _copies_plainly(cls: type) -> bool:
    """Whether ``copy.deepcopy`` of a ``cls`` instance is the default one: a new instance, given a
    deep copy of ``__getstate__()`` through ``__setstate__`` (no own ``__deepcopy__`` or
    ``__reduce_ex__``/``__reduce__``, no slots)."""
    return (getattr(cls, "__deepcopy__", None) is None and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__ and not copyreg._slotnames(cls))


def _finish(fused: nn.Module, weight: torch.Tensor, bias: torch.Tensor, requires_grad: bool) -> nn.Module:
    """Install the folded parameters on the copy and put it in eval mode."""
    fused.weight = nn.Parameter(weight.detach(), requires_grad=requires_grad)
    fused.bias = nn.Parameter(bias.detach(), requires_grad=requires_grad)
    return fused.eval()


def fold_conv_bn(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Fold an eval-mode batch norm into the convolution that feeds it.

    ``conv`` is an ``nn.Conv1d``/``Conv2d``/``Conv3d`` or ``nn.ConvTranspose1d``/``2d``/``3d``
    (any stride, padding, padding mode, dilation, groups, output padding, with or without
    bias); ``bn`` is the ``nn.BatchNorm1d``/``2d``/``3d`` of the same dimensionality that
    normalises its output, in eval mode, with running statistics, affine or not.

    Returns a new module of the conv's class computing ``bn(conv(x))``: a deep copy of
    ``conv`` whose weight and bias are replaced by the folded ones (it always has a bias).
    The values are those of ``torch.nn.utils.fusion.fuse_conv_bn_eval`` bit for bit (the
    arithmetic is torch's ``fuse_conv_bn_weights``), except that grouped transposed convs,
    which torch's fuser cannot fold, are folded here with the same formula. Both folded
    parameters have the dtype of the conv's weight (bias: of its bias, if it has one),
    the conv's device, and ``requires_grad`` equal to the conv weight's. The result is in
    eval mode whatever mode ``conv`` is in (a conv behaves the same in both).

    Raises :class:`BuilderError` if the types are wrong, ``bn`` is in training mode or has no
    running statistics, the channel counts or dimensionalities disagree, the modules are on
    different devices, either module is lazy and uninitialised, parametrized, or hooked, or a
    parameter, a running statistic or a folded value is not finite (the fold would then compute
    inf or NaN where the original does not).
    """
    conv_dims = _dims_of(conv, _CONV_DIMS)
    if conv_dims is None:
        raise BuilderError(
            f"fold_conv_bn expects a Conv1d/2d/3d or ConvTranspose1d/2d/3d as its first module, "
            f"got {_type_name(conv)}"
        )
    bn_dims = _dims_of(bn, _BN_DIMS)
    if bn_dims is None:
        raise BuilderError(f"fold_conv_bn expects a BatchNorm1d/2d/3d as its second module, got {_type_name(bn)}")
    if conv_dims != bn_dims:
        raise BuilderError(
            f"cannot fold {_type_name(bn)} into {_type_name(conv)}: their dimensionalities differ "
            f"({bn_dims}d batch norm after a {conv_dims}d convolution)"
        )
    _check_bn(bn)
    _check_plain(conv, "convolution")
    if bn.num_features != conv.out_channels:
        raise BuilderError(
            f"cannot fold {_type_name(bn)} into {_type_name(conv)}: the batch norm has "
            f"num_features={bn.num_features} but the convolution has out_channels={conv.out_channels}"
        )
    _check_same_device(conv, bn, f"{_type_name(bn)} into {_type_name(conv)}")

    transposed = isinstance(conv, nn.modules.conv._ConvTransposeNd)
    bn_weight, bn_bias = _bn_affine(bn)
    with torch.no_grad():
        if transposed and conv.groups > 1:
            weight, bias = _fold_grouped_transposed(conv, bn, bn_weight, bn_bias)
        else:
            weight, bias = fuse_conv_bn_weights(
                conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn_weight, bn_bias, transposed
            )
    _check_finite(f"{_type_name(bn)} into {_type_name(conv)}", {
        "the convolution's weight": conv.weight, "the convolution's bias": conv.bias,
        "the batch norm's weight": bn_weight, "the batch norm's bias": bn_bias, "the running mean": bn.running_mean,
        "the running variance": bn.running_var, "the folded weight": weight, "the folded bias": bias})
    return _finish(_copy(conv), weight, bias, conv.weight.requires_grad)


def _fold_grouped_transposed(
    conv: nn.Module, bn: nn.Module, bn_weight: torch.Tensor, bn_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fuse_conv_bn_weights(..., transpose=True)`` generalised to ``groups > 1``.

    A transposed conv's weight has shape ``(in_channels, out_channels // groups, *kernel)``,
    and output channel ``g * (out_channels // groups) + j`` is produced by the rows of group
    ``g`` at column ``j``. Torch's fuser scales columns by a vector of length out_channels,
    which only broadcasts when ``groups == 1``; here the weight is viewed per group first.
    The arithmetic (operations, order, dtypes) is otherwise exactly torch's.
    """
    w = conv.weight
    groups = conv.groups
    weight_dtype = w.dtype
    bias_dtype = conv.bias.dtype if conv.bias is not None else weight_dtype
    conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    rsqrt = torch.rsqrt(bn.running_var + bn.eps)
    scale = (bn_weight * rsqrt).reshape(groups, 1, -1, *([1] * (w.dim() - 2)))
    grouped = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
    weight = (grouped * scale).reshape(w.shape).to(dtype=weight_dtype)
    bias = ((conv_bias - bn.running_mean) * rsqrt * bn_weight + bn_bias).to(dtype=bias_dtype)
    return weight, bias


def fold_linear_bn(linear: nn.Module, bn: nn.Module) -> nn.Module:
    """Fold an eval-mode ``nn.BatchNorm1d`` into the ``nn.Linear`` that feeds it.

    Returns a new ``nn.Linear`` (a deep copy of ``linear``, same class) computing
    ``bn(linear(x))``, with the values of ``torch.nn.utils.fusion.fuse_linear_bn_eval``
    bit for bit (the bias always has shape ``(out_features,)``; ``affine=False`` batch norms,
    which torch's fuser rejects, use weight 1 and bias 0 as the conv fold does). Device, dtype, ``requires_grad`` and eval mode
    follow the same rules as :func:`fold_conv_bn`.

    Like torch, it accepts ``bn.num_features == linear.out_features`` or
    ``bn.num_features == 1``. The fold assumes the batch norm's channel dimension is the
    linear's feature dimension (a 2-D ``(N, features)`` activation), or that the batch
    norm has a single channel; a rule must not apply it where a 3-D ``(N, C, L)``
    activation has ``C == out_features`` by coincidence: builders cannot see shapes.

    Raises :class:`BuilderError` on the same conditions as :func:`fold_conv_bn`.
    """
    if not isinstance(linear, nn.Linear):
        raise BuilderError(f"fold_linear_bn expects an nn.Linear as its first module, got {_type_name(linear)}")
    if not isinstance(bn, nn.BatchNorm1d):
        raise BuilderError(f"fold_linear_bn expects a BatchNorm1d as its second module, got {_type_name(bn)}")
    _check_bn(bn)
    _check_plain(linear, "linear")
    if bn.num_features not in (linear.out_features, 1):
        raise BuilderError(
            f"cannot fold {_type_name(bn)} into {_type_name(linear)}: the batch norm has "
            f"num_features={bn.num_features} but the linear has out_features={linear.out_features} "
            "(they must be equal, or num_features must be 1)"
        )
    _check_same_device(linear, bn, f"{_type_name(bn)} into {_type_name(linear)}")

    bn_weight, bn_bias = _bn_affine(bn)
    with torch.no_grad():
        weight, bias = fuse_linear_bn_weights(
            linear.weight, linear.bias, bn.running_mean, bn.running_var, bn.eps, bn_weight, bn_bias
        )
        if bias.shape != (linear.out_features,):
            # A one-channel bn after a bias-free linear: torch leaves a bias of shape (1,),
            # which broadcasts the same but does not fit nn.Linear's state dict. Same values.
            bias = bias.expand(linear.out_features).clone()
    _check_finite(f"{_type_name(bn)} into {_type_name(linear)}", {
        "the linear's weight": linear.weight, "the linear's bias": linear.bias,
        "the batch norm's weight": bn_weight, "the batch norm's bias": bn_bias, "the running mean": bn.running_mean,
        "the running variance": bn.running_var, "the folded weight": weight, "the folded bias": bias})
    return _finish(_copy(linear), weight, bias, linear.weight.requires_grad)


def fold_conv_bn_tensors(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
    bn_weight: Optional[torch.Tensor] = None,
    bn_bias: Optional[torch.Tensor] = None,
    *,
    transposed: bool = False,
) -> tuple[nn.Parameter, nn.Parameter]:
    """The folded ``(weight, bias)`` of a convolution followed by an eval-mode batch norm, from tensors.

    The tensor-level form of :func:`fold_conv_bn`, for graphs whose convolution and batch norm
    are ``call_function`` nodes reading their parameters with ``get_attr`` (``torch.export``:
    ``aten.conv2d.default(x, w, b)`` then ``aten.batch_norm.default(y, gamma, beta, mean, var,
    False, momentum, eps, cudnn)``). ``aten.conv{1,2,3}d(x, w', b')`` with the returned tensors
    computes ``batch_norm(conv(x, w, b))``. ``bias``, ``bn_weight`` and ``bn_bias`` may be ``None``
    (no conv bias; ``affine=False``: weight 1, bias 0). ``transposed``: ``weight`` is a
    transposed convolution's (``groups == 1`` only; use :func:`fold_conv_bn` otherwise).

    The arithmetic is torch's ``fuse_conv_bn_weights`` (the values of :func:`fold_conv_bn` bit
    for bit). The results are new parameters (sharing no storage with the inputs, which are not
    changed) with the dtype and device of ``weight`` (the bias: of ``bias`` if given) and
    ``requires_grad`` equal to ``weight``'s.

    Rule files reach it through :func:`fold_aten_conv_bn`, a module builder that takes the
    captured parameters (``rules/aten/fold.fxr``).

    Raises :class:`BuilderError` if an argument is not a tensor (or ``eps`` not a positive
    number), the statistics do not have one entry per output channel, the tensors are on
    different devices, or a tensor or a folded value is not finite (as :func:`fold_conv_bn`).
    """
    tensors = {"weight": weight, "running_mean": running_mean, "running_var": running_var}
    optional = {"bias": bias, "bn_weight": bn_weight, "bn_bias": bn_bias}
    for name, value in {**tensors, **optional}.items():
        if value is None and name in optional:
            continue
        if not isinstance(value, torch.Tensor):
            raise BuilderError(f"fold_conv_bn_tensors: {name} must be a tensor, got {_type_name(value)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise BuilderError(f"fold_conv_bn_tensors: eps must be a positive number, got {eps!r}")
    if weight.dim() < 3:
        raise BuilderError(f"fold_conv_bn_tensors: a convolution weight has at least 3 dims, got shape "
                           f"{tuple(weight.shape)}")
    channels = weight.shape[1] if transposed else weight.shape[0]
    for name, value in {"running_mean": running_mean, "running_var": running_var, **optional}.items():
        if value is not None and tuple(value.shape) != (channels,):
            raise BuilderError(f"cannot fold: {name} has shape {tuple(value.shape)}, but the convolution has "
                               f"{channels} output channels")
    devices = {t.device for t in (*tensors.values(), *optional.values()) if t is not None}
    if len(devices) > 1:
        listed = ", ".join(sorted(str(d) for d in devices))
        raise BuilderError(f"cannot fold: the tensors are on different devices ({listed})")
    gamma = bn_weight if bn_weight is not None else torch.ones_like(running_mean)
    beta = bn_bias if bn_bias is not None else torch.zeros_like(running_mean)
    with torch.no_grad():
        folded_weight, folded_bias = fuse_conv_bn_weights(
            weight, bias, running_mean, running_var, float(eps), gamma, beta, transposed)
    _check_finite("the batch norm into the convolution", {
        "the convolution's weight": weight, "the convolution's bias": bias, "the batch norm's weight": gamma,
        "the batch norm's bias": beta, "the running mean": running_mean, "the running variance": running_var,
        "the folded weight": folded_weight, "the folded bias": folded_bias})
    requires_grad = weight.requires_grad
    return (nn.Parameter(folded_weight.detach().clone(), requires_grad=requires_grad),
            nn.Parameter(folded_bias.detach().clone(), requires_grad=requires_grad))


#: The public builders by name, as rule files may refer to them.
# -- torch.ao.nn.intrinsic fused modules (what torch.ao.quantization.fuse_modules makes for inference) --

_CONV_RELU = {nn.Conv1d: nni.ConvReLU1d, nn.Conv2d: nni.ConvReLU2d, nn.Conv3d: nni.ConvReLU3d}
_BN_RELU = {nn.BatchNorm2d: nni.BNReLU2d, nn.BatchNorm3d: nni.BNReLU3d}


def _exact_class(module: nn.Module, table: dict, builder: str, expected: str) -> type:
    """The fused class for ``module``'s class. torch.ao's fused modules take their parts' exact classes
    (no subclass: a subclass may compute otherwise), as ``fuse_modules`` does."""
    fused = table.get(type(module))
    if fused is None:
        raise BuilderError(f"{builder} expects {expected} (the class itself, not a subclass), got {_type_name(module)}")
    return fused


def _own_copy(module: nn.Module, role: str) -> nn.Module:
    """A deep copy sharing no parameter or buffer with ``module`` (the builder contract), in eval mode."""
    _check_plain(module, role)
    try:
        return copy.deepcopy(module).eval()
    except Exception as error:  # an attribute that cannot be copied
        raise BuilderError(f"cannot fuse: the {_type_name(module)} cannot be deep-copied ({error})") from error


def fuse_conv_relu(conv: nn.Module) -> nn.Module:
    """``torch.ao.nn.intrinsic.ConvReLU1d/2d/3d`` computing ``relu(conv(x))``: a copy of ``conv`` (an
    ``nn.Conv1d``/``2d``/``3d``, the class itself) followed by a new ``nn.ReLU()``, as
    ``torch.ao.quantization.fuse_modules`` fuses a conv and a relu. The fused module runs the
    same two operations in the same order, so its outputs are bit-identical.

    Raises :class:`BuilderError` for another class, or a conv that is lazy and uninitialised,
    parametrized or hooked."""
    fused = _exact_class(conv, _CONV_RELU, "fuse_conv_relu", "a Conv1d, Conv2d or Conv3d")
    return fused(_own_copy(conv, "convolution"), nn.ReLU()).eval()


def fuse_conv_bn_relu(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """``torch.ao.nn.intrinsic.ConvReLU1d/2d/3d`` computing ``relu(bn(conv(x)))`` for an eval-mode batch
    norm: the conv with the batch norm folded in (:func:`fold_conv_bn`, torch's arithmetic), then a
    new ``nn.ReLU()``: what ``fuse_modules`` makes of conv, bn, relu for inference. Equal within
    rounding (the fold's).

    Raises :class:`BuilderError` as :func:`fold_conv_bn` does, and for a conv whose class is not
    exactly ``nn.Conv1d``/``2d``/``3d`` (transposed convs have no fused relu module)."""
    fused = _exact_class(conv, _CONV_RELU, "fuse_conv_bn_relu", "a Conv1d, Conv2d or Conv3d")
    return fused(fold_conv_bn(conv, bn), nn.ReLU()).eval()


def fuse_linear_relu(linear: nn.Module) -> nn.Module:
    """``torch.ao.nn.intrinsic.LinearReLU`` computing ``relu(linear(x))``: a copy of ``linear`` (an
    ``nn.Linear``, the class itself) and a new ``nn.ReLU()``. Bit-identical outputs.

    Raises :class:`BuilderError` as :func:`fuse_conv_relu` does."""
    _exact_class(linear, {nn.Linear: nni.LinearReLU}, "fuse_linear_relu", "an nn.Linear")
    return nni.LinearReLU(_own_copy(linear, "linear"), nn.ReLU()).eval()


def fuse_bn_relu(bn: nn.Module) -> nn.Module:
    """``torch.ao.nn.intrinsic.BNReLU2d/3d`` computing ``relu(bn(x))`` for an eval-mode ``nn.BatchNorm2d``
    or ``3d`` (the class itself) with running statistics: a copy of it and a new ``nn.ReLU()``.
    Bit-identical outputs. A batch norm in training mode is refused: it normalises with the
    batch's statistics and updates its running ones, which the copy would update instead.

    Raises :class:`BuilderError` for another class, training mode, no running statistics, or a
    batch norm that is lazy and uninitialised, parametrized or hooked."""
    fused = _exact_class(bn, _BN_RELU, "fuse_bn_relu", "a BatchNorm2d or BatchNorm3d")
    _check_bn(bn)
    return fused(_own_copy(bn, "batch norm"), nn.ReLU()).eval()


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "fold_conv_bn": fold_conv_bn,
    "fold_linear_bn": fold_linear_bn,
    "fuse_conv_relu": fuse_conv_relu,
    "fuse_conv_bn_relu": fuse_conv_bn_relu,
    "fuse_linear_relu": fuse_linear_relu,
    "fuse_bn_relu": fuse_bn_relu,
}


_CONV_CLASSES = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}


def fold_aten_conv_bn(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    bn_weight: Optional[torch.Tensor],
    bn_bias: Optional[torch.Tensor],
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> nn.Module:
    """A convolution module computing ``aten.batch_norm(aten.convNd(x, weight, bias, stride, padding,
    dilation, groups), bn_weight, bn_bias, running_mean, running_var, False, _, eps, _)``.

    The module-builder form of :func:`fold_conv_bn_tensors` for ``torch.export`` graphs, whose
    convolution and batch norm are aten calls reading ``get_attr`` parameters: a rule captures
    those tensors and the conv's hyperparameters and replaces the pair with one
    ``nn.Conv1d``/``2d``/``3d`` (chosen by the weight's rank) holding the folded parameters::

        call_function aten.batch_norm.default(
            call_function aten.conv2d.default($x, get_attr $w, $b, $stride, $padding, $dilation, $groups),
            $gamma, $beta, get_attr $mean, get_attr $var, False, _, $eps, _)
        -> call_module fxrules.builders.fold_aten_conv_bn($w, $b, $gamma, $beta, $mean, $var, $eps,
                                                         $stride, $padding, $dilation, $groups)($x)

    ``padding`` may be a string (``"same"``/``"valid"``, as ``aten.conv2d.padding`` takes).
    Raises :class:`BuilderError` (the rewrite is then declined) for arguments that are not
    parameters of these shapes, or the statistics' errors :func:`fold_conv_bn_tensors` raises.
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() not in _CONV_CLASSES:
        raise BuilderError(f"fold_aten_conv_bn: the weight must be a 3-, 4- or 5-dim tensor, got "
                           f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else _type_name(weight)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise BuilderError(f"fold_aten_conv_bn: groups must be a positive int, got {groups!r}")
    folded_weight, folded_bias = fold_conv_bn_tensors(weight, bias, running_mean, running_var, eps, bn_weight,
                                                      bn_bias)
    cls = _CONV_CLASSES[weight.dim()]
    out_channels, in_per_group = weight.shape[0], weight.shape[1]
    try:
        conv = cls(in_per_group * groups, out_channels, tuple(weight.shape[2:]), stride=_listed(stride),
                   padding=padding if isinstance(padding, str) else _listed(padding), dilation=_listed(dilation),
                   groups=groups, bias=True, device=weight.device, dtype=weight.dtype)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise BuilderError(f"fold_aten_conv_bn: cannot build {cls.__name__}: {exc}") from None
    conv.weight = folded_weight
    conv.bias = folded_bias
    return conv.eval()


def _listed(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value
