"""A structural listing of ASTs for tests: tells apart literals that ``==`` confuses."""

import dataclasses

import fxrules.lang.ast as A


def shape(node: object) -> list:
    """A flat pre-order listing of ``node``: equal for two ASTs exactly when they are the
    same, the types of literal values included. Iterative, for very deep ASTs."""
    out: list = []
    stack = [node]
    while stack:
        item = stack.pop()
        if dataclasses.is_dataclass(item):
            values = [getattr(item, f.name) for f in dataclasses.fields(item) if f.compare]
            out.append((type(item).__name__, len(values)))
            stack.extend(reversed(values))
        elif isinstance(item, tuple):
            out.append(("tuple", len(item)))
            stack.extend(reversed(item))
        elif isinstance(item, float):
            out.append(("float", repr(item)))
        else:
            out.append((type(item).__name__, item))
    return out


def listing(node: object) -> list:
    """Everything in an AST, pre-order: node types, every field (spans too), literal types."""
    out: list = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, A.Span):
            out.append(("Span", tuple(item)))
        elif dataclasses.is_dataclass(item):
            values = [getattr(item, f.name) for f in dataclasses.fields(item)]
            out.append((type(item).__name__, len(values)))
            stack.extend(reversed(values))
        elif isinstance(item, tuple):
            out.append(("tuple", len(item)))
            stack.extend(reversed(item))
        else:  # (ints in hexadecimal: repr refuses those of over 4300 digits, which hex literals make)
            out.append((type(item).__name__, hex(item) if type(item) is int else repr(item)))
    return out
