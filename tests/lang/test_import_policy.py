"""The import policy end to end: hostile rule files are never imported or run.

Rule files are untrusted input (SECURITY.md). A file naming ``os.system``,
``subprocess.run``, ``builtins.eval``, ``torch.load``, a builder in a package the user did
not allow, or anything in ``tests/fixtures/sideeffect_pkg`` (a package whose import writes
a marker file named by the environment variable ``FXRULES_MARKER``) must get a located
diagnostic (``forbidden-target`` or ``import-not-allowed``) from ``fxrules check`` (run as
a subprocess), ``fxrules.load_rules`` and ``fxrules.apply_rules``, and none of them may
import the package: the marker file must not appear. Allowing the package
(``allow_imports=["tests.fixtures.sideeffect_pkg"]`` or ``--allow-import``) is what it
takes to resolve those names, and then the marker does appear, which shows that the
tests can see an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fxrules

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "tests.fixtures.sideeffect_pkg"

# One hostile rule per line; the key is the rule, the value the diagnostic it must get.
HOSTILE = {
    "os_system": ("rule os_system [changes]: call_function torch.relu($x) -> call_function os.system($x)",
                  "forbidden-target", "os.system"),
    "subprocess_run": ("rule subprocess_run [changes]: call_function subprocess.run($x) -> $x",
                       "forbidden-target", "subprocess.run"),
    "builtins_eval": ("rule builtins_eval [changes]: call_function builtins.eval($x) -> $x",
                      "forbidden-target", "builtins.eval"),
    "torch_load": ("rule torch_load [changes]: call_function torch.relu($x) -> call_function torch.load($x)",
                   "forbidden-target", "torch.load"),
    "torch_os_system": ("rule torch_os_system [changes]: call_function torch.relu($x)"
                        " -> call_function torch.os.system($x)", "forbidden-target", "torch.os.system"),
    "json_builder": ("rule json_builder [approx]: call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn"
                     " -> call_module json.decoder.JSONDecoder(conv, bn)($x)", "import-not-allowed",
                     "json.decoder.JSONDecoder"),
    "fixture_builder": ("rule fixture_builder [approx]: call_module BatchNorm2d(call_module Conv2d($x) as conv)"
                        f" as bn -> call_module {PACKAGE}.build(conv, bn)($x)", "import-not-allowed",
                        f"{PACKAGE}.build"),
    "fixture_target": (f"rule fixture_target [changes]: call_function {PACKAGE}.double($x) -> $x",
                       "import-not-allowed", f"{PACKAGE}.double"),
    "fixture_predicate": ("rule fixture_predicate [exact]: call_function torch.relu(call_function torch.relu($x))"
                          f" where {PACKAGE}.is_anything($x) -> call_function torch.relu($x)",
                          "import-not-allowed", f"{PACKAGE}.is_anything"),
    "fixture_module": (f"rule fixture_module [changes]: call_module {PACKAGE}.Doubler($x) -> $x",
                       "import-not-allowed", f"{PACKAGE}.Doubler"),
}

# Everything the fixture package offers, under an alias too: fine once the package is allowed.
FIXTURE_RULES = f"""\
use {PACKAGE} as S

rule fixture_target [changes]: call_function {PACKAGE}.double($x) -> $x
rule fixture_alias [changes]: call_function S.double(call_function torch.neg($x)) -> $x
rule fixture_predicate [exact]:
    call_function torch.relu(call_function torch.relu($x)) where {PACKAGE}.is_anything($x)
    -> call_function torch.relu($x)
