"""What each position of a rule file may name: a reviewed allow-list, decided by lookups.

Rule files are untrusted input. A deny-list over torch cannot be complete (torch has
public functions that spawn processes, execute strings, read files, load native
libraries, change global state), so every name a rule file uses must be on a table
generated from torch's own lists of tensor functions (``scripts/gen_allowlist.py``,
data in ``fxrules/lang/allowlist.json``, with the torch version it was made from),
minus everything with an effect outside its outputs. The decision is a pure lookup on
the full dotted path as written (aliases expanded): nothing is imported, nothing is
resolved, so ``use torch._C as c`` or a private-module alias of a public function is
simply not on the table. Packages the user allows explicitly (``allow-imports``) are
trusted for builders, targets, module types and condition functions under them.

Each ``refuse_*`` function returns None when the name is allowed, else the message of a
located ``not-allowed`` diagnostic.
"""

from __future__ import annotations

import enum
import re
from typing import Iterable, Optional

import fxrules.lang.ast as A
from fxrules.lang import packaged

TABLE_FILE = "allowlist.json"
"""The table's file in ``fxrules/lang`` (:mod:`fxrules.lang.packaged`): each table below is its key in
lower case (``OPERATORS`` and ``RANDOM_OPERATORS``: ``aten_ops``/``prims_ops`` and their ``random_``
keys), an array of dotted paths (of names, for methods and ops)."""

_data = packaged.read_json(TABLE_FILE)

TORCH_VERSION: str = _data["torch_version"]
"""The torch version the table was generated from."""

FUNCTIONS = frozenset(_data["functions"])
MATCH_ONLY_FUNCTIONS = frozenset(_data["match_only_functions"])
TENSOR_METHODS = frozenset(_data["tensor_methods"])
CONSTANTS = frozenset(_data["constants"])
MODULE_TYPES = frozenset(_data["module_types"])
BUILDERS = frozenset(_data["builders"])
OPERATORS: dict[str, frozenset] = {"aten": frozenset(_data["aten_ops"]), "prims": frozenset(_data["prims_ops"])}
"""Op names of torch's operator namespaces (``torch.ops.aten.NAME[.OVERLOAD]``)."""

RANDOM_FUNCTIONS = frozenset(_data["random_functions"])
RANDOM_METHODS = frozenset(_data["random_methods"])
RANDOM_MODULE_TYPES = frozenset(_data["random_module_types"])
RANDOM_OPERATORS: dict[str, frozenset] = {"aten": frozenset(_data["random_aten_ops"]),
                                          "prims": frozenset(_data["random_prims_ops"])}
"""Flags on the table: the names that draw random numbers (ops tagged ``nondeterministic_seeded`` by
torch, functions and methods of their names, reviewed additions; ``scripts/gen_allowlist.py``). Rules
may name them everywhere the table allows; an ``[exact]``/``[approx]`` replacement may not introduce
them (:mod:`fxrules.lang.check.introduced`)."""

del _data  # the file's lists: the frozensets above are what is kept

_OVERLOAD = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
"""An overload name (``default``, ``Tensor``, ``using_ints``): never private, never a packet method."""

_PACKET_ATTRIBUTES = frozenset({"overloads", "op", "name", "default_overload"})
"""Attributes of an OpOverloadPacket that are not overloads."""


class Position(enum.Enum):
    """Where a call_function target or call_method name appears: patterns only compare names."""

    PATTERN = "pattern"
    REPLACEMENT = "replacement"
    EXAMPLE = "example"


def _under(path: str, packages: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in packages)


def _operator(path: str) -> bool:
    """``torch.ops.NS.NAME`` or ``torch.ops.NS.NAME.OVERLOAD`` for a listed op of an allowed namespace."""
    parts = path.split(".")
    if len(parts) not in (4, 5) or parts[0] != "torch" or parts[1] != "ops":
        return False
    names = OPERATORS.get(parts[2])
    if names is None or parts[3] not in names:
        return False
    return len(parts) == 4 or (_OVERLOAD.match(parts[4]) is not None and parts[4] not in _PACKET_ATTRIBUTES)


def _tensor_method_path(path: str) -> bool:
    """``torch.Tensor.NAME`` as a call_function target (a traced method call can look like this)."""
    head, _, name = path.rpartition(".")
    return head == "torch.Tensor" and name in TENSOR_METHODS


def random_function(path: str) -> bool:
    """Whether a call_function target (a function, ``torch.Tensor.NAME``, an op) draws random numbers."""
    parts = path.split(".")
    if len(parts) >= 4 and parts[0] == "torch" and parts[1] == "ops":
        return parts[3] in RANDOM_OPERATORS.get(parts[2], ())
    if _tensor_method_path(path):
        return parts[-1] in RANDOM_METHODS
    return path in RANDOM_FUNCTIONS


def random_method(name: str) -> bool:
    """Whether a call_method name draws random numbers."""
    return name in RANDOM_METHODS


