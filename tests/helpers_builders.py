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
