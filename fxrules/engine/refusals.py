"""Why a rule did not rewrite a node, as data: stable codes, the English message, the nodes concerned.

Two closed sets of codes, both kebab-case strings (``StrEnum``: they print, compare and
serialise to JSON as their value), documented in docs/semantics.md:

* :class:`RefusalCode`: the pattern and the conditions matched, but the rewrite is refused
  (by the planner's checks, :mod:`fxrules.engine.planner`, by a module builder that
  declines its inputs, :mod:`fxrules.engine.transaction`, or by a contract guard,
  :mod:`fxrules.engine.guards`). A :class:`Refusal` carries one;
  ``Report.rejected`` entries and ``find_matches``' ``MatchInfo`` carry its code.
* :class:`MissCode`: the rule's root target matched a node but the rule did not match there
  (the pattern failed somewhere, or a ``where`` condition is false): what ``explain``'s
  near misses carry, besides refusals.

Codes are the contract for programs (tests, CI scripts reading ``--format json``); the
messages are for people and may be reworded. The two sets share no value, so a near miss's
code alone says which stage stopped the rule.

Torch-free: a refusal names nodes by their graph names (strings), so reports can hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RefusalCode(StrEnum):
    """Why a match that passed its pattern and conditions is not rewritten."""

    CONDITION_RAISED = "condition-raised"
    """A ``where`` condition raised on this match's values (``$s * 1.0`` on tensor metadata): it does not hold."""
    INTERIOR_USED_OUTSIDE = "interior-used-outside"
    """A matched node that is not a root has a user outside the match."""
    DROPS_SIDE_EFFECT = "drops-side-effect"
    """A matched node has a side effect (in-place write, print, impure op); removing it would drop it."""
    USES_REPLACED_NODE = "uses-replaced-node"
    """The replacement reads a root, the node it replaces."""
    REPLACES_WITH_LITERAL = "replaces-with-literal"
    """The replacement would stand a literal in for a node."""
    REPLACED_NODE_MUTATED = "replaced-node-mutated"
    """A root is modified in place later; the value standing in for it would be modified instead."""
    READS_ACROSS_MUTATION = "reads-across-mutation"
    """A value the replacement reads is modified in place between the match and the place it is read."""
    ALIAS_MUTATED_LATER = "alias-mutated-later"
    """The value standing in for a root is modified in place after the match; the root's readers would see it."""
    WOULD_CYCLE = "would-cycle"
    """The replacement would have to come after a user of the nodes it replaces."""
    BUILDER_DECLINED = "builder-declined"
    """A module builder raised ``BuilderError`` for these inputs (or a capture it needs is computed)."""
    MODULE_HAS_HOOKS = "module-has-hooks"
    """A matched module has hooks (its own, or global module hooks): removing or replacing its call drops them."""
    CHANGES_RANDOM_DRAWS = "changes-random-draws"
    """Under ``[exact]``/``[approx]``, the rewrite removes or adds a call that draws random numbers."""
    REPLACEMENT_WRITES_INPUT = "replacement-writes-input"
    """The replacement writes in place a value that exists outside it (a capture, a forwarded argument)."""
    OUTPUT_ALIAS_INTRODUCED = "output-alias-introduced"
    """The rewrite would make a graph output alias a parameter, a buffer, another output (or, for a clone, an input):
    found by the planner from alias annotations and view tables, and, where values are known, by the guards
    from fake tensors' storage (fxrules.engine.guards)."""
    READS_WRITTEN_VALUE = "reads-written-value"
    """A module builder would read a parameter or buffer that the graph writes in place."""
    SHAPE_CHANGED = "shape-changed"
    """Under ``[exact]``/``[approx]``: the replacement would have another shape than the root."""
    DTYPE_CHANGED = "dtype-changed"
    """Under ``[exact]``/``[approx]``: the replacement would have another dtype than the root."""
    DEVICE_CHANGED = "device-changed"
    """Under ``[exact]``/``[approx]``: the replacement would live on another device than the root."""
    REQUIRES_GRAD_CHANGED = "requires-grad-changed"
    """Under ``[exact]``/``[approx]``, in a model that trains: the replacement would require grad where the
    root did not, or the other way round."""
    LAYOUT_CHANGED = "layout-changed"
    """Under ``[exact]``: the replacement would have other strides than the root, and a later node reads them."""
    TRAINABLE_PARAMETER_DROPPED = "trainable-parameter-dropped"
    """Under ``[exact]``/``[approx]``, in a model that trains: a parameter requiring grad would leave the
    gradient path."""


class MissCode(StrEnum):
    """Why a rule whose root target matched a node did not match there (``explain``)."""

    PATTERN_MISMATCH = "pattern-mismatch"
    """The pattern does not match, with no more specific reason recorded."""
    OP_MISMATCH = "op-mismatch"
    """A node has another op (call_function, call_module, get_attr, ...) than the pattern, or is no node."""
    TARGET_MISMATCH = "target-mismatch"
    """A node calls another function, method, module class or attribute than the pattern names."""
    MODULE_ATTRIBUTE_MISMATCH = "module-attribute-mismatch"
    """A called module lacks an attribute the pattern constrains, or has another value."""
    ARGUMENT_COUNT = "argument-count"
    """A call has another number of positional arguments than the pattern."""
    ARGUMENT_MISSING = "argument-missing"
    """An argument the pattern names is absent (and has no default)."""
    ARGUMENT_MISMATCH = "argument-mismatch"
    """An argument's value does not match the pattern's."""
    UNEXPECTED_ARGUMENT = "unexpected-argument"
    """The call passes an argument the pattern does not mention (and the pattern has no ``...``)."""
    LITERAL_MISMATCH = "literal-mismatch"
    """A value is not the literal the pattern writes (by value and type)."""
    CONSTANT_MISMATCH = "constant-mismatch"
    """A value is not the named constant the pattern writes (``torch.float32``, ...)."""
    SEQUENCE_MISMATCH = "sequence-mismatch"
    """A value is not a sequence of the pattern's length."""
    CAPTURE_CONFLICT = "capture-conflict"
    """A capture used twice is bound to two different values."""
    NAMED_NODE_MISMATCH = "named-node-mismatch"
    """A reference to an ``as`` name finds another node than the one bound to it."""
    OTHER_ROOT_MISSING = "other-root-missing"
    """No node matches a further root of a multi-root rule over the same captures."""
    CONDITION_FALSE = "condition-false"
    """The pattern matched, but a ``where`` condition is false."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A match the engine will not rewrite: why (``code``), in words (``message``), and where.

    ``nodes``: the names of the graph nodes the refusal is about, the offending node first
    (the interior node and its outside user, the node with the side effect, the value and
    the node that modifies it, ...). Built only when refusing, so the accepted path
    allocates nothing for it.
    """

    code: RefusalCode
    message: str
    nodes: tuple[str, ...]

    def __str__(self) -> str:
        return self.message
