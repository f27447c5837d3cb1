"""The documentation is tested: every ```console block of README.md and docs/*.md runs, and what
each command prints is compared with what the block shows.

Conventions (docs/cli.md "Documentation conventions" says the same for writers):

- A ```console block holds commands (lines starting with ``$ ``), each followed by its output
  (stdout and stderr together, as a terminal shows them). They run in order, with bash, in one
  scratch folder per document, with ``fxrules`` the checkout's (``python -m fxrules``).
- A fenced block whose info string has ``file=NAME`` (```` ```fxr file=my_rules.fxr ````) is
  written to NAME in that folder when the document reaches it, so later commands see it.
- Shown output may elide: a line ``...`` stands for any number of lines, and ``...`` inside a
  line for any text. Besides that, output is compared after normalising what varies from run to
  run: times (``48.3 ms``, ``5.2 s``), hypothesis' reproduce blobs, trailing spaces.

Blocks in other languages (```python, ```toml, ```text, or no language) are not run.
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
