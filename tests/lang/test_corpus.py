"""The rule-file corpus: every malformed file reports exactly the diagnostics it declares.

``tests/corpus/fail/*.fxr`` are small files, each with one mistake (or, for the
``several_errors_*`` files, several). Each declares what the checker must report,
one comment line per diagnostic::

    # expect: unbound-capture 4:32

Files that cannot hold comments (binary or non-UTF-8 ones) declare the same lines
in a sidecar ``NAME.expect``. ``tests/corpus/pass/*.fxr`` must check clean.

Every file is checked through the API (``load_rules``) and through the CLI in
process (``fxrules.tools.cli.main``); the real command runs as a subprocess over the
whole corpus at once (one run per output format) and over a few single files,
because each subprocess pays for importing torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fxrules
from fxrules.tools.cli import main as cli_main

HERE = Path(__file__).resolve().parents[1]  # tests/
ROOT = HERE.parent
FAIL_DIR = HERE / "corpus" / "fail"
PASS_DIR = HERE / "corpus" / "pass"

FAIL_FILES = sorted(FAIL_DIR.glob("*.fxr"))
PASS_FILES = sorted(PASS_DIR.glob("*.fxr"))

_EXPECT = re.compile(r"^#\s*expect:\s*([a-z][a-z-]*)\s+(\d+):(\d+)\s*$", re.MULTILINE)

Expected = frozenset  # of (code, line, column)


def expectations(path: Path) -> Expected:
    """The ``# expect:`` lines of a corpus file (or of its ``.expect`` sidecar)."""
    sidecar = path.with_suffix(".expect")
    if sidecar.exists():
        text = sidecar.read_text(encoding="utf-8")
    else:
        text = path.read_bytes().decode("utf-8", errors="replace")
    return frozenset((code, int(line), int(col)) for code, line, col in _EXPECT.findall(text))


def diagnostic_set(diagnostics) -> Expected:
    return frozenset((d.code, d.line, d.column) for d in diagnostics)


def _ids(paths):
    return [p.name for p in paths]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fxrules", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=timeout)


# ---------------------------------------------------------------------------
# The corpus itself
# ---------------------------------------------------------------------------


def test_the_fail_corpus_is_big_enough_and_declares_expectations():
    assert len(FAIL_FILES) >= 50
    for path in FAIL_FILES:
        assert expectations(path), f"{path.name} declares no `# expect:` line"


def test_the_fail_corpus_covers_every_code_a_file_can_trigger():
    covered = {code for path in FAIL_FILES for code, _, _ in expectations(path)}
    # io-error is about paths, not file contents (tests/tools/test_cli.py covers it).
    wanted = set(fxrules.errors.CODES) - {"io-error"}
    assert wanted - covered == set()
    assert covered - set(fxrules.errors.CODES) == set(), "an expectation names an unknown code"


def test_several_error_files_expect_several_errors():
    several = [p for p in FAIL_FILES if p.name.startswith("several_errors")]
    assert len(several) >= 3
    for path in several:
        assert len(expectations(path)) >= 2, path.name


# ---------------------------------------------------------------------------
# Through the API
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", FAIL_FILES, ids=_ids(FAIL_FILES))
def test_fail_file_reports_exactly_its_expected_diagnostics(path: Path):
    expected = expectations(path)
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(path)
    error = info.value
    assert type(error) is fxrules.RuleFileError
    actual = diagnostic_set(error.diagnostics)
    rendered = error.render()
    assert actual == expected, (
        f"\nmissing:    {sorted(expected - actual)}\nunexpected: {sorted(actual - expected)}\n{rendered}"
    )
    for d in error.diagnostics:
        assert d.path == os.fspath(path)
        assert d.severity == "error"
        assert d.code in fxrules.errors.CODES
        assert d.message and "\n" not in d.message
    # The rendered report is one headline per diagnostic, in file order.
    headlines = [line for line in rendered.splitlines() if re.match(r".*:\d+:\d+: error\[", line)]
    assert len(headlines) == len(error.diagnostics)


@pytest.mark.parametrize("path", PASS_FILES, ids=_ids(PASS_FILES))
def test_pass_file_loads_cleanly(path: Path):
    rules = fxrules.load_rules(path)
    assert len(rules) > 0
    assert rules.warnings == ()


def _cross_file_duplicate(code: str, path: str, line: int, column: int) -> bool:
    """Loading the whole directory makes one rule set, so files that reuse a rule name clash too."""
    return code == "duplicate-rule" and (code, line, column) not in expectations(Path(path))


