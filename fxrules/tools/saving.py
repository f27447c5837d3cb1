"""Save a rewritten GraphModule to a directory and load it back: ``fxrules apply --out DIR``.

The format (``fxrules-saved-module``, version 1) is three files:

``module.py``
    The module's code, as plain Python: an import block, then ``def forward(self, ...)``,
    exactly the code of the GraphModule (``GraphModule.code``). Read it, diff it, review it.
``modules.pt``
    ``torch.save`` of a dict holding everything ``forward`` reads from ``self``: the
    submodules (``children``, with their weights), and the root's own ``parameters``,
    ``buffers`` (with ``persistent`` names) and other ``attributes`` (such as the pytree
    specs of an exported module).
``manifest.json``
    ``{"format": "fxrules-saved-module", "version": 1, "class_name": ..., "training": ...,
    "fxrules": ..., "torch": ..., "files": [...], "dropped": [...]}`` plus whatever the
    caller adds under ``"info"`` (``fxrules apply`` records the model, rules and inputs).

:func:`load_saved` rebuilds the module: it imports ``module.py``, unpickles
``modules.pt`` into a module of the saved class name, and traces ``forward`` with every
submodule as a leaf, which gives a ``torch.fx.GraphModule`` with the same code (the same
way torch rebuilds a pickled GraphModule).

Why not ``torch.save(graph_module)``: with torch 2.13 it fails for every traced module
(the code's globals hold a string, ``_Tensor_``, that torch's import-block writer cannot
name) and for every module unlifted from ``torch.export`` (its hooks are local lambdas),
and it hides the code inside a pickle. Here the code is a file of its own and only the
module objects are pickled.

Trust: loading runs ``module.py`` and unpickles ``modules.pt`` (``weights_only=False``):
load only directories you (or your own pipeline) wrote, as you would import only code
you trust. The pickle names the submodules' classes by import path (``torch.nn.Conv2d``,
or a model's own leaf modules), so they must be importable where the directory is
loaded; a submodule that does not pickle is refused when saving, by name.

Exported modules: torch.export's input guard (the ``_guards_fn`` submodule, which checks
input shapes against the export's constraints and returns nothing) holds local
functions and cannot be pickled; it is left out and named in the manifest's
``dropped``. The loaded module computes the same outputs.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import itertools
import json
import math
import os
import re
import types
import warnings
from pathlib import Path
from typing import Any, Optional, Union

from fxrules.lang.diagnostics import FxrulesError

FORMAT = "fxrules-saved-module"
VERSION = 1
CODE_FILE, STATE_FILE, MANIFEST_FILE = "module.py", "modules.pt", "manifest.json"
FILES = (CODE_FILE, STATE_FILE, MANIFEST_FILE)

__all__ = ["FILES", "FORMAT", "SaveError", "VERSION", "load_saved", "save_module"]


class SaveError(FxrulesError):
    """The module cannot be saved, or a directory does not hold a saved module."""


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


def save_module(module: Any, directory: Union[str, "os.PathLike[str]"], *, info: Optional[dict] = None) -> Path:
    """Write ``module`` (a ``torch.fx.GraphModule``) to ``directory`` (created if missing); returns its path.

    Raises :class:`SaveError` when the module holds something that cannot be saved (a
    submodule or value that does not pickle, code that uses an object with no import
    path) and ``OSError`` when the directory cannot be written. Files other than
    module.py, modules.pt and manifest.json in the directory are left alone.
    """
    import torch
    from torch import fx

    from fxrules.engine import fxaccess

    if not isinstance(module, fx.GraphModule):
        raise SaveError(f"can only save a torch.fx.GraphModule, not {type(module).__name__}")
    with warnings.catch_warnings():  # copying torch.export's pytree specs warns about a deprecated isinstance
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)
        graph = copy.deepcopy(module.graph)
    dropped = _drop_guards(graph, module)
    code = graph.python_code(root_module="self")
    source = _module_source(code.src, code.globals, type(module).__name__)

    state: dict = {"children": {}, "parameters": {}, "buffers": {}, "persistent": [], "attributes": {}}
    registered = fxaccess.registered_values(module)
    for name in _root_names(graph, code.src):
        if name in registered.children:
            state["children"][name] = registered.children[name]
        elif name in registered.parameters:
            state["parameters"][name] = registered.parameters[name]
        elif name in registered.buffers:
            state["buffers"][name] = registered.buffers[name]
            if name not in registered.non_persistent:
                state["persistent"].append(name)
        elif name in module.__dict__:
            state["attributes"][name] = module.__dict__[name]
        else:
            raise SaveError(f"the code reads self.{name}, which the module does not have")
    for kind in ("children", "attributes"):
        for name, value in state[kind].items():
            _check_pickles(value, f"self.{name} ({type(value).__name__})")

    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "class_name": type(module).__name__,
        "training": bool(module.training),
        "fxrules": _fxrules_version(),
        "torch": torch.__version__,
        "files": list(FILES),
        "dropped": dropped,
        "info": info or {},
    }
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / CODE_FILE).write_text(source, encoding="utf-8")
    torch.save(state, path / STATE_FILE)
    (path / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def _drop_guards(graph: Any, module: Any) -> list[str]:
    """Erase calls to torch.export's input guard (results unused): it cannot be pickled."""
    dropped = []
    for node in list(graph.nodes):
        if node.op == "call_module" and not node.users:
            try:
                target = module.get_submodule(node.target)
            except AttributeError:
                continue
            if type(target).__name__ == "GuardsFn" and type(target).__module__.startswith("torch.export"):
                graph.erase_node(node)
                dropped.append(f"{node.target} (torch.export input guard)")
    return dropped


_SELF_ATTR = re.compile(r"\bself\.([A-Za-z_]\w*)")
_SELF_GETATTR = re.compile(r"\bgetattr\(self, (['\"])(.*?)\1\)")


