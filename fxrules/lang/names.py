"""Resolving dotted names in rule files to Python objects, under an import policy.

Rule files are untrusted input: resolving ``mypkg.evil.f`` would import
``mypkg``, which runs its code. So a name resolves only when its root module is
on the allow-list (torch, operator, math, builtins, fxrules, plus what the user
allows explicitly), and names that execute code or touch the system are refused
even then. The checker and the engine both resolve through :class:`Resolver`.

Resolution never imports torch eagerly: ``fxrules check`` works without torch;
when torch is importable, names under it are checked against it. The checker asks
:meth:`Resolver.look_up`, which the shipped torch index (:mod:`fxrules.lang.torch_index`) answers
without importing torch for every name the allow-list permits; the engine asks :meth:`Resolver.resolve`
for the objects themselves.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional

from fxrules.lang import torch_index
from fxrules.lang.allowlist import packages_of
from fxrules.lang.torch_index import Facts

BUILTIN_ALIASES: Mapping[str, str] = {
    "torch": "torch",
    "nn": "torch.nn",
    "F": "torch.nn.functional",
    "operator": "operator",
    "aten": "torch.ops.aten",
    "math": "math",
    "builtins": "builtins",
}
"""Aliases every rule file has without a ``use`` line."""

PREDICATE_NAMES = frozenset({"is_zero", "is_one", "is_constant", "is_scalar", "is_floating", "frozen"})
"""The predicates conditions may call by bare name (implemented in :mod:`fxrules.engine.predicates`)."""

CONDITION_FUNCTIONS: Mapping[str, Any] = {
    name: getattr(builtins, name)
    for name in ("len", "abs", "min", "max", "all", "any", "int", "float", "bool", "round", "tuple", "sum", "range")
}
"""Pure builtins conditions may call by bare name, e.g. ``len($x.shape) == 2``."""

GENERATOR_FUNCTIONS = frozenset({"all", "any", "sum", "min", "max", "tuple"})
"""The builtins a generator may be passed to: ``all(d > 0 for d in $dims)``."""

MAX_CONDITION_ITEMS = 1 << 16
"""The most items a condition's sequence, ``range`` or generators may have or visit (every
generator of one evaluation counted together: nesting multiplies). The checker refuses a literal
``range`` over it; the engine refuses the rest when evaluating (fxrules.engine.conditions)."""

MAX_GENERATOR_DEPTH = 2
"""Generators nest at most this deep (``all(any(... for j in ...) for i in ...)``): a check-time
bound beside the engine's count of items, so a condition's cost is visible in its text."""

BINDING_PREDICATES = frozenset({"is_literal"})
"""Predicates about what a capture is bound to rather than its value: ``is_literal($k)`` holds when
``$k`` matched a literal argument (a number, string, bool, None, dtype, ..., or a list or tuple of
them), not a graph node. Implemented in :mod:`fxrules.engine.conditions`."""

USER_FUNCTIONS = frozenset({"users", "user_targets", "used_only_by"})
"""Condition functions over a matched node's users (its first argument: a capture or an ``as`` name
bound to a node): ``users($x)`` how many nodes use it, ``user_targets($x)`` their targets (a function,
a method name, a module class, or ``"output"``), ``used_only_by($x, T, ...)`` whether every user's
target is one of ``T``. Implemented in :mod:`fxrules.engine.conditions`."""

ALLOWED_ROOTS = frozenset({"torch", "operator", "math", "builtins", "fxrules"})
"""Top-level modules a rule file may name without the user allowing more."""

SAFE_BUILTINS = frozenset({
    "getattr", "len", "abs", "min", "max", "round", "sum", "all", "any", "int", "float", "bool",
    "tuple", "list", "dict", "range", "slice", "isinstance", "divmod", "pow", "hash", "id", "zip",
    "enumerate", "reversed", "sorted", "str", "repr", "type",
})
"""Builtins that a bare call_function target (``call_function getattr``) may name."""

# Names that execute code, load code or data, or touch the file system, network or process.
_FORBIDDEN_PREFIXES = (
    "os", "posix", "nt", "subprocess", "importlib", "sys", "shutil", "socket", "pickle", "marshal",
    "ctypes", "runpy", "code", "codeop", "pty", "signal", "multiprocessing", "threading", "asyncio",
    "builtins.eval", "builtins.exec", "builtins.compile", "builtins.open", "builtins.__import__",
    "builtins.input", "builtins.breakpoint", "builtins.globals", "builtins.locals", "builtins.vars",
    "builtins.setattr", "builtins.delattr", "builtins.exit", "builtins.quit", "builtins.help",
    "torch.load", "torch.save", "torch.hub", "torch.ops.load_library", "torch.classes.load_library",
    "torch.utils.cpp_extension", "torch.utils.data", "torch.package", "torch.jit.load", "torch.jit.save",
    "torch.serialization", "torch.compile", "torch._dynamo", "torch._inductor", "torch.distributed",
    "torch.multiprocessing", "torch.cuda.memory._record_memory_history", "torch.profiler",
    "torch.utils.tensorboard", "torch.library", "torch.backends", "torch.set_default_device",
    "torch.manual_seed", "torch.seed", "torch.set_num_threads", "torch.overrides",
)


def is_forbidden(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in _FORBIDDEN_PREFIXES)


@dataclass(frozen=True, slots=True)
class Resolution:
    """The outcome of resolving one name.

    ``status``: ``ok`` (``value`` holds the object), ``unavailable`` (its root
    module, torch, is not installed: nothing can be said), or an error code
    (``unknown-target``, ``import-not-allowed``, ``forbidden-target``,
    ``unknown-alias``, ``not-allowed``) with ``message``. ``facts``: what an ``ok`` name is, set by
    :meth:`Resolver.look_up` (whose answers from the torch index have no ``value``).
    """

    status: str
    path: str
    value: Any = None
    message: str = ""
    facts: Optional[Facts] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_error(self) -> bool:
        return self.status not in ("ok", "unavailable")


def expand(parts: tuple[str, ...], aliases: Mapping[str, str]) -> Optional[str]:
    """The full dotted path of a name as written, or None when its head is no alias."""
    head = parts[0]
    if head in aliases:
        return ".".join((aliases[head],) + parts[1:])
    if head in BUILTIN_ALIASES:
        return ".".join((BUILTIN_ALIASES[head],) + parts[1:])
    return None


class Resolver:
    """Resolves full dotted paths to objects under an import policy; results are cached.

    ``allow_imports`` names extra top-level packages (or dotted prefixes) the
    user trusts. One Resolver can be shared between threads.
    """

    def __init__(self, allow_imports: Iterable[str] = ()):
        self.allow_imports = frozenset(allow_imports)
        self.packages = packages_of(self.allow_imports)
        """The user's packages the allow-list trusts (fxrules.lang.allowlist): allow-imports minus the roots
        fxrules decides by its table, so `--allow-import torch` does not open torch."""
        self._cache: dict[str, Resolution] = {}
        self._looked: dict[str, Resolution] = {}
        self._lock = threading.Lock()

    def __reduce__(self):
        """Pickled as its policy (the caches and lock are per process): rule sets go to verify's workers."""
        return (Resolver, (tuple(sorted(self.allow_imports)),))

    def allowed(self, path: str) -> bool:
        """Whether ``path`` is inside an allowed root or an allowed package."""
        if path.split(".", 1)[0] in ALLOWED_ROOTS:
            return True
        return any(path == p or path.startswith(p + ".") for p in self.allow_imports)

    def on_the_way(self, module: str) -> bool:
        """Whether ``module`` is allowed or a parent package of an allowed one (imported with it anyway)."""
        return self.allowed(module) or any(p.startswith(module + ".") for p in self.allow_imports)

    def resolve(self, path: str) -> Resolution:
        with self._lock:
            cached = self._cache.get(path)
        if cached is not None:
            return cached
        result = self._resolve(path)
        with self._lock:
            self._cache[path] = result
        return result

    def look_up(self, path: str) -> Resolution:
        """What the checker needs of a name: its status and, when ``ok``, its ``facts`` (no ``value``
        when the torch index answered). The index answers, without importing anything, for the names
        it holds while the installed torch is the one it was made from; any other name is resolved."""
        with self._lock:
            cached = self._looked.get(path)
        if cached is not None:
            return cached
        facts = None if is_forbidden(path) else torch_index.look_up(path)
        if facts is not None:
            result = Resolution("ok", path, facts=facts)
        else:
            result = self.resolve(path)
            if result.ok:
                result = replace(result, facts=torch_index.describe(result.value))
        with self._lock:
            self._looked[path] = result
        return result

    def _resolve(self, path: str) -> Resolution:
        if is_forbidden(path):
            return Resolution("forbidden-target", path,
                              message=f"`{path}` executes code or touches the system; rule files may never name it")
        parts = path.split(".")
        root = parts[0]
        if not self.allowed(path):
            if _locatable(root):
                return Resolution("import-not-allowed", path,
                                  message=f"resolving `{path}` would import `{root}` and run its code; "
                                          f"allow it explicitly (--allow-import {root}, or allow-imports = "
                                          f"[\"{root}\"] in [tool.fxrules])")
            return Resolution("unknown-alias", path,
                              message=f"`{root}` is neither an alias (declare one with `use ... as {root}`) "
                                      f"nor an importable module (a module of your project: name it in "
                                      f"allow-imports and its folder in python-path, in [tool.fxrules])")
        if root == "torch" and not torch_available():
            return Resolution("unavailable", path, message="torch is not installed")
        try:
            value: Any = importlib.import_module(root)
        except ImportError as exc:  # a project's own builders import torch: without it, nothing can be said
            if exc.name == "torch" and not torch_available():
                return Resolution("unavailable", path, message="torch is not installed")
            hint = ("; put the folder holding it on the path (python-path = [\"FOLDER\"] in [tool.fxrules], "
                    "or PYTHONPATH)" if exc.name == root else "")
            return Resolution("unknown-target", path, message=f"cannot import `{root}`: {exc}{hint}")
        except Exception as exc:  # an allowed module that fails to import
            return Resolution("unknown-target", path, message=f"cannot import `{root}`: {exc}")
        for i, part in enumerate(parts[1:], start=1):
            if part.startswith("__"):
                return Resolution("forbidden-target", path,
                                  message=f"`{path}` names a dunder attribute; rule files may not")
            if _new_torch_submodule(value, part):
                return Resolution("not-allowed", path,
                                  message=f"resolving `{path}` would import `{value.__name__}.{part}`, a torch "
                                          f"module `import torch` does not load; rule files name only what "
                                          f"the allow-list permits")
            try:
                value = getattr(value, part)
                if isinstance(value, type(sys)) and not self.on_the_way(value.__name__):
                    return Resolution("forbidden-target", path,
                                      message=f"`{'.'.join(parts[:i + 1])}` is the module `{value.__name__}`, "
                                              f"which rule files may not reach")
                continue
            except AttributeError:
                pass
            except ImportError as exc:  # a lazy attribute that imports, e.g. fxrules.builders needs torch
                if exc.name == "torch" or not torch_available():
                    return Resolution("unavailable", path, message="torch is not installed")
                return Resolution("unknown-target", path, message=f"`{path}` does not resolve: {exc}")
            except Exception as exc:  # a lazy attribute that fails
                return Resolution("unknown-target", path, message=f"`{path}` does not resolve: {exc}")
            prefix = ".".join(parts[: i + 1])
            if isinstance(value, type(sys)) and _locatable_submodule(prefix):
                try:
                    value = importlib.import_module(prefix)
                    continue
                except ImportError as exc:
                    if exc.name == "torch" or not torch_available():  # e.g. fxrules.builders needs torch
                        return Resolution("unavailable", path, message="torch is not installed")
                    return Resolution("unknown-target", path, message=f"cannot import `{prefix}`: {exc}")
                except Exception as exc:
                    return Resolution("unknown-target", path, message=f"cannot import `{prefix}`: {exc}")
            owner = ".".join(parts[:i])
            return Resolution("unknown-target", path, message=f"`{owner}` has no attribute `{part}`")
        origin = _origin_problem(value, self)
        if origin is not None:
            return Resolution("forbidden-target", path, message=f"`{path}` {origin}")
        return Resolution("ok", path, value)


