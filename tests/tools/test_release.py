"""Release hygiene: the sdist and the wheel build from a copy of the checkout, hold every subpackage,
the grammar, the rule library, the LICENSE; installed without the checkout, the ``fxrules`` script
prints its version and checks and applies rules. The version is written once (fxrules.__version__)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import fxrules

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_written_once_and_the_license_is_apache():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fxrules.__version__"}
    assert project["project"]["license"] == {"text": "Apache-2.0"}
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.strip().startswith("Apache License") and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{fxrules.__version__}]" in changelog


def _copy_source(destination: Path) -> None:
    """What building needs, links resolved (fxrules/lang/fxr.lark links to grammar/)."""
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        shutil.copy(ROOT / name, destination / name)
    shutil.copytree(ROOT / "fxrules", destination / "fxrules", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _expected_files() -> set[str]:
    """Every module of every subpackage, the grammar, the shipped tables, every library rule file and its README."""
    package = ROOT / "fxrules"
    files = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    files |= {p.relative_to(ROOT).as_posix() for p in (package / "library").rglob("*") if p.suffix in (".fxr", ".md")}
    files.add("fxrules/lang/fxr.lark")
    files |= {p.relative_to(ROOT).as_posix() for p in (package / "lang").glob("*.json")}
    assert len(files & {"fxrules/lang/parse_tables.json", "fxrules/lang/torch_index.json",
                        "fxrules/lang/allowlist.json"}) == 3
    return files


@pytest.mark.slow
def test_sdist_and_wheel_build_hold_everything_and_the_installed_script_works(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    _copy_source(source)
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; out = sys.argv[1]; "
                               "print(b.build_sdist(out)); print(b.build_wheel(out))", str(dist)],
        cwd=source, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    version = fxrules.__version__
    sdist = dist / f"fxrules-{version}.tar.gz"
    wheel = dist / f"fxrules-{version}-py3-none-any.whl"
    assert sdist.is_file() and wheel.is_file(), sorted(os.listdir(dist))

    expected = _expected_files()
    subpackages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "fxrules").rglob("__init__.py")}
    assert {"fxrules/lang", "fxrules/lang/check", "fxrules/engine", "fxrules/verifier", "fxrules/tools"} <= subpackages
    wheel_names = set(zipfile.ZipFile(wheel).namelist())
    assert expected <= wheel_names, sorted(expected - wheel_names)
    assert f"fxrules-{version}.dist-info/licenses/LICENSE" in wheel_names or \
        f"fxrules-{version}.dist-info/LICENSE" in wheel_names
    metadata = zipfile.ZipFile(wheel).read(f"fxrules-{version}.dist-info/METADATA").decode()
    assert f"Version: {version}" in metadata and "Apache" in metadata
    assert "fxrules = fxrules.tools.cli:main" in zipfile.ZipFile(wheel).read(
        f"fxrules-{version}.dist-info/entry_points.txt").decode()
    prefix = f"fxrules-{version}/"
    sdist_names = {n[len(prefix):] for n in tarfile.open(sdist).getnames() if n.startswith(prefix)}
    assert expected | {"LICENSE", "pyproject.toml", "README.md"} <= sdist_names, sorted(expected - sdist_names)

    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    project = tmp_path / "project"  # a user's project: no checkout anywhere on the path
    (project / "rules").mkdir(parents=True)
    (project / "rules" / "mine.fxr").write_text("rule drop [exact]:\n    call_module Dropout($x) -> $x\n")
    (project / "mymodels.py").write_text("import torch\n\ndef net():\n    return torch.nn.Sequential("
                                         "torch.nn.Dropout(), torch.nn.ReLU()).eval()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORCE_COLOR")}
    env["PYTHONPATH"] = str(target)
    script = [sys.executable, str(target / "bin" / "fxrules")]  # the console script, as pip wrote it
    runs = {
        "version": script + ["--version"],
        "check": script + ["check"],
        "apply": script + ["apply", "rules", "--model", "mymodels:net", "--input", "2x3"],
        "where": [sys.executable, "-c", "import fxrules; print(fxrules.__file__)"],
    }
    results = {key: subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)
               for key, command in runs.items()}
    for key, result in results.items():
        assert result.returncode == 0, (key, result.stdout, result.stderr[-3000:])
    assert results["where"].stdout.startswith(str(target))
    assert results["version"].stdout == f"fxrules {version}\n"
    assert "1 file, 1 rule checked: no problems" in results["check"].stdout
    assert "fxrules: 1 rewrite" in results["apply"].stdout and "drop" in results["apply"].stdout