def random_module_type(path: str) -> bool:
    """Whether a module type's forward draws random numbers (in training mode)."""
    return path in RANDOM_MODULE_TYPES


def function_allowed(path: str, position: Position, packages: Iterable[str] = ()) -> bool:
    if path in FUNCTIONS or _operator(path) or _tensor_method_path(path):
        return True
    if position is Position.PATTERN and path in MATCH_ONLY_FUNCTIONS:
        return True
    return _under(path, packages)


def refuse_function(path: str, position: Position, packages: Iterable[str] = ()) -> Optional[str]:
    """A call_function target: tensor math, operators, pure builtins (see the module docstring)."""
    if function_allowed(path, position, packages):
        return None
    if path in MATCH_ONLY_FUNCTIONS:
        return (f"a {position.value} may not create calls to `{path}`: it reaches arbitrary attributes or "
                f"callables, or costs time growing with its arguments' values, when the model runs (patterns may "
                f"match it)")
    return (f"`{path}` is not on fxrules' allow-list of call_function targets (tensor math of torch, "
            f"torch.nn.functional, torch.special, torch.linalg, torch.fft, aten/prims operators, operator, "
            f"math and pure builtins)")


def refuse_method(name: str, position: Position) -> Optional[str]:
    """A call_method name: a public Tensor method without effects outside its outputs."""
    if name in TENSOR_METHODS:
        return None
    return f"`{name}` is not on fxrules' allow-list of Tensor methods"


def refuse_module_type(path: str, packages: Iterable[str] = ()) -> Optional[str]:
    """A call_module type: a ``torch.nn`` module class, or one from an allowed package."""
    if path in MODULE_TYPES or _under(path, packages):
        return None
    return (f"`{path}` is not on fxrules' allow-list of module types (the module classes of torch.nn, "
            f"or of a package allowed with --allow-import)")


def refuse_builder(path: str, packages: Iterable[str] = ()) -> Optional[str]:
    """A module builder: fxrules.builders' own, or one from an allowed package."""
    if path in BUILDERS or _under(path, packages):
        return None
    return (f"`{path}` is not a builder fxrules allows: the builders of fxrules.builders, or functions of a "
            f"package allowed with --allow-import")


def refuse_constant(path: str, packages: Iterable[str] = ()) -> Optional[str]:
    """A dotted value (an argument, a condition operand): a dtype, layout or number, or an allowed function."""
    if (path in CONSTANTS or path in FUNCTIONS or _operator(path) or _tensor_method_path(path)
            or _under(path, packages)):
        return None
    return (f"`{path}` is not on fxrules' allow-list of constants (dtypes, layouts, memory formats, numbers) "
            f"or functions")


def refuse_condition_call(path: str, packages: Iterable[str] = ()) -> Optional[str]:
    """A dotted call in a condition: only functions of packages the user allowed (their own predicates)."""
    if _under(path, packages):
        return None
    return (f"a condition may not call `{path}`: conditions call the built-in predicates, the pure builtins "
            f"they know by bare name, and functions of packages allowed with --allow-import")


PYTHON_ROOTS = ("builtins", "operator", "math")
"""Modules whose functions compute on Python values (not tensors): their cost is the values'."""


def _literal_only(expr: object) -> bool:
    """An expression made of literals, constants and calls on them only: its value is the rule file's alone.
    A computed value (``{...}``) counts as one: the rule file can make it as large as the condition budget."""
    if isinstance(expr, A.Name):
        return len(expr.dotted.parts) > 1  # a constant; one part names a node (`as`)
    if isinstance(expr, (A.Literal, A.Computed)):
        return True
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return all(_literal_only(item) for item in expr.items)
    if isinstance(expr, A.Call) and expr.op == "call_function" and expr.args is not None:
        return (all(_literal_only(a) for a in expr.args if not isinstance(a, A.Ellipsis_))
                and all(_literal_only(k.value) for k in expr.kwargs))
    return False


def refuse_literal_call(path: str, call: A.Call) -> Optional[str]:
    """A replacement's or example's call of a ``builtins``/``operator``/``math`` function on literals only.

    Its value depends on the rule file alone, so the author can write it; computed, it runs when the
    rewritten model runs *and* in apply_rules' shape propagation, where ``builtins.sum(builtins.range(10**12))``
    or ``operator.mul([0], 10**10)`` cost hours or gigabytes from a few bytes of file.
    """
    if path.split(".", 1)[0] not in PYTHON_ROOTS or not call.args and not call.kwargs or not _literal_only(call):
        return None
    return (f"a rule may not call `{path}` on literals only: its value depends on the rule file alone (write the "
            f"value), and computing it can cost unbounded time or memory")


def packages_of(allow_imports: Iterable[str]) -> frozenset:
    """The user's allowed packages, minus the roots fxrules decides by its table."""
    return frozenset(p for p in allow_imports if p.split(".", 1)[0] not in ("torch", "operator", "math", "builtins",
                                                                            "fxrules"))