def _root_names(graph: Any, src: str) -> list[str]:
    """The names ``forward`` reads from ``self``: graph targets' first parts and attributes in the code."""
    names: dict[str, None] = {}
    for node in graph.nodes:
        if node.op in ("call_module", "get_attr"):
            names[str(node.target).split(".")[0]] = None
    for match in _SELF_ATTR.finditer(src):
        names[match.group(1)] = None
    for match in _SELF_GETATTR.finditer(src):
        names[match.group(2)] = None
    return list(names)


def _check_pickles(value: Any, what: str) -> None:
    import io
    import pickle

    try:
        pickle.dump(value, io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise SaveError(f"cannot save {what}: it does not pickle ({type(exc).__name__}: {exc})") from None


def _module_source(src: str, globals_: dict, class_name: str) -> str:
    lines = [
        f"# The code of a {class_name} rewritten by fxrules (format {FORMAT} {VERSION}).",
        "# Load it with fxrules.load_saved(<this directory>): this file holds forward(),",
        "# modules.pt the submodules and weights it reads from self.",
    ]
    imports = sorted({_import_line(name, value) for name, value in globals_.items()})
    lines.extend(imports)
    return "\n".join(lines) + "\n" + src.rstrip() + "\n"


def _import_line(name: str, value: Any) -> str:
    """A statement binding ``name`` to ``value`` at the top of module.py."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__}" if name == value.__name__ else f"import {value.__name__} as {name}"
    if value is None or isinstance(value, (bool, int, str)):
        return f"{name} = {value!r}"
    if isinstance(value, float):
        return f"{name} = {value!r}" if math.isfinite(value) else f"{name} = float({str(value)!r})"
    if value is type(None):
        return f"{name} = type(None)"
    module_name = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(module_name, str) and isinstance(qualname, str) and "<" not in qualname \
            and _resolve(module_name, qualname) is value:
        if "." not in qualname:
            return f"from {module_name} import {qualname}" + (f" as {name}" if name != qualname else "")
        return f"import {module_name}; {name} = {module_name}.{qualname}"
    try:  # torch's own naming (pickle's whichmodule), for objects whose __module__ is off
        from torch.package import sys_importer

        module_name, attr = sys_importer.get_name(value)
        if _resolve(module_name, attr) is value:
            return f"import {module_name}; {name} = {module_name}.{attr}"
    except Exception:
        pass
    raise SaveError(f"cannot save: the code uses `{name}` ({value!r}), which has no import path")


def _resolve(module_name: str, qualname: str) -> Any:
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        return target
    except Exception:
        return None


def _fxrules_version() -> str:
    from fxrules import __version__

    return __version__


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

_counter = itertools.count()


def _missing_code(file: Path, exc: BaseException) -> str:
    """Why a saved module does not load when the code it names (a custom module class, a wrapped
    function) is not importable here, and what to do about it."""
    name = getattr(exc, "name", None)
    what = f"module `{name}`" if isinstance(exc, ImportError) and name else "a class or function"
    return (f"cannot load {file}: it needs {what}, which this process cannot import ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); the saved module keeps the model's own classes "
            f"(custom nn.Module subclasses are pickled by reference): make the package that defines them "
            f"importable (install it, or put its folder on sys.path / PYTHONPATH) before load_saved")


def load_saved(directory: Union[str, "os.PathLike[str]"]) -> Any:
    """Load a module saved by :func:`save_module` (``fxrules apply --out``): a ``torch.fx.GraphModule``.

    Runs the directory's ``module.py`` and unpickles its ``modules.pt``: load only what you trust.
    Raises :class:`SaveError` when the directory does not hold a saved module of a known version.
    """
    import torch
    from torch import fx, nn

    path = Path(directory)
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SaveError(f"{path} holds no saved module (no {MANIFEST_FILE})") from None
    except (OSError, ValueError) as exc:
        raise SaveError(f"cannot read {path / MANIFEST_FILE}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SaveError(f"{path / MANIFEST_FILE} is not an fxrules saved-module manifest")
    if manifest.get("version") != VERSION:
        raise SaveError(f"{path} was saved in format version {manifest.get('version')!r}; this fxrules reads "
                        f"version {VERSION}")
    spec = importlib.util.spec_from_file_location(f"_fxrules_saved_{next(_counter)}", path / CODE_FILE)
    if spec is None or spec.loader is None:
        raise SaveError(f"cannot load {path / CODE_FILE}")
    code = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(code)
    except ImportError as exc:
        raise SaveError(_missing_code(path / CODE_FILE, exc)) from exc
    try:
        with warnings.catch_warnings():  # unpickling torch.export's pytree specs warns about a deprecated isinstance
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)
            state = torch.load(path / STATE_FILE, weights_only=False)  # trusted input only (see the docstring)
    except (ImportError, AttributeError) as exc:  # pickle names a class this process cannot find
        raise SaveError(_missing_code(path / STATE_FILE, exc)) from exc

    class_name = str(manifest.get("class_name") or "SavedModule")
    holder_class = type(class_name, (nn.Module,), {"forward": code.forward})
    root = holder_class()
    for name, child in state["children"].items():
        root.add_module(name, child)
    for name, parameter in state["parameters"].items():
        root.register_parameter(name, parameter)
    persistent = set(state["persistent"])
    for name, buffer in state["buffers"].items():
        root.register_buffer(name, buffer, persistent=name in persistent)
    for name, value in state["attributes"].items():
        setattr(root, name, value)
    root.training = bool(manifest.get("training", False))

    class _KeepModules(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return True

    graph = _KeepModules().trace(root)
    module = fx.GraphModule(root, graph, class_name=class_name)
    module.training = root.training
    return module