rule fixture_builder [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    -> call_module {PACKAGE}.build(conv, bn)($x)
rule fixture_module [changes]: call_module S.Doubler($x) -> $x
"""


def hostile_text() -> str:
    return "".join(line + "\n" for line, _, _ in HOSTILE.values())


def line_of(name: str) -> int:
    return list(HOSTILE).index(name) + 1


def _forget_package() -> None:
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    fixtures = sys.modules.get("tests.fixtures")
    if fixtures is not None and hasattr(fixtures, "sideeffect_pkg"):
        delattr(fixtures, "sideeffect_pkg")


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    """The marker file the fixture package writes when imported (in this process or a child)."""
    path = tmp_path / "imported.txt"
    monkeypatch.setenv("FXRULES_MARKER", str(path))
    _forget_package()  # so that an import in this test runs the package's code again
    yield path
    _forget_package()


@pytest.fixture
def hostile_file(tmp_path) -> Path:
    path = tmp_path / "hostile.fxr"
    path.write_text(hostile_text(), encoding="utf-8")
    return path


class ConvBNRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(torch.relu(self.bn(self.conv(x))))


def model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConvBNRelu().eval()


def check_diagnostics(diagnostics, path: str) -> None:
    """Every hostile rule has its diagnostic, at its own line, pointing at the name."""
    found = {(d["line"], d["code"]) for d in diagnostics}
    for name, (line_text, code, dotted) in HOSTILE.items():
        line = line_of(name)
        assert (line, code) in found, (name, sorted(found))
        [diag] = [d for d in diagnostics if d["line"] == line]
        assert diag["path"] == path
        column = line_text.index(dotted) + 1
        assert diag["column"] == column, (name, diag)
        assert diag["severity"] == "error"
    assert {d["code"] for d in diagnostics} <= {"forbidden-target", "import-not-allowed"}


def as_json(diagnostics) -> list:
    return [d.to_json() for d in diagnostics]


# ---------------------------------------------------------------------------
# nothing is imported or run
# ---------------------------------------------------------------------------


def _cli(args: list, marker: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONIOENCODING"] = "utf-8"
    env["FXRULES_MARKER"] = str(marker)
    return subprocess.run([sys.executable, "-m", "fxrules", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_check_subprocess_imports_nothing(hostile_file, marker):
    """`fxrules check` in a fresh interpreter, where the repository root is on sys.path."""
    run = _cli(["check", "--format", "json", str(hostile_file)], marker)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    check_diagnostics(report["diagnostics"], str(hostile_file))
    assert report["errors"] == len(HOSTILE)
    assert not marker.exists(), marker.read_text()
    # the text format locates each one too, with a caret under the name
    run = _cli(["check", str(hostile_file)], marker)
    assert run.returncode == 1
    for name in HOSTILE:
        assert f"{hostile_file}:{line_of(name)}:" in run.stdout
    assert not marker.exists()


def test_check_subprocess_with_allow_import_imports_the_package(tmp_path, marker):
    path = tmp_path / "fixture.fxr"
    path.write_text(FIXTURE_RULES, encoding="utf-8")
    run = _cli(["check", str(path)], marker)
    assert run.returncode == 1 and not marker.exists()
    run = _cli(["check", "--allow-import", PACKAGE, str(path)], marker)
    assert run.returncode == 0, run.stdout + run.stderr
    assert marker.exists(), "--allow-import did not import the package: the test could not see an import"
    assert len(marker.read_text().splitlines()) == 1


def test_load_rules_imports_nothing(hostile_file, marker):
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(hostile_file)
    check_diagnostics(as_json(info.value.diagnostics), str(hostile_file))
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.parse_rules(hostile_text(), source=str(hostile_file))
    check_diagnostics(as_json(info.value.diagnostics), str(hostile_file))
    assert PACKAGE not in sys.modules
    assert not marker.exists()


def test_load_rules_allowing_another_package_imports_nothing(hostile_file, marker):
    """Allowing one package opens no other: `json` does not open the fixture, nor the reverse."""
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(hostile_file, allow_imports=["json"])
    codes = {d.line: d.code for d in info.value.diagnostics}
    assert line_of("json_builder") not in codes or codes[line_of("json_builder")] != "import-not-allowed"
    for name in ("fixture_builder", "fixture_target", "fixture_predicate", "fixture_module"):
        assert codes[line_of(name)] == "import-not-allowed"
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(hostile_file, allow_imports=["tests.fixtures.other_pkg", "tests.fixtures.sideeffect"])
    codes = {d.line: d.code for d in info.value.diagnostics}
    for name in ("fixture_builder", "fixture_target", "fixture_predicate", "fixture_module"):
        assert codes[line_of(name)] == "import-not-allowed"
    assert not marker.exists()


@pytest.mark.parametrize("allow_imports", [(), ("json",)])
def test_apply_rules_imports_nothing(hostile_file, marker, allow_imports):
    m = model()
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.apply_rules(m, str(hostile_file), allow_imports=allow_imports)
    diagnostics = as_json(info.value.diagnostics)
    assert {d["line"] for d in diagnostics} >= {line_of(n) for n in HOSTILE if n != "json_builder"}
    assert {d["code"] for d in diagnostics} <= {"forbidden-target", "import-not-allowed", "unknown-builder"}
    assert not marker.exists()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_rule_alone(tmp_path, marker, name):
    """One rule per file: its diagnostic does not depend on what else the file holds."""
    line_text, code, dotted = HOSTILE[name]
    path = tmp_path / f"{name}.fxr"
    path.write_text(line_text + "\n", encoding="utf-8")
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.apply_rules(model(), str(path))
    [diag] = info.value.diagnostics
    assert (diag.code, diag.line, diag.column) == (code, 1, line_text.index(dotted) + 1)
    assert dotted in diag.message or dotted.rsplit(".", 1)[0] in diag.message  # the name, or the module on its way
    assert not marker.exists()


# ---------------------------------------------------------------------------
# conditions cannot reach code at run time either
# ---------------------------------------------------------------------------

SMUGGLING = {
    # getattr reaches `os` from torch at run time; map calls what it reached
    "map_getattr": 'any(builtins.map(builtins.getattr(builtins.getattr(torch.nn.functional.torch, "os"), "mkdir"),'
                   ' [MARKER]))',
    "map_getattr_filter": 'any(builtins.filter(builtins.getattr(builtins.getattr(torch.nn.functional.torch, "os"),'
                          ' "mkdir"), [MARKER])) or True',
    # no getattr: indexing a list launders the static name chain into a value whose attributes
    # are read at run time; a higher-order function under torch calls what was reached
    "tree_map_index": 'torch.utils._pytree.tree_map([torch.nn.functional.torch][0].os.mkdir, [MARKER]) or True',
}


@pytest.mark.parametrize("name", list(SMUGGLING))
def test_a_condition_cannot_call_what_it_reaches(tmp_path, name):
    """A `where` condition that fetches `os.mkdir` with getattr and calls it through map:
    checking, loading and applying must not create the directory, and the checker must refuse
    the file."""
    target = tmp_path / "smuggled"
    condition = SMUGGLING[name].replace("MARKER", json.dumps(str(target)))
    text = ("rule innocent \"looks harmless\" [exact]:\n"
            "    call_function torch.relu(call_function torch.relu($x))\n"
            f"    where {condition}\n"
            "    -> call_function torch.relu($x)\n")
    path = tmp_path / "smuggle.fxr"
    path.write_text(text, encoding="utf-8")
    try:
        fxrules.apply_rules(model(), str(path))
    except fxrules.FxrulesError:
        pass
    assert not target.exists(), "applying the rule file ran code it fetched with getattr"
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(path)
    assert all(d.line == 3 for d in info.value.diagnostics)
    assert {d.code for d in info.value.diagnostics} & {"forbidden-target", "import-not-allowed", "unknown-predicate"}
    assert not target.exists()


# ---------------------------------------------------------------------------
# allowing the package is what it takes
# ---------------------------------------------------------------------------


def test_allow_imports_resolves_the_fixture(marker):
    with pytest.raises(fxrules.RuleFileError):
        fxrules.parse_rules(FIXTURE_RULES, source="fixture.fxr")
    assert not marker.exists()
    rules = fxrules.parse_rules(FIXTURE_RULES, source="fixture.fxr", allow_imports=[PACKAGE])
    assert rules.names == ["fixture_target", "fixture_alias", "fixture_predicate", "fixture_builder",
                           "fixture_module"]
    assert marker.exists(), "allow_imports did not import the package: the test could not see an import"
    assert len(marker.read_text().splitlines()) == 1
    result = fxrules.apply_rules(model(), rules.select(names=["fixture_predicate", "fixture_builder"]))
    assert result.counts == {"fixture_predicate": 1, "fixture_builder": 1}


def test_allow_imports_of_a_parent_package_resolves_the_fixture(marker):
    rules = fxrules.parse_rules(FIXTURE_RULES, source="fixture.fxr", allow_imports=["tests"])
    assert len(rules) == 5
    assert marker.exists()


def test_the_fixture_is_importable_only_from_the_repository_root(tmp_path):
    """From another directory, without the root on sys.path, `tests.fixtures` is not found."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FXRULES_MARKER"] = str(tmp_path / "marker.txt")
    code = ("import importlib.util, sys; sys.path = [p for p in sys.path if p not in ('', %r)]; "
            "print(importlib.util.find_spec('tests.fixtures.sideeffect_pkg') is None)" % str(ROOT))
    try:
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pytest.fail("python -c timed out")
    if run.returncode != 0 and "No module named 'tests'" in run.stderr:
        return
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
    assert not (tmp_path / "marker.txt").exists()


