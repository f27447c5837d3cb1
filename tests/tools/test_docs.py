"""The documentation is tested: every command and snippet of README.md and docs/*.md runs, and what it
prints is compared with what the page shows.

Conventions (for writers of the pages):

- A ```console block holds commands (lines starting with ``$ ``), each followed by its output
  (stdout and stderr together, as a terminal shows them). They run in order, with bash, in one
  scratch folder per document, with ``fxrules`` the checkout's (``python -m fxrules``).
- A fenced block whose info string has ``file=NAME`` (```` ```fxr file=my_rules.fxr ````) is
  written to NAME in that folder when the document reaches it, so later commands see it.
- Shown output may elide: a line ``...`` stands for any number of lines, and ``...`` inside a
  line for any text. Besides that, output is compared after normalising what varies from run to
  run: times (``48.3 ms``, ``5.2 s``), hypothesis' reproduce blobs, trailing spaces.

- Every ```python block runs (one interpreter per page, the page's blocks in order in one namespace,
  ``rules/`` the bundled library); ``>>>`` blocks are doctests; ``output=KEY`` pairs a block with the
  ```text block that shows what it prints. ```python no-run marks a fragment, with the reason beside it.
- Every ```fxr block checks clean; ```fxr fails marks an intentionally wrong one.
- Every ```yaml block parses and names hooks that .pre-commit-hooks.yaml defines.
- The README's set-up commands are .ci/run's, and the main job prints what the README shows.

Blocks in other languages (```toml, ```json, ```text, or no language: synopses) are not run.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Step:
    kind: str  # "file" or "command"
    text: str  # the file's content, or the command
    expected: str = ""
    line: int = 0  # where in the document, for messages


def steps(document: Path) -> list[Step]:
    text = document.read_text(encoding="utf-8")
    found: list[Step] = []
    for block in FENCE.finditer(text):
        info, body = block.group(1).strip(), block.group(2)
        line = text.count("\n", 0, block.start()) + 1
        file = re.search(r"\bfile=(\S+)", info)
        if file:
            found.append(Step("file", body, file.group(1), line))
        elif info.split()[:1] == ["console"]:
            found.extend(_commands(body, line))
    return found


def _commands(body: str, line: int) -> list[Step]:
    found: list[Step] = []
    command, output, start = None, [], 0
    for offset, text in enumerate(body.splitlines()):
        if text.startswith("$ "):
            if command is not None:
                found.append(Step("command", command, "\n".join(output), line + 1 + start))
            command, output, start = text[2:], [], offset
        elif command is not None:
            output.append(text)
    if command is not None:
        found.append(Step("command", command, "\n".join(output), line + 1 + start))
    return found


def normalise(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"\b\d+(\.\d+)? ms\b", "N ms", text)
    text = re.sub(r"\b\d+(\.\d+)? s\b", "N s", text)
    text = re.sub(r"@reproduce_failure\('[^']*', b'[^']*'\)", "@reproduce_failure(...)", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what ``expected`` shows (both normalised; ``...`` elides)."""
    parts = []
    for line in expected.splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.fullmatch("".join(parts), actual + "\n" if actual else "") is not None


def test_the_matcher_elides_and_normalises():
    assert matches("a\n...\nd", "a\nb\nc\nd") and matches("a\n...\nd", "a\nd")
    assert matches("x ... z", "x yyy z") and not matches("x ... z", "x yyy")
    assert normalise("done; 48.3 ms (5.2 s)") == "done; N ms (N s)"
    assert not matches("a\nb", "a\nc")


def _shim(folder: Path) -> Path:
    """A ``fxrules`` on PATH that is this checkout's ``python -m fxrules``."""
    bin_dir = folder / "_bin"
    bin_dir.mkdir()
    script = bin_dir / "fxrules"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fxrules "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.slow
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(s.kind == "command" for s in steps(d))],
                         ids=lambda d: d.name)
