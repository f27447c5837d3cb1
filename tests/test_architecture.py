"""The package's shape: four subpackages whose imports run one way, a small public root.

Layers, lowest first (docs/architecture.md):

    lang  <-  engine  <-  verifier  <-  root (the public surface)  <-  tools

A module may import from its own layer and from layers below it, never above. "Import" means
any ``import``/``from ... import`` statement anywhere in the module (function-level imports
included): a lazy import upward is still a dependency upward. ``python -m fxrules``
(``fxrules/__main__.py``) is a tool; ``import fxrules`` names a few tools' results lazily
(``fxrules.load_saved``), by module path in a table, which this test does not count. No module imports a private
name (``_x``) from a module of another subpackage or layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fxrules"

LAYERS = {"lang": 0, "engine": 1, "verifier": 2, "root": 3, "tools": 4}
ROOT_MODULES = {"__init__", "__main__", "api", "errors", "builders", "predicates", "testing", "integration", "zoo"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    if module == "fxrules.__main__":  # `python -m fxrules` is the command line
        return "tools"
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] not in LAYERS):
        return "root"
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module imported, names taken from it) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, alias.name, []))
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (the package uses absolute ones)"
            names = [a.name for a in node.names]
            module = node.module or ""
            # `from fxrules import x` may name a submodule x
            subs = [n for n in names if f"{module}.{n}" in MODULES]
            if subs:
                found.extend((node.lineno, f"{module}.{n}", []) for n in subs)
                names = [n for n in names if n not in subs]
            found.append((node.lineno, module, names))
    return [f for f in found if f[1] == "fxrules" or f[1].startswith("fxrules.")]


def test_the_package_root_holds_the_public_surface_only():
    root_modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert root_modules == ROOT_MODULES
    assert len(root_modules) <= 12
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert subpackages == {"lang", "engine", "verifier", "tools"}


def test_the_layer_test_sees_every_import():
    """The walk below is not vacuous: it finds the engine importing the language, a lazy import included."""
    lines = {m for _, m, _ in _imports(MODULES["fxrules.engine.driver"])}
    assert "fxrules.lang.ruleset" in lines
    lazy = {m for _, m, _ in _imports(MODULES["fxrules.verifier.driver"])}
    assert "fxrules.engine.driver" in lazy


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.slow
def test_imports_run_one_way(module):
    here = _layer(module)
    wrong = []
    for line, imported, _names in _imports(MODULES[module]):
        if imported == "fxrules":
            there = "root"
        else:
            target = imported if imported in MODULES else imported.rsplit(".", 1)[0]
            there = _layer(target)
        if LAYERS[there] > LAYERS[here]:
            wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {here} imports {imported} ({there})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_cross_subpackages(module):
    here = _layer(module)
    wrong = []
    for line, imported, names in _imports(MODULES[module]):
        there = "root" if imported == "fxrules" else _layer(imported)
        if there == here:
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private:
            wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line}: imports {private} from {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_language_imports_with_torch_blocked():
    """Every module of fxrules.lang, and the front-end API, import and parse with torch unavailable."""
    names = sorted(m for m in MODULES if m.startswith("fxrules.lang"))
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # `import torch` raises ImportError
        f"for name in {names!r}:\n"
        "    __import__(name)\n"
        "import fxrules, fxrules.errors, fxrules.predicates\n"
        "rules = fxrules.parse_rules('rule r [exact]:\\n    call_function torch.relu(call_function torch.relu($x)) "
        "-> call_function torch.relu($x)\\n')\n"
        "assert [r.name for r in rules] == ['r'], rules\n"
        "assert sys.modules['torch'] is None\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"


def test_predicate_names_match_the_predicates():
    from fxrules.engine.predicates import PREDICATES
    from fxrules.lang.names import PREDICATE_NAMES

    assert PREDICATE_NAMES == frozenset(PREDICATES)


def _torch_private_names() -> set[str]:
    """Private member names of the torch objects fxrules works on (nodes, graphs, graph modules,
    modules, operators, tensors) and of torch's modules themselves."""
    import torch
    from torch import fx, nn

    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    objects = [gm, gm.graph, next(iter(gm.graph.nodes)), nn.Linear(2, 2), torch.ops.aten.add,
               torch.ops.aten.add.Tensor, torch.zeros(1), torch, torch.fx, torch.nn, torch.ops]
    names = set()
    for obj in objects:
        for name in set(dir(obj)) | set(getattr(obj, "__dict__", {})):
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


@pytest.mark.slow
def test_private_torch_members_are_touched_in_fxaccess_only():
    """Every private torch member (``node._erased``, ``module._modules``, ``torch._ops``, an import
    of ``torch._subclasses``...) is reached through fxrules.engine.fxaccess, where each fast path
    sits beside its public equivalent (docs/architecture.md), or in fxrules.engine.codegen, the
    source writer that is fxaccess's fast path of ``recompiling`` (torch's own writer its public one)."""
    private = _torch_private_names()
    assert {"_erased", "_modules", "_parameters", "_find_nodes_lookup_table", "_ops"} <= private
    wrong = []
    for module, path in MODULES.items():
        if module in ("fxrules.engine.fxaccess", "fxrules.engine.codegen"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = ast.unparse(node.value)
                if owner not in ("self", "cls") and not owner.endswith("aten"):  # aten._softmax is an op
                    wrong.append(f"{where}: {ast.unparse(node)}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                wrong.extend(f"{where}: import {n}" for n in names
                             if n.split(".")[0] == "torch" and any(p.startswith("_") for p in n.split(".")))
    assert not wrong, "\n".join(wrong)