# ---------------------------------------------------------------------------
# verify and apply through the command, and examples naming hostile code
# ---------------------------------------------------------------------------

HOSTILE_EXAMPLES = f"""\
rule relu_relu [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
    example: call_function os.system($x) given $x: [2]
    example: call_module {PACKAGE}.Doubler($x) given $x: [2]
    example 0: call_function {PACKAGE}.double($x) given $x: [2]
"""


@pytest.mark.parametrize("command", ["verify", "apply"])
@pytest.mark.slow
def test_verify_and_apply_subprocesses_import_nothing(hostile_file, marker, command):
    extra = ["--model", "fxrules.zoo:mlp", "--input", "2x16"] if command == "apply" else ["--max-examples", "2"]
    run = _cli([command, str(hostile_file), *extra], marker)
    assert run.returncode == 2, run.stdout + run.stderr  # bad rule files are a usage error for both
    for name in HOSTILE:
        assert f"{hostile_file}:{line_of(name)}:" in run.stderr, name
    assert "Traceback" not in run.stderr
    assert not marker.exists(), marker.read_text()


def test_examples_naming_hostile_code_are_located_and_never_run(tmp_path, marker):
    path = tmp_path / "examples.fxr"
    path.write_text(HOSTILE_EXAMPLES, encoding="utf-8")
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(path)
    found = {(d.line, d.code) for d in info.value.diagnostics}
    assert found == {(3, "forbidden-target"), (4, "import-not-allowed"), (5, "import-not-allowed")}
    run = _cli(["verify", str(path)], marker)
    assert run.returncode == 2 and f"{path}:3:" in run.stderr and f"{path}:5:" in run.stderr
    assert not marker.exists()
    assert PACKAGE not in sys.modules


def test_verify_api_imports_nothing(hostile_file, marker):
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.verify(str(hostile_file), max_examples=2, database=None)
    check_diagnostics(as_json(info.value.diagnostics), str(hostile_file))
    assert not marker.exists()
