"""The pre-commit hooks (.pre-commit-hooks.yaml), through pre-commit itself.

``pre-commit try-repo`` installs this repository into a fresh hook environment (lark from
the package index, fxrules from a clone) and runs ``fxrules-check`` on a temporary git
repository holding a good and a bad rule file: it must fail naming the bad file's
line:column, and pass once only the good file is left. The environment of
``fxrules-check`` must hold no torch: ``pre-commit install-hooks`` with ``PRE_COMMIT_HOME``
in a temporary directory builds it where the test can look inside.

try-repo clones a commit, so the test runs on a temporary clone of this checkout with the
working tree's changes committed there (in CI's fresh clone there are none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRE_COMMIT = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or shutil.which("pre-commit")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]

GOOD = """\
# a good rule file
rule remove_dropout [exact]:
    call_module Dropout($x) as d
    where not d.training
    -> $x
"""

BAD = """\
rule broken:
    call_module Dropout($x) -> $y
"""  # $y is not bound: error[unbound-capture] at 2:32


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def snapshot_of_this_checkout(destination: Path) -> Path:
    """A clone of this repository with the working tree's uncommitted changes committed."""
    git("clone", "-q", "--no-hardlinks", str(ROOT), str(destination), cwd=ROOT.parent)
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0")
    for entry in destination.iterdir():  # the snapshot is exactly the working tree's files
        if entry.name == ".git":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for name in filter(None, listed):
        source, target = ROOT / name, destination / name
        if not (source.is_symlink() or source.is_file()) or target.is_symlink() or target.exists():
            continue  # deleted in the working tree, or inside a linked directory already there
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    git("add", "-A", cwd=destination)
    if git("status", "--porcelain", cwd=destination).strip():
        git("commit", "-q", "-m", "working tree snapshot", cwd=destination)
    assert (destination / ".pre-commit-hooks.yaml").is_file()
    return destination


def run_pre_commit(*args: str, cwd: Path, home: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "TMPDIR": str(tmp), "PRE_COMMIT_COLOR": "never",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    env.pop("PYTHONPATH", None)  # the hook must run the fxrules installed in its own environment
    return subprocess.run([PRE_COMMIT, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_fxrules_check_hook(tmp_path: Path) -> None:
    assert PRE_COMMIT, "pre-commit is not installed: pip install -e '.[test]'"
    fxrules_repo = snapshot_of_this_checkout(tmp_path / "fxrules")
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    scratch.mkdir()
    project = tmp_path / "project"
    (project / "rules").mkdir(parents=True)
    git("init", "-q", cwd=project)
    (project / "rules" / "good.fxr").write_text(GOOD)
    (project / "rules" / "bad.fxr").write_text(BAD)
    (project / "notes.txt").write_text("call_module Dropout($x) -> $y\n")  # not a .fxr file: not checked
    git("add", "-A", cwd=project)

    # try-repo: the bad file fails the hook, named by file:line:col
    r = run_pre_commit("try-repo", str(fxrules_repo), "fxrules-check", "--all-files", cwd=project, home=home,
                       tmp=scratch)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "fxrules check" in out and "Failed" in out
    assert "rules/bad.fxr:2:32: error[unbound-capture]" in out, out
    assert "good.fxr:" not in out and "notes.txt" not in out
    assert "Traceback" not in out

    # only the good file: the hook passes
    git("rm", "-q", "-f", "rules/bad.fxr", cwd=project)
    r = run_pre_commit("try-repo", str(fxrules_repo), "fxrules-check", "--all-files", cwd=project, home=home,
                       tmp=scratch)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Passed" in out

    # the hook's environment has no torch: build it where we can look (PRE_COMMIT_HOME)
    sha = git("rev-parse", "HEAD", cwd=fxrules_repo).strip()
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {fxrules_repo}\n  rev: {sha}\n  hooks:\n  - id: fxrules-check\n  - id: fxrules-fmt\n"
    )
    git("add", "-A", cwd=project)
    r = run_pre_commit("run", "--all-files", cwd=project, home=home, tmp=scratch)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.count("Passed") == 2, out  # check, and fmt (good.fxr is already canonical)
    environments = sorted(home.glob("repo*/py_env-*"))
    assert len(environments) == 1, environments  # check and fmt share one environment
    environment = environments[0]
    site_packages = list(environment.glob("lib/python*/site-packages"))
    assert site_packages and (site_packages[0] / "lark").is_dir()
    assert (site_packages[0] / "fxrules").is_dir() or list(site_packages[0].glob("fxrules-*"))
    assert not list(site_packages[0].glob("torch*")), "the hook environment must not install torch"
    python = environment / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    # and fxrules check runs there, on a file naming torch targets, without importing torch
    (project / "rules" / "torchy.fxr").write_text("call_function torch.relu(call_function torch.relu($x)) -> $x\n")
    probe = subprocess.run(
        [str(python), "-c", "import sys\nfrom fxrules.tools.cli import main\ncode = main(['check', 'rules'])\n"
                            "assert 'torch' not in sys.modules, 'fxrules check imported torch'\nsys.exit(code)"],
        cwd=project, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""},
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert "2 files, 2 rules checked" in probe.stdout

    # fxrules-fmt rewrites a file that is not canonical, and pre-commit reports the change
    (project / "rules" / "good.fxr").write_text(GOOD.replace("    where not d.training\n    -> $x", "  where not d.training -> $x"))
    git("add", "-A", cwd=project)
    r = run_pre_commit("run", "fxrules-fmt", "--all-files", cwd=project, home=home, tmp=scratch)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "files were modified by this hook" in out, out
    assert (project / "rules" / "good.fxr").read_text() == GOOD