def test_every_console_block_prints_what_it_shows(document, tmp_path):
    pytest.importorskip("torch")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHONPATH")}
    env.update(PATH=f"{_shim(tmp_path)}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), NO_COLOR="1",
               PYTHONUNBUFFERED="1", COLUMNS="100")
    status = 0
    failures = []
    for step in steps(document):
        if step.kind == "file":
            target = work / step.expected
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.text, encoding="utf-8")
            continue
        run = subprocess.run(["bash", "-c", f"(exit {status}); {step.text}"], cwd=work,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        status = run.returncode
        actual = normalise(run.stdout.replace(str(work) + os.sep, "").replace(str(ROOT) + os.sep, ".../"))
        if not matches(normalise(step.expected), actual):
            failures.append(f"{document.name}:{step.line}: $ {step.text}\n--- shown\n{normalise(step.expected)}\n"
                            f"--- printed\n{actual}\n")
    assert not failures, "\n".join(failures)


# ---- ```python blocks -------------------------------------------------------------------------------------
#
# Every ```python block runs: one fresh interpreter per document (the current one, ``sys.executable``),
# the document's blocks in order in one namespace, in a scratch folder where ``rules/`` is the bundled
# library (as in a checkout) and ``file=NAME`` blocks are written when the document reaches them.
# A block of ``>>>`` lines is a doctest: what it shows is compared. A block whose info string has
# ``output=KEY`` prints what the ```text block with the same ``output=KEY`` shows (compared normalised).
# A block that cannot run alone (an excerpt, a fragment) says so in its info string: ```python no-run
# with the reason in the text next to it; keep those rare.

DRIVER = r'''
import contextlib, doctest, io, json, os, subprocess, sys, traceback

def run_page(steps):
    namespace = {"__name__": "__docs__"}  # fresh per page; the page's blocks share it, in order
    results = []
    for step in steps:
        if step["kind"] == "file":
            with open(step["name"], "w", encoding="utf-8") as f:
                f.write(step["text"])
            continue
        if step["kind"] == "shell":  # a console block's file edit (sed, echo >): the python blocks after it see it
            subprocess.run(["bash", "-c", step["text"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            continue
        out = io.StringIO()
        error = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if step["kind"] == "doctest":
                    test = doctest.DocTestParser().get_doctest(step["text"], namespace, step["where"], step["where"], 0)
                    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
                    runner.run(test, out=out.write, clear_globs=False)
                    if runner.failures:
                        error = "doctest failed"
                else:
                    exec(compile(step["text"], step["where"], "exec"), namespace)
            except BaseException:
                error = traceback.format_exc()
        results.append({"where": step["where"], "printed": out.getvalue(), "error": error})
    return results

pages = json.load(open(sys.argv[1], encoding="utf-8"))
done = {}
for page in pages:  # one interpreter for every page: torch is imported once
    os.chdir(page["work"])
    done[page["name"]] = run_page(page["steps"])
json.dump(done, open(sys.argv[2], "w", encoding="utf-8"))
'''


def _info(block: re.Match) -> list[str]:
    return block.group(1).split()


def python_steps(document: Path) -> list[dict]:
    """The document's ```python blocks (and the files its ``file=`` blocks write), in order."""
    text = document.read_text(encoding="utf-8")
    found = []
    for block in FENCE.finditer(text):
        info, body = _info(block), block.group(2)
        where = f"{document.name}:{text.count(chr(10), 0, block.start()) + 1}"
        file = re.search(r"\bfile=(\S+)", block.group(1))
        if file:
            found.append({"kind": "file", "name": file.group(1), "text": body, "where": where})
        if info[:1] == ["console"]:
            found.extend({"kind": "shell", "text": step.text, "where": where} for step in _commands(body, 0)
                         if step.text.split()[0] not in ("fxrules", "python", "python3"))
        if info[:1] != ["python"] or "no-run" in info or file:
            continue
        output = next((i.split("=", 1)[1] for i in info if i.startswith("output=")), None)
        kind = "doctest" if body.lstrip().startswith(">>> ") else "code"
        found.append({"kind": kind, "text": body, "where": where, "output": output})
    return found


def shown_outputs(document: Path) -> dict[str, str]:
    """``output=KEY`` -> the text of the ```text block that shows what the python block KEY prints."""
    text = document.read_text(encoding="utf-8")
    return {i.split("=", 1)[1]: block.group(2) for block in FENCE.finditer(text)
            for i in _info(block)[1:] if _info(block)[:1] == ["text"] and i.startswith("output=")}


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "rules").symlink_to(ROOT / "fxrules" / "library", target_is_directory=True)
    return work


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1", PYTHONUNBUFFERED="1", COLUMNS="100", **extra)
    return env


