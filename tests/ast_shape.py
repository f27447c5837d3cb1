"""A structural listing of ASTs for tests: tells apart literals that ``==`` confuses."""

import dataclasses


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