_MODULE_ALIASES = {"_operator": "operator", "posixpath": "os", "ntpath": "os", "posix": "os", "nt": "os"}


def _origin_problem(value: Any, resolver: "Resolver") -> Optional[str]:
    """Why a resolved object may not be named: it is defined in a module outside the policy.

    A name under an allowed root can still reach other modules' objects through re-exports
    (``some_torch_module.os.system``); the object's own module decides.
    """
    if isinstance(value, type(sys)):
        if not resolver.on_the_way(value.__name__):
            return f"is the module `{value.__name__}`, which rule files may not reach"
        return None
    if not callable(value):
        return None
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        return None
    root = module.split(".", 1)[0]
    root = _MODULE_ALIASES.get(root, root)
    module = root + ("." + module.split(".", 1)[1] if "." in module else "")
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
    origin = f"{module}.{qualname}"
    if is_forbidden(origin) or is_forbidden(f"{root}.{qualname}"):
        return f"is `{origin}`, which executes code or touches the system"
    if not resolver.allowed(module) and root not in ("typing", "abc", "functools", "collections", "enum"):
        return f"is defined in `{module}`, outside the import allow-list"
    return None


def _new_torch_submodule(module: Any, part: str) -> bool:
    """Whether ``module.part`` is a torch submodule not imported yet (``torch.onnx``, ``torch.utils.collect_env``).

    Importing it would run its code for a name the allow-list refuses anyway: every module
    the table names (torch.nn.functional, torch.special, torch.linalg, torch.fft, torch.ops)
    is loaded by ``import torch``. ``torch.ops`` namespaces are objects, not plain modules.
    """
    if type(module) is not type(sys) or not module.__name__.startswith("torch") or part in vars(module):
        return False
    name = f"{module.__name__}.{part}"
    return name not in sys.modules and _locatable_submodule(name)


def _locatable(name: str) -> bool:
    """Whether a top-level module exists, without importing (and so running) it."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _locatable_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def builtin_path(name: str) -> Optional[str]:
    """``builtins.NAME`` for a bare call_function target that names a safe builtin."""
    if name in SAFE_BUILTINS and hasattr(builtins, name):
        return f"builtins.{name}"
    return None


def torch_available() -> bool:
    """Whether ``import torch`` can work (``sys.modules['torch'] = None`` means it cannot)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    return _locatable("torch")