def test_python_steps_find_blocks_doctests_and_marks(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("```python\nx = 1\n```\n```python no-run\nfragment(\n```\n```python output=k\nprint(x)\n```\n"
                   "```text output=k\n1\n```\n```python\n>>> x + 1\n2\n```\n```fxr file=a.fxr\nrule\n```\n")
    kinds = [(s["kind"], s.get("output")) for s in python_steps(doc)]
    assert kinds == [("code", None), ("code", "k"), ("doctest", None), ("file", None)]
    assert shown_outputs(doc) == {"k": "1\n"}


PYTHON_PAGES = [d for d in DOCUMENTS if any(s["kind"] in ("code", "doctest") for s in python_steps(d))]


@pytest.fixture(scope="module")
def python_runs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    """Every page's python blocks, run by one interpreter (a page per scratch folder, a namespace per page):
    page name -> (its scratch folder, one result per block)."""
    pytest.importorskip("torch")
    import json
    base = tmp_path_factory.mktemp("python_blocks")
    pages = [{"name": d.name, "work": str(_scratch(base / d.stem)), "steps": python_steps(d)} for d in PYTHON_PAGES]
    (base / "pages.json").write_text(json.dumps(pages), encoding="utf-8")
    (base / "driver.py").write_text(DRIVER, encoding="utf-8")
    run = subprocess.run([sys.executable, str(base / "driver.py"), str(base / "pages.json"), str(base / "results.json")],
                         cwd=base, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads((base / "results.json").read_text(encoding="utf-8"))
    return {page["name"]: (Path(page["work"]), results[page["name"]]) for page in pages}


@pytest.mark.parametrize("document", PYTHON_PAGES, ids=lambda d: d.name)
@pytest.mark.slow
def test_every_python_block_runs(document, python_runs):
    work, results = python_runs[document.name]
    plan = python_steps(document)
    shown = shown_outputs(document)
    failures = []
    for step, result in zip([s for s in plan if s["kind"] in ("code", "doctest")], results):
        if result["error"]:
            failures.append(f"{result['where']}: {result['error']}\n{result['printed']}")
        elif step["output"] is not None:
            expected = normalise(shown[step["output"]])
            actual = normalise(result["printed"].replace(str(work) + os.sep, ""))
            if not matches(expected, actual):
                failures.append(f"{result['where']}: prints\n{actual}\n--- the page shows\n{expected}")
    assert not failures, "\n\n".join(failures)


# ---- ```fxr blocks ----------------------------------------------------------------------------------------
#
# Every ```fxr block is a rule file that parses and checks clean (no errors, no warnings), named by its
# ``file=`` or by where it is. A block marked ``fails`` is an intentionally wrong example (the text next to
# it says so): it must fail to check, and if a ```text block follows it, that block shows the diagnostics.

@dataclass(frozen=True)
class RuleBlock:
    where: str
    name: str
    text: str
    fails: bool
    shown: str | None  # the ```text block right after a failing block: its diagnostics


def rule_blocks(document: Path) -> list[RuleBlock]:
    text = document.read_text(encoding="utf-8")
    blocks = list(FENCE.finditer(text))
    found = []
    for index, block in enumerate(blocks):
        info = _info(block)
        if info[:1] != ["fxr"]:
            continue
        where = f"{document.name}:{text.count(chr(10), 0, block.start()) + 1}"
        file = re.search(r"\bfile=(\S+)", block.group(1))
        after = blocks[index + 1] if index + 1 < len(blocks) else None
        shown = (after.group(2) if after is not None and _info(after)[:1] == ["text"]
                 and not text[block.end():after.start()].strip() else None)
        found.append(RuleBlock(where, file.group(1) if file else where, block.group(2), "fails" in info, shown))
    return found


RULE_BLOCKS = [block for document in DOCUMENTS for block in rule_blocks(document)]


def test_rule_blocks_are_found():
    wheres = {block.where for block in RULE_BLOCKS}
    assert {"README.md:11", "language.md:72", "tutorial.md:25"} <= wheres, wheres
    assert [block.fails for block in RULE_BLOCKS if block.where == "tutorial.md:25"] == [True]


@pytest.mark.parametrize("block", RULE_BLOCKS, ids=lambda b: b.where)
def test_every_rule_block_checks_clean_or_fails_as_shown(block):
    import fxrules
    if not block.fails:
        rules = fxrules.parse_rules(block.text, block.name)  # raises RuleFileError, quoting the problem
        assert not rules.warnings, [w.headline() for w in rules.warnings]
        return
    with pytest.raises(fxrules.RuleFileError) as failed:
        fxrules.parse_rules(block.text, block.name)
    if block.shown is not None:
        assert matches(normalise(block.shown), normalise(failed.value.render()))


# ---- the README's set-up commands -------------------------------------------------------------------------
#
# The two commands of the README's "Set up" section (indented blocks: the main job, then the tests) are
# what .ci/run runs on a fresh clone, word for word but for the venv's folder and pip's ``-q``; the
# first one's job (everything after the venv and the installs) runs here with this interpreter, and
# what it prints is compared with the ```text block the README shows after it.

def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^    (python3 -m venv .+)$", section, re.M)


def ci_commands() -> list[str]:
    """.ci/run's set-up and each command it runs in the venv, in the README's spelling."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    venv = [line.replace('"$venv"', ".venv").replace('"$venv/bin/activate"', ".venv/bin/activate")
            for line in lines if line.startswith(("python3 -m venv", ". "))]
    prefix = " && ".join(venv)
    runs = [line.replace("pip install -q ", "pip install ") for line in lines if line.startswith("pip install")]
    return [f"{prefix} && {run}" for run in runs]


def test_the_readme_set_up_commands_are_what_ci_runs():
    commands = setup_commands()
    assert len(commands) == 2, commands
    assert commands[0].endswith("--model fxrules.zoo:redundant --input 2x3x16x16")
    assert commands[1].endswith("python -m pytest -q")
    assert commands == ci_commands()


@pytest.mark.slow
def test_the_readme_main_job_prints_what_it_shows():
    pytest.importorskip("torch")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    job = setup_commands()[0].split(" && ")[-1]
    assert job.startswith("fxrules apply ")
    shown = re.search(re.escape(job) + r"\n.*?^```text\n(.*?)^```", text, re.M | re.S).group(1)
    run = subprocess.run([sys.executable, "-m", "fxrules", *job.split()[1:]], cwd=ROOT, env=_clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert run.returncode == 0, run.stdout

    def tiny(text: str) -> str:  # float noise of the folding (5.96e-08 on one CPU, another on the next)
        return re.sub(r"\b\d(\.\d+)?e-0[5-9]\b", "<1e-4", text)

    assert matches(tiny(normalise(shown)), tiny(normalise(run.stdout))), run.stdout


# ---- YAML (pre-commit configuration) ------------------------------------------------------------------------
#
# Every ```yaml block parses, and the hook ids it names are hooks .pre-commit-hooks.yaml defines.

def _yaml_blocks() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        found.extend((f"{document.name}:{text.count(chr(10), 0, block.start()) + 1}", block.group(2))
                     for block in FENCE.finditer(text) if _info(block)[:1] == ["yaml"])
    return found


def _hook_ids(value) -> list[str]:
    if isinstance(value, dict):
        return ([value["id"]] if isinstance(value.get("id"), str) else []) + [
            i for v in value.values() for i in _hook_ids(v)]
    if isinstance(value, list):
        return [i for v in value for i in _hook_ids(v)]
    return []


SIMPLE_YAML_LINE = re.compile(r"^\s*(- )?(?:[\w-]+:(?: (?:\[[^\[\]]*\]|[^\[\]{}#\s][^\[\]{}#]*))?)?\s*(#.*)?$")


def _subset_hook_ids(text: str) -> list[str]:
    """Without PyYAML: the block is the simple subset pre-commit examples use (``key: value`` lines, ``- ``
    items, comments), and its ids are the ``id:`` values."""
    bad = [line for line in text.splitlines() if not SIMPLE_YAML_LINE.match(line)]
    assert not bad, bad
    return re.findall(r"^\s*(?:- )?id:\s*([\w-]+)", text, re.M)


def _load_hook_ids(text: str) -> list[str]:
    try:
        import yaml  # pre-commit (the test extra) depends on PyYAML
    except ImportError:
        return _subset_hook_ids(text)
    return _hook_ids(yaml.safe_load(text))


def test_the_yaml_subset_reader():
    assert _subset_hook_ids("- repo: x\n  hooks:\n    - id: a-b   # c\n    # - id: d\n") == ["a-b"]
    with pytest.raises(AssertionError):
        _subset_hook_ids("- id: [unclosed")


def test_yaml_blocks_parse_and_name_hooks_that_exist():
    defined = set(_load_hook_ids((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")))
    assert {"fxrules-check", "fxrules-fmt", "fxrules-analyze"} <= defined, defined
    blocks = _yaml_blocks()
    assert len(blocks) >= 2, blocks
    for where, body in blocks:
        named = _load_hook_ids(body)
        assert named, f"{where}: names no hook"
        assert set(named) <= defined, f"{where}: {sorted(set(named) - defined)} are not in .pre-commit-hooks.yaml"
