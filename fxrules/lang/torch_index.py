"""What the checker needs to know of a name, without importing torch where the shipped index answers.

``fxrules check`` used to import torch (~1-2 s cold) to learn, of every dotted name a rule file
uses, what it names: a module, a class, an ``nn.Module`` class and its constructor's parameters,
a callable or a value. The checker needs only these :class:`Facts`, never the object. The shipped
index (``fxrules/lang/torch_index.json``, made from torch by ``python -m fxrules.tools.indexes``)
holds them for every name under torch and fxrules that the allow-list permits, the overloads of every
aten and prims op, and the attributes of ``torch.Tensor``.

The index answers only while the installed torch has the release it was made from (read from
``torch/version.py`` without importing torch; the local build label, ``+cpu`` or ``+cu121``, is
ignored: builds of one release have the same Python API and op registry), and only for names it
holds: anything else (a typo, a name of another torch, a user's package) is a miss, and the
:class:`fxrules.lang.names.Resolver` resolves it as before, importing torch. Misses are rare in
valid files (an index holds every name the allow-list permits), so a clean check never imports
torch. The index holds only names whose resolution is ``ok`` under the default import policy, which
user-allowed packages only widen, so an answer from it is what resolving would say.
``tests/tools/test_indexes.py`` checks every entry against the installed torch.

Nothing here imports or runs anything: lookups in frozen tables.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional

from fxrules.lang import packaged

INDEXED_ROOTS = ("torch", "fxrules")
"""Top-level packages whose names the index holds (fxrules' own builders import torch)."""


class Kind(enum.Enum):
    """What a name resolves to, as far as the checker cares."""

    MODULE = "module"
    CLASS = "class"
    MODULE_CLASS = "module_class"  # an nn.Module subclass
    CALLABLE = "callable"  # a function, builtin, op packet or overload, or another callable object
    VALUE = "value"  # a dtype, layout, number, ...


@dataclass(frozen=True, slots=True)
class Constructor:
    """An ``nn.Module`` class's constructor: its named parameters (positional-or-keyword and
    keyword-only, without ``self``, in order) and those without a default."""

    parameters: tuple[str, ...]
    required: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Facts:
    """What the checker knows of a resolved name. ``name``: a module class's ``__name__``;
    ``constructor``: its constructor, None when it has no signature or takes ``**kwargs``
    (it accepts anything)."""

    kind: Kind
    is_callable: bool
    name: str = ""
    constructor: Optional[Constructor] = None

    def constructor_data(self) -> tuple:
        """(name, parameters, required), the index's form of a module class."""
        if self.constructor is None:
            return (self.name, None, None)
        return (self.name, self.constructor.parameters, self.constructor.required)


def describe(value: Any) -> Facts:
    """The facts of a resolved object: what the index records, and what a miss is checked by."""
    if isinstance(value, ModuleType):
        kind = Kind.MODULE
    elif isinstance(value, type):
        kind = Kind.MODULE_CLASS if _nn_module_class(value) else Kind.CLASS
    elif callable(value):
        kind = Kind.CALLABLE
    else:
        kind = Kind.VALUE
    if kind is not Kind.MODULE_CLASS:
        return Facts(kind, callable(value))
    return Facts(kind, True, value.__name__, constructor_of(value))


def _nn_module_class(value: type) -> bool:
    """An ``nn.Module`` subclass: only possible once torch is imported (the class came from it or
    from a package that imports it), so this never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(value, torch.nn.Module)


def constructor_of(module_class: type) -> Optional[Constructor]:
    """The constructor's parameters without ``self``; None when unknown or when it takes ``**kwargs``."""
    try:
        signature = inspect.signature(module_class.__init__)
    except (TypeError, ValueError):
        return None
    parameters = [p for name, p in signature.parameters.items() if name != "self"]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None  # accepts anything
    named = [p for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return Constructor(tuple(p.name for p in named),
                       tuple(p.name for p in named if p.default is inspect.Parameter.empty))


# ---------------------------------------------------------------------------
# The shipped index
# ---------------------------------------------------------------------------

_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def release(version: str) -> str:
    """A torch version without its local build label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


@functools.lru_cache(maxsize=None)
def _installed_version() -> Optional[str]:
    """The version of the torch that ``import torch`` would load, read from its ``version.py``
    without importing it; None when torch is not installed or the file does not say."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in locations:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as file:
                found = _VERSION.search(file.read(65536))
        except OSError:
            continue
        if found:
            return found.group(1)
    return None


def torch_version() -> Optional[str]:
    """The torch this process has or would import: ``sys.modules['torch'] = None`` means none."""
    if "torch" in sys.modules:
        module = sys.modules["torch"]
        version = getattr(module, "__version__", None) if module is not None else None
        return version if isinstance(version, str) else None
    return _installed_version()


@dataclass(frozen=True, slots=True)
class IndexData:
    """The shipped index (``fxrules/lang/torch_index.json``, read by :func:`_data`): the paths of each
    :class:`Kind` but module classes, the module classes with (class name, parameters, required
    parameters) or (class name, None, None), each op's overload names by ``NAMESPACE.OP``, and the
    public attributes of ``torch.Tensor``."""

    torch_version: str
    modules: frozenset
    classes: frozenset
    callables: frozenset
    values: frozenset
    module_classes: dict  # path -> (class name, parameters or None, required parameters or None)
    operators: dict  # "aten.add" -> its overload names
    tensor_attributes: frozenset

    @classmethod
    def of(cls, data: dict) -> "IndexData":
        """From the file's object (arrays as tuples and frozensets)."""
        return cls(data["torch_version"], frozenset(data[Kind.MODULE.value]), frozenset(data[Kind.CLASS.value]),
                   frozenset(data[Kind.CALLABLE.value]), frozenset(data[Kind.VALUE.value]),
                   {path: (name, None if parameters is None else tuple(parameters),
                           None if required is None else tuple(required))
                    for path, (name, parameters, required) in data[Kind.MODULE_CLASS.value].items()},
                   {op: tuple(overloads) for op, overloads in data["operators"].items()},
                   frozenset(data["tensor_attributes"]))


INDEX_FILE = "torch_index.json"
"""The shipped index's file in ``fxrules/lang`` (:mod:`fxrules.lang.packaged`)."""


@functools.lru_cache(maxsize=None)
def _data() -> IndexData:
    return IndexData.of(packaged.read_json(INDEX_FILE))


def answers() -> bool:
    """Whether the index may answer in this process: the torch here has the index's release."""
    version = torch_version()
    return version is not None and release(version) == release(_data().torch_version)


def look_up(path: str) -> Optional[Facts]:
    """The facts of the full dotted ``path`` from the index, or None when it cannot say (a miss)."""
    if path.split(".", 1)[0] not in INDEXED_ROOTS or not answers():
        return None
    data = _data()
    entry = data.module_classes.get(path)
    if entry is not None:
        name, parameters, required = entry
        constructor = None if parameters is None else Constructor(parameters, required)
        return Facts(Kind.MODULE_CLASS, True, name, constructor)
    for kind, table, is_callable in ((Kind.CALLABLE, data.callables, True), (Kind.VALUE, data.values, False),
                                     (Kind.MODULE, data.modules, False), (Kind.CLASS, data.classes, True)):
        if path in table:
            return Facts(kind, is_callable)
    parts = path.split(".")
    if len(parts) == 5 and parts[1] == "ops":
        overloads = data.operators.get(f"{parts[2]}.{parts[3]}", ())
        if parts[4] in overloads:
            return Facts(Kind.CALLABLE, True)
    return None


def tensor_has(name: str) -> bool:
    """Whether the index knows ``torch.Tensor`` has the public attribute ``name`` (False: it cannot say)."""
    return answers() and name in _data().tensor_attributes
