"""Deliberately WRONG module builders the soundness-draw tests name from rule text (allow_imports=["tests"])."""

import copy

import torch
from torch import nn


def as_plain_conv2d(conv: nn.Module) -> nn.Module:
    """The conv as a plain ``nn.Conv2d`` (same state, hooks and all), wrapped in a Sequential so the rule does
    not match its own result: wrong for a subclass that overrides a method its forward calls."""
    plain = copy.deepcopy(conv)
    plain.__class__ = nn.Conv2d
    return nn.Sequential(plain)


def double_weights_in_place(linear: nn.Module) -> nn.Module:
    """``2 * linear(x)`` by doubling the Linear's own weight and bias in place and returning it: right for this
    use, wrong for every other use of the same module or of a parameter tied to it."""
    with torch.no_grad():
        linear.weight.mul_(2)
        if linear.bias is not None:
            linear.bias.mul_(2)
    return linear


def double_weights_in_place_then_copy(linear: nn.Module) -> nn.Module:
    """:func:`double_weights_in_place`, returning a copy: the result shares nothing with its input (the engine's
    check of the builder contract passes), but the input was changed, so every other use of the same module or
    of a parameter tied to it computes otherwise."""
    import copy

    return copy.deepcopy(double_weights_in_place(linear))


class _ScaledGradient(torch.autograd.Function):
    """``value`` itself forward (a copy), its gradient times ``factor`` backward."""

    @staticmethod
    def forward(ctx, value, factor):
        ctx.factor = factor
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def double_gradient(value: torch.Tensor) -> torch.Tensor:
    """``value`` itself forward (a copy), twice its gradient backward: a replacement that keeps a trainable
    parameter on the gradient path (the engine's trainable-parameter check passes) but trains it wrong."""
    return _ScaledGradient.apply(value, 2.0)


def nudge_gradient(value: torch.Tensor) -> torch.Tensor:
    """``value`` itself forward, its gradient times 1 + 2**-10 (about 1.001) backward: a parameter trained
    wrong by far more than rounding explains, yet by little enough that a budget judging each parameter's
    gradient by another value's spread (a mis-indexed spread, or the input gradients') could let it pass."""
    return _ScaledGradient.apply(value, 1 + 2.0 ** -10)


def fold_conv_bn_dropping_bias(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """A deliberately WRONG conv-BN fold: the batch norm's bias (beta) is lost; every output is off by beta."""
    from fxrules.builders import fold_conv_bn

    careless = copy.deepcopy(bn)
    if careless.bias is not None:
        with torch.no_grad():
            careless.bias.zero_()
    return fold_conv_bn(conv, careless)


def relu_overflowing(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)`` except inf wherever it exceeds 1: a rewrite that turns a finite output into inf."""
    y = torch.relu(x)
    return torch.where(y > 1, torch.full_like(y, float("inf")), y)


def verify_wrong(text: str, hosts: int, **options):
    """Verify rule ``text`` (which may name this module's builders) on ``hosts`` hosts, seed 0, no database:
    the soundness-draw and budget tests' one way of grading a deliberately wrong rule."""
    import fxrules
    from fxrules.verifier.driver import verify

    rules = fxrules.parse_rules(text, "wrong.fxr", allow_imports=["tests"])
    options.setdefault("max_examples", hosts)
    options.setdefault("seed", 0)
    options.setdefault("database", None)
    return verify(rules, **options)