def test_the_whole_fail_directory_reports_every_file():
    """One load_rules over the directory: every file's diagnostics, none lost to another file's."""
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(FAIL_DIR)
    by_file: dict[str, set] = {}
    for d in info.value.diagnostics:
        if not _cross_file_duplicate(d.code, d.path, d.line, d.column):
            by_file.setdefault(Path(d.path).name, set()).add((d.code, d.line, d.column))
    wrong = {p.name: (sorted(expectations(p)), sorted(by_file.get(p.name, ())))
             for p in FAIL_FILES if by_file.get(p.name, set()) != expectations(p)}
    assert wrong == {}


# ---------------------------------------------------------------------------
# Through the CLI, in process (fast: every file)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", FAIL_FILES, ids=_ids(FAIL_FILES))
@pytest.mark.slow
def test_fail_file_through_cli_in_process(path: Path, capsys):
    code = cli_main(["check", "--format", "json", os.fspath(path)])
    out, err = capsys.readouterr()
    assert code == 1, err
    report = json.loads(out)
    assert report["errors"] == len(report["diagnostics"]) > 0
    actual = frozenset((d["code"], d["line"], d["column"]) for d in report["diagnostics"])
    assert actual == expectations(path)

    code = cli_main(["check", os.fspath(path)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out + err
    for c, line, col in expectations(path):
        assert f"{os.fspath(path)}:{line}:{col}: error[{c}]:" in out


# ---------------------------------------------------------------------------
# Through the real command, in a subprocess
# ---------------------------------------------------------------------------


SAMPLES = ["syntax_missing_arrow.fxr", "unbound_capture_replacement.fxr", "binary_input_nul_byte.fxr"]


@pytest.fixture(scope="module")
def corpus_runs():
    """The command-line runs this module needs, each ``fxrules.tools.cli.main(argv)`` in process
    (tests/tools/ starts a fresh interpreter where that is the point): exit code, stdout, stderr."""
    from fxrules.tools.cli import main

    commands = {
        "json": ["check", "--format", "json", os.fspath(FAIL_DIR)],
        "text": ["check", os.fspath(FAIL_DIR)],
        "pass": ["check", os.fspath(PASS_DIR)],
    }
    for name in SAMPLES:
        commands[name] = ["check", os.fspath(FAIL_DIR / name)]
    results = {}
    for key, args in commands.items():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
        results[key] = (code, out.getvalue(), err.getvalue())
    return results


@pytest.mark.slow
def test_cli_json_over_the_whole_fail_corpus(corpus_runs):
    code, out, err = corpus_runs["json"]
    assert "Traceback" not in out + err
    assert code == 1, err
    report = json.loads(out)
    assert sorted(Path(f).name for f in report["files"]) == sorted(p.name for p in FAIL_FILES)
    by_file: dict[str, set] = {}
    for d in report["diagnostics"]:
        if not _cross_file_duplicate(d["code"], d["path"], d["line"], d["column"]):
            by_file.setdefault(Path(d["path"]).name, set()).add((d["code"], d["line"], d["column"]))
    wrong = {p.name: (sorted(expectations(p)), sorted(by_file.get(p.name, ())))
             for p in FAIL_FILES if by_file.get(p.name, set()) != expectations(p)}
    assert wrong == {}


def test_cli_text_over_the_whole_fail_corpus(corpus_runs):
    code, out, err = corpus_runs["text"]
    assert "Traceback" not in out + err
    assert code == 1, err
    missing = [
        f"{path.name}:{line}:{col}: error[{c}]"
        for path in FAIL_FILES
        for c, line, col in expectations(path)
        if f"{os.fspath(path)}:{line}:{col}: error[{c}]:" not in out
    ]
    assert missing == []
    assert re.search(r"\d+ files, \d+ rules checked: \d+ errors, 0 warnings", err)


@pytest.mark.parametrize("name", SAMPLES)
def test_cli_single_fail_file(corpus_runs, name):
    code, out, err = corpus_runs[name]
    path = FAIL_DIR / name
    assert "Traceback" not in out + err
    assert code == 1
    for c, line, col in expectations(path):
        assert f"{os.fspath(path)}:{line}:{col}: error[{c}]:" in out


def test_cli_pass_corpus_exits_0(corpus_runs):
    code, out, err = corpus_runs["pass"]
    assert "Traceback" not in out + err
    assert code == 0, out + err
    assert "no problems" in out
