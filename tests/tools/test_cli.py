"""The ``fxrules check`` command: exit codes, output formats, life without torch, junk input.

Exit codes: 0 clean, 1 problems in the rule files, 2 usage errors (bad options, a
missing path). Output formats: text (compiler style), json (a versioned schema),
github (workflow annotations). No input may ever produce a traceback.

Tests call ``fxrules.tools.cli.main`` in process (fast), junk input included. Where a fresh
interpreter is the point (``python -m fxrules`` itself, importing fxrules without importing
torch, torch blocked or not installed at all) they run subprocesses, started together by a
module fixture.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fxrules
from fxrules.tools.cli import main

HERE = Path(__file__).resolve().parents[1]  # tests/
ROOT = HERE.parent
PASS_DIR = HERE / "corpus" / "pass"
EXAMPLES = PASS_DIR / "language_examples.fxr"

UNBOUND = "rule remove_dropout:\n    call_module Dropout($x) -> $y\n"
SYNTAX = "call_module Dropout($x) $x\n"
CLEAN = "rule keep_dropout_out:\n    call_module Dropout($x) -> $x\n"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _run_all(commands: dict, envs: dict | None = None) -> dict:
    envs = envs or {}
    procs = {key: _start(args, envs.get(key)) for key, args in commands.items()}
    return {key: _finish(proc) for key, proc in procs.items()}


@pytest.fixture
def files(tmp_path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return os.fspath(path)

    return write


# ---------------------------------------------------------------------------
# Exit codes (in process)
# ---------------------------------------------------------------------------


def test_exit_0_when_clean(capsys):
    assert main(["check", os.fspath(EXAMPLES)]) == 0
    out, err = capsys.readouterr()
    assert "1 file, 17 rules checked: no problems" in out
    assert err == ""


def test_exit_0_for_a_directory(capsys):
    assert main(["check", os.fspath(PASS_DIR)]) == 0


def test_exit_1_on_problems(files, capsys):
    assert main(["check", files("bad.fxr", UNBOUND)]) == 1
    out, err = capsys.readouterr()
    assert "error[unbound-capture]" in out
    assert "1 file, 0 rules checked: 1 error, 0 warnings" in err


def test_exit_1_on_a_syntax_error(files, capsys):
    assert main(["check", files("bad.fxr", SYNTAX)]) == 1
    assert "error[unexpected-token]" in capsys.readouterr().out


def test_exit_1_when_one_of_several_files_has_problems(files, capsys):
    assert main(["check", files("good.fxr", CLEAN), files("bad.fxr", UNBOUND)]) == 1


def test_exit_2_for_a_missing_path(tmp_path, capsys):
    missing = os.fspath(tmp_path / "nope.fxr")
    assert main(["check", missing]) == 2
    out, err = capsys.readouterr()
    assert f"{missing}: error[io-error]" in out + err and ":1:1" not in out + err
    assert "Traceback" not in out + err


def test_exit_2_for_a_missing_path_next_to_a_good_one(tmp_path, files, capsys):
    assert main(["check", files("good.fxr", CLEAN), os.fspath(tmp_path / "nope.fxr")]) == 2


@pytest.mark.parametrize("argv", [
    ["check", "--bogus"],
    ["check", "--format", "xml", "x.fxr"],
    ["frobnicate"],
    [],
])
def test_exit_2_for_bad_usage(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits; that is still an exit status, not a traceback
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err  # says something on stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert fxrules.__version__ in capsys.readouterr().out


def test_default_path_is_the_current_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "r.fxr").write_text(CLEAN)
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 0
    assert "1 file, 1 rule checked: no problems" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# --format json
# ---------------------------------------------------------------------------

DIAGNOSTIC_KEYS = {"path", "line", "column", "end_line", "end_column", "severity", "code", "message", "notes"}


def _json(argv, capsys) -> tuple[int, dict]:
    code = main(argv)
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def test_json_clean(capsys):
    code, report = _json(["check", "--format", "json", os.fspath(EXAMPLES)], capsys)
    assert code == 0
    assert set(report) == {"version", "files", "rules", "errors", "warnings", "diagnostics"}
    assert report["version"] == 1
    assert report["files"] == [os.fspath(EXAMPLES)]
    assert report["rules"] == 17
    assert report["errors"] == report["warnings"] == 0
    assert report["diagnostics"] == []


def test_json_with_errors(files, capsys):
    bad = files("bad.fxr", UNBOUND + "call_function torch.relux($x) -> $x\n")
    good = files("good.fxr", CLEAN)
    code, report = _json(["check", "--format", "json", bad, good], capsys)
    assert code == 1
    assert report["files"] == [bad, good]
    assert report["rules"] == 1
    assert report["errors"] == 2 and report["warnings"] == 0
    first, second = report["diagnostics"]
    for d in report["diagnostics"]:
        assert set(d) == DIAGNOSTIC_KEYS
        assert isinstance(d["line"], int) and isinstance(d["column"], int)
        assert isinstance(d["notes"], list)
    assert first == {
        "path": bad, "line": 2, "column": 32, "end_line": 2, "end_column": 34, "severity": "error",
        "code": "unbound-capture", "message": "the replacement uses `$y`, which the pattern does not bind",
        "notes": ["the pattern binds: $x"],
    }
    assert (second["code"], second["line"], second["column"]) == ("unknown-target", 3, 15)
    assert "did you mean `torch.relu`?" in second["notes"]


def test_json_lists_unreadable_files_and_their_diagnostics(tmp_path, capsys):
    binary = tmp_path / "blob.fxr"
    binary.write_bytes(b"\x00\x01\x02")
    code, report = _json(["check", "--format", "json", os.fspath(binary)], capsys)
    assert code == 1
    assert [(d["code"], d["line"], d["column"]) for d in report["diagnostics"]] == [("binary-input", 1, 1)]
    assert report["files"] == [os.fspath(binary)], "a file that was given and examined is a checked file"


def test_json_for_a_missing_path(tmp_path, capsys):
    missing = os.fspath(tmp_path / "nope.fxr")
    code, report = _json(["check", "--format", "json", missing], capsys)
    assert code == 2
    assert [(d["path"], d["code"]) for d in report["diagnostics"]] == [(missing, "io-error")]


# ---------------------------------------------------------------------------
# --format github
# ---------------------------------------------------------------------------


def test_github_format(files, capsys):
    bad = files("bad.fxr", UNBOUND)
    assert main(["check", "--format", "github", bad]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"::error file={bad},line=2,col=32,title=unbound-capture::the replacement uses `$y`, "
        f"which the pattern does not bind (the pattern binds: $x)"
    ]


def test_github_format_clean_prints_nothing(capsys):
    assert main(["check", "--format", "github", os.fspath(EXAMPLES)]) == 0
    assert capsys.readouterr().out == ""


def test_github_format_escapes_properties(tmp_path, capsys):
    """Workflow-command properties escape `%`, CR, LF, `:` and `,` (a `,` would start a new property)."""
    path = tmp_path / "a,b.fxr"
    path.write_text(UNBOUND)
    assert main(["check", "--format", "github", os.fspath(path)]) == 1
    line = capsys.readouterr().out.strip()
    escaped = os.fspath(path).replace("%", "%25").replace(":", "%3A").replace(",", "%2C")
    assert line.startswith(f"::error file={escaped},line=2,col=32,title=unbound-capture::")


# ---------------------------------------------------------------------------
# Subprocesses: python -m fxrules, no torch, imports, junk
# ---------------------------------------------------------------------------

_NO_TORCH = (
    "import sys; sys.modules['torch'] = None\n"
    "from fxrules.tools.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "assert sys.modules.get('torch') is None, 'torch got imported'\n"
    "sys.exit(code)\n"
)


@functools.cache
def _junk() -> dict[str, bytes]:
    rng = random.Random(1234)
    junk = {
        "binary": bytes(rng.randrange(256) for _ in range(4096)),
        "garbage_line": "".join(rng.choice("abc$()[]{}<>=!-_.,:;|&^~#@?'\"\\ 0123456789") for _ in range(1 << 20))
        .replace("#", "").replace("\\", "").encode(),
        "parens_300": ("call_function torch.relu(" + "(" * 300 + "$x" + ")" * 300 + ") -> $x\n").encode(),
        "not_1000": ("rule deep:\n    call_function torch.relu($x) where " + "not " * 1000 + "True -> $x\n").encode(),
        "and_3000": ("rule wide:\n    call_function torch.relu($x) where "
                     + " and ".join(["True"] * 3000) + " -> $x\n").encode(),
        "unicode_ok": "rule gr\u00f6\u00dfe_\u03b1\u03b2:\n    call_module Dropout($\u00e9\u00e8) -> $\u00e9\u00e8\n".encode(),
        "unicode_junk": "\u2603 \U0001F600 \u202e call_module \u200b Dropout($x) -> $x\n".encode(),
        "empty": b"",
    }
    return junk


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every subprocess this module needs, started at once."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "syntax.fxr").write_text(SYNTAX)
    (tmp / "unbound.fxr").write_text(UNBOUND)
    commands = {
        "module_clean": ["-m", "fxrules", "check", os.fspath(EXAMPLES)],
        "module_usage": ["-m", "fxrules", "check", "--no-such-option"],
        "import_only": ["-c", "import sys, fxrules, fxrules.tools.cli, fxrules.api, fxrules.lang.check, fxrules.lang.names; "
                              "print('torch' in sys.modules)"],
        "no_torch_clean": ["-c", _NO_TORCH, "check", os.fspath(EXAMPLES)],
        "no_torch_syntax": ["-c", _NO_TORCH, "check", os.fspath(tmp / "syntax.fxr")],
        "no_torch_unbound": ["-c", _NO_TORCH, "check", "--format", "json", os.fspath(tmp / "unbound.fxr")],
        "no_torch_parse": ["-c", "import sys; sys.modules['torch'] = None\n"
                                 "import fxrules\n"
                                 f"rules = fxrules.parse_rules(open({os.fspath(EXAMPLES)!r}).read(), 'x.fxr')\n"
                                 "print(len(rules))\n"],
        # torch really absent: no site-packages (-S), only lark on the path
        "not_installed_clean": ["-S", "-c", _NO_TORCH.replace("sys.modules['torch'] = None", "pass"),
                                "check", os.fspath(EXAMPLES)],
        "not_installed_unbound": ["-S", "-c", _NO_TORCH.replace("sys.modules['torch'] = None", "pass"),
                                  "check", os.fspath(tmp / "unbound.fxr")],
    }
    import lark

    lark_only = tmp / "lark_only"
    lark_only.mkdir()
    (lark_only / "lark").symlink_to(Path(lark.__file__).resolve().parent, target_is_directory=True)
    bare = _env()
    bare["PYTHONPATH"] = os.pathsep.join([os.fspath(lark_only), os.fspath(ROOT)])
    return _run_all(commands, {"not_installed_clean": bare, "not_installed_unbound": bare})


@pytest.mark.slow
def test_python_dash_m_fxrules(runs):
    code, out, err = runs["module_clean"]
    assert code == 0, out + err
    assert "no problems" in out
    code, out, err = runs["module_usage"]
    assert code == 2
    assert "usage:" in err and "Traceback" not in out + err


def test_importing_fxrules_does_not_import_torch(runs):
    code, out, err = runs["import_only"]
    assert code == 0, err
    assert out.strip() == "False"


def test_without_torch_the_examples_check_clean(runs):
    code, out, err = runs["no_torch_clean"]
    assert "Traceback" not in out + err
    assert code == 0, out + err
    assert "17 rules checked: no problems" in out


def test_torch_not_installed_the_examples_check_clean(runs):
    """As above, in an interpreter where torch cannot be found at all (not just blocked)."""
    code, out, err = runs["not_installed_clean"]
    assert "Traceback" not in out + err
    assert code == 0, out + err
    assert "17 rules checked: no problems" in out


def test_torch_not_installed_an_unbound_capture_is_reported(runs):
    code, out, err = runs["not_installed_unbound"]
    assert "Traceback" not in out + err
    assert code == 1, out + err
    assert "unbound.fxr:2:32: error[unbound-capture]" in out
    assert "error[" not in out.replace("error[unbound-capture]", ""), out


def test_without_torch_a_syntax_error_is_reported(runs):
    code, out, err = runs["no_torch_syntax"]
    assert "Traceback" not in out + err
    assert code == 1, out + err
    assert "syntax.fxr:1:25: error[unexpected-token]" in out


def test_without_torch_an_unbound_capture_is_reported(runs):
    code, out, err = runs["no_torch_unbound"]
    assert "Traceback" not in out + err
    assert code == 1, out + err
    report = json.loads(out)
    assert [(d["code"], d["line"], d["column"]) for d in report["diagnostics"]] == [("unbound-capture", 2, 32)]


def test_without_torch_parse_rules_works(runs):
    code, out, err = runs["no_torch_parse"]
    assert code == 0, err
    assert out.strip() == "17"


@pytest.mark.parametrize("name, expected_code", [
    ("binary", 1),
    ("garbage_line", 1),
    ("parens_300", 1),
    ("not_1000", 1),
    ("and_3000", 0),
    ("unicode_ok", 0),
    ("unicode_junk", 1),
    ("empty", 0),
])
def test_junk_input_never_prints_a_traceback(tmp_path, capsys, name, expected_code):
    path = tmp_path / f"{name}.fxr"
    path.write_bytes(_junk()[name])
    code = main(["check", os.fspath(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "internal error" not in err, err
    if name == "and_3000":  # a long flat condition: fine, or a too-deep diagnostic
        assert code in (0, 1), out + err
        assert code == 0 or "error[too-deep]" in out
    else:
        assert code == expected_code, out[-2000:] + err[-2000:]
    if code == 1:
        assert f"{path}:" in out and ": error[" in out
    assert len(out) < 20_000, "long lines must be shortened in the report"


# ---------------------------------------------------------------------------
# Scale: a 2,000-rule file
# ---------------------------------------------------------------------------


def _big_rule_file(n: int = 2000) -> str:
    ops = ["relu", "neg", "abs", "sigmoid", "tanh", "exp"]
    chunks = []
    for i in range(n):
        a, b = ops[i % 6], ops[(i // 6) % 6]
        c = ("relu", "tanh", "sigmoid")[i % 3]
        kind = i % 4
        if kind == 0:
            chunks.append(f"rule r{i}:\n    call_function torch.{a}(call_function torch.{b}($x)) "
                          f"-> call_function torch.{b}($x)")
        elif kind == 1:
            chunks.append(f"rule r{i} [exact]:\n    call_function operator.mul($x, {i}) where $x.ndim == {i % 5} -> $x")
        elif kind == 2:
            chunks.append(f"rule r{i} \"rule {i}\" [changes]:\n    call_module Linear{{in_features=$n, out_features={i}}}"
                          f"($x) as lin -> call_function torch.{a}($x)")
        else:
            chunks.append(f"rule r{i}:\n    (call_function F.{c}($x) | call_method {c}($x)) -> call_function torch.{c}($x)")
    return "\n".join(chunks) + "\n"


def test_two_thousand_rules(capsys):
    text = _big_rule_file()
    fxrules.parse_rules(CLEAN, "warm.fxr")  # import torch and build the parser first
    start = time.perf_counter()
    rules = fxrules.parse_rules(text, "big.fxr")
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nparse_rules on 2,000 rules ({len(text):,} characters): {elapsed:.3f} s")
    assert len(rules) == 2000
    assert rules.names == [f"r{i}" for i in range(2000)]
    assert rules["r3"].contract == "approx" and rules["r1"].contract == "exact" and rules["r2"].contract == "changes"


def test_allow_imports_come_from_the_nearest_pyproject(tmp_path, monkeypatch):
    """[tool.fxrules] allow-imports in pyproject.toml works like --allow-import."""
    from fxrules.tools.cli import main

    rule = tmp_path / "r.fxr"
    rule.write_text("rule r: call_function json.dumps($x) -> $x\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(rule)]) == 1  # json is not on the allow-list
    (tmp_path / "pyproject.toml").write_text('[tool.fxrules]\nallow-imports = ["json"]\n', encoding="utf-8")
    nested = tmp_path / "sub"
    nested.mkdir()
    monkeypatch.chdir(nested)
    assert main(["check", str(rule)]) == 0
    (tmp_path / "pyproject.toml").write_text('[tool.fxrules]\nallow-imports = "json"\n', encoding="utf-8")
    assert main(["check", str(rule)]) == 2
