"""Builders and predicates the engine/safety tests name from rule text (allow_imports=["tests"])."""

from torch import nn


class BuilderBoom(RuntimeError):
    """Raised on purpose by :func:`exploding_builder`."""


def exploding_builder(*modules: nn.Module) -> nn.Module:
    """A module builder that always fails, after the engine has already committed to the rewrite."""
    raise BuilderBoom("this builder always fails")


def exploding_predicate(*values) -> bool:
    """A condition function that always fails."""
    raise BuilderBoom("this predicate always fails")


def fold_conv_bn_ignoring_eps(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """A deliberately WRONG fold (for the verification tests): it forgets the batch norm's eps."""
    import copy

    from fxrules.builders import fold_conv_bn

    careless = copy.deepcopy(bn)
    careless.eps = 0.0
    return fold_conv_bn(conv, careless)


def sequential_of_inputs(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Breaks the builder contract: returns the model's own modules inside a new container."""
    return nn.Sequential(conv, bn)


def first_input(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Breaks the builder contract: returns one of its inputs as it is."""
    return conv


def sharing_weight(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Breaks the builder contract: a new conv whose weight is the input conv's (the same storage)."""
    import copy

    new = copy.deepcopy(conv)
    new.weight = conv.weight
    return new


def copies_inputs(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Keeps the contract: a container of copies (computes bn(conv(x)) in the inputs' modes)."""
    import copy

    return nn.Sequential(copy.deepcopy(conv), copy.deepcopy(bn))


def sharing_weight_view(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Breaks the builder contract: a new conv whose weight is a new Parameter viewing the input's storage."""
    import copy

    new = copy.deepcopy(conv)
    new.weight = nn.Parameter(conv.weight.detach().view(conv.weight.shape))
    return new


def fresh_batch_norm_in_training_mode(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Keeps the contract but for its mode: a conv copy, then a new batch norm holding the input's statistics,
    left in training mode (as constructed); in an eval-mode model the engine puts it in eval mode."""
    import copy

    norm = nn.BatchNorm2d(bn.num_features, eps=bn.eps)
    norm.load_state_dict(bn.state_dict())
    return nn.Sequential(copy.deepcopy(conv), norm)


def with_new_dropout(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Computes bn(conv(x)), then a new dropout left in training mode (as constructed): in a model that trains
    it keeps that mode and draws random numbers."""
    import copy

    return nn.Sequential(copy.deepcopy(conv), copy.deepcopy(bn), nn.Dropout(0.5))
