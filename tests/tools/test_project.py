"""Project configuration and file discovery: ``[tool.fxrules]``/``fxrules.toml`` found from each rule
file upward (CLI and API alike), unknown keys warned about, ``python-path`` for builders and models,
``.gitignore`` and excludes when walking directories, globs, standard input, missing paths."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

import fxrules
from fxrules.lang.config import DEFAULT_EXCLUDE, Config, ConfigError, config_file, discover
from fxrules.lang.discover import IgnoreRules, collect, compile_pattern, walk
from fxrules.tools.cli import main

JSON_RULE = "rule r: call_function json.dumps($x) -> $x\n"
CLEAN = "rule keep:\n    call_module Dropout($x) -> $x\n"
BROKEN = "rule broken:\n    call_module Dropout($x) -> $y\n"


@pytest.fixture
def isolated(monkeypatch):
    """sys.path and sys.modules restored after the test (python-path and --model change them)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("mymodels", "mybuilders", "projmodels")):
            del sys.modules[name]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def test_config_is_found_from_the_rule_file_not_the_working_directory(tmp_path, monkeypatch, capsys):
    write(tmp_path, {"proj/pyproject.toml": '[tool.fxrules]\nallow-imports = ["json"]\n',
                     "proj/rules/r.fxr": JSON_RULE, "elsewhere/x.txt": ""})
    monkeypatch.chdir(tmp_path / "elsewhere")  # no configuration here or above
    assert main(["check", str(tmp_path / "proj" / "rules" / "r.fxr")]) == 0
    assert main(["check", str(tmp_path / "proj" / "rules")]) == 0
    # and the API finds the same configuration
    assert fxrules.load_rules(tmp_path / "proj" / "rules").names == ["r"]


def test_without_a_configuration_the_import_is_refused(tmp_path, monkeypatch, capsys):
    write(tmp_path, {"r.fxr": JSON_RULE})
    monkeypatch.chdir(tmp_path)
    assert main(["check", "r.fxr"]) == 1
    assert "error[import-not-allowed]" in capsys.readouterr().out
    with pytest.raises(fxrules.RuleFileError):
        fxrules.load_rules(tmp_path / "r.fxr")


def test_fxrules_toml_wins_over_pyproject_in_the_same_directory(tmp_path):
    write(tmp_path, {"fxrules.toml": 'allow-imports = ["json"]\n',
                     "pyproject.toml": '[tool.fxrules]\nallow-imports = ["csv"]\n', "r.fxr": JSON_RULE})
    assert config_file(tmp_path / "r.fxr") == os.fspath(tmp_path / "fxrules.toml")
    assert discover(tmp_path).allow_imports == ("json",)


def test_a_pyproject_without_the_table_is_passed_over(tmp_path):
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\nallow-imports = ["json"]\n',
                     "sub/pyproject.toml": '[project]\nname = "x"\n', "sub/r.fxr": JSON_RULE})
    assert config_file(tmp_path / "sub" / "r.fxr") == os.fspath(tmp_path / "pyproject.toml")


def test_explicit_config_applies_to_every_path(tmp_path):
    write(tmp_path, {"settings/fx.toml": 'allow-imports = ["json"]\n', "r.fxr": JSON_RULE})
    assert fxrules.load_rules(tmp_path / "r.fxr", config=tmp_path / "settings" / "fx.toml").names == ["r"]
    assert fxrules.load_rules(tmp_path / "r.fxr", config=Config(allow_imports=("json",))).names == ["r"]
    assert main(["check", "--config", str(tmp_path / "settings" / "fx.toml"), str(tmp_path / "r.fxr")]) == 0


def test_unknown_keys_warn_in_the_api_and_the_cli(tmp_path, capsys):
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\nallow-imports = ["json"]\nalow-imports = ["x"]\n',
                     "r.fxr": JSON_RULE})
    with pytest.warns(fxrules.ConfigWarning, match="unknown key 'alow-imports'"):
        fxrules.load_rules(tmp_path / "r.fxr")
    assert main(["check", str(tmp_path / "r.fxr")]) == 0
    err = capsys.readouterr().err
    assert "fxrules: warning:" in err and "unknown key 'alow-imports'" in err
    assert main(["check", "--quiet", str(tmp_path / "r.fxr")]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text, message", [
    ('[tool.fxrules]\nallow-imports = "json"\n', "allow-imports must be a list of strings"),
    ('[tool.fxrules]\nexclude = [1]\n', "exclude must be a list of strings"),
    ('[tool.fxrules\n', "not valid TOML"),
])
def test_a_malformed_configuration_is_one_line_exit_2(tmp_path, capsys, text, message):
    write(tmp_path, {"pyproject.toml": text, "r.fxr": CLEAN})
    assert main(["check", str(tmp_path / "r.fxr")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fxrules: error: ") and message in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match=message):
        fxrules.load_rules(tmp_path / "r.fxr")


def test_python_path_lets_rules_name_the_projects_own_builder(tmp_path, isolated, monkeypatch):
    pytest.importorskip("torch")
    write(tmp_path, {
        "pyproject.toml": '[tool.fxrules]\nallow-imports = ["mybuilders"]\npython-path = ["src"]\n',
        "src/mybuilders.py": """
            import torch

            def plain_relu(relu):
                return torch.nn.ReLU()
        """,
        "rules/r.fxr": "rule r [exact]:\n    call_module ReLU($x) as r -> call_module mybuilders.plain_relu(r)($x)\n",
    })
    monkeypatch.chdir(tmp_path / "rules")
    assert main(["check", "r.fxr"]) == 0
    rules = fxrules.load_rules(tmp_path / "rules")
    assert rules.names == ["r"] and os.fspath(tmp_path / "src") in sys.path


def test_model_is_found_from_the_working_directory_as_python_m_does(tmp_path, isolated, monkeypatch, capsys):
    """The console script's sys.path[0] is its bin folder, not the working directory: --model still works."""
    pytest.importorskip("torch")
    write(tmp_path, {"projmodels.py": """
        import torch

        def net():
            return torch.nn.Sequential(torch.nn.Dropout(), torch.nn.ReLU()).eval()
    """})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), os.fspath(tmp_path))])
    assert main(["apply", "cleanup", "--model", "projmodels:net", "--input", "2x3"]) == 0
    assert "remove_dropout" in capsys.readouterr().out


def test_python_path_is_where_models_are_found_too(tmp_path, isolated, monkeypatch, capsys):
    pytest.importorskip("torch")
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\npython-path = ["lib"]\n', "lib/mymodels.py": """
        import torch

        def net():
            return torch.nn.Sequential(torch.nn.Dropout(), torch.nn.ReLU()).eval()
    """})
    monkeypatch.chdir(tmp_path)
    assert main(["apply", "cleanup", "--model", "mymodels:net"]) == 0
    capsys.readouterr()
    os.remove(tmp_path / "pyproject.toml")
    del sys.modules["mymodels"]
    sys.path.remove(os.fspath(tmp_path / "lib"))
    assert main(["apply", "cleanup", "--model", "mymodels:net"]) == 2
    assert "set python-path" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# File discovery
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, path, is_dir, ignored", [
    ("*.fxr", "a/b/c.fxr", False, True),
    ("/top.fxr", "top.fxr", False, True),
    ("/top.fxr", "sub/top.fxr", False, False),
    ("build/", "x/build", True, True),
    ("build/", "x/build", False, False),
    ("a/**/z.fxr", "a/z.fxr", False, True),
    ("a/**/z.fxr", "a/b/c/z.fxr", False, True),
    ("**/gen", "deep/er/gen", True, True),
    ("out/**", "out/x/y.fxr", False, True),
    ("f?o.fxr", "foo.fxr", False, True),
    ("f?o.fxr", "f/o.fxr", False, False),
    ("[ab].fxr", "b.fxr", False, True),
    ("[!ab].fxr", "b.fxr", False, False),
    ("\\#x.fxr", "#x.fxr", False, True),
    ("docs/*.fxr", "docs/sub/a.fxr", False, False),
])
def test_gitignore_patterns(pattern, path, is_dir, ignored, tmp_path):
    rules = IgnoreRules.parse(os.fspath(tmp_path), [pattern])
    assert bool(rules.decide(os.fspath(tmp_path / path), is_dir)) is ignored


def test_comments_and_blank_lines_are_not_patterns():
    assert compile_pattern("# a comment") is None and compile_pattern("   ") is None


def test_negation_reincludes_but_not_below_an_ignored_directory(tmp_path):
    write(tmp_path, {".git/HEAD": "", ".gitignore": "*.fxr\n!keep.fxr\nignored_dir/\n",
                     "keep.fxr": CLEAN, "drop.fxr": CLEAN, "ignored_dir/keep.fxr": CLEAN})
    assert [os.path.basename(p) for p in walk(os.fspath(tmp_path), Config())] == ["keep.fxr"]


def test_directories_skip_gitignored_and_default_excluded_folders(tmp_path):
    write(tmp_path, {
        ".git/HEAD": "", ".gitignore": "generated/\n", "rules/sub/.gitignore": "scratch.fxr\n",
        "rules/a.fxr": CLEAN, "rules/sub/b.fxr": CLEAN, "rules/sub/scratch.fxr": BROKEN,
        "generated/g.fxr": BROKEN, ".venv/lib/x.fxr": BROKEN, "myenv/pyvenv.cfg": "", "myenv/y.fxr": BROKEN,
        "build/z.fxr": BROKEN, "node_modules/n.fxr": BROKEN, "__pycache__/c.fxr": BROKEN,
    })
    found = walk(os.fspath(tmp_path), Config())
    assert sorted(os.path.relpath(p, tmp_path) for p in found) == ["rules/a.fxr", "rules/sub/b.fxr"]
    # the root .gitignore applies when walking a folder below it
    write(tmp_path, {"rules/generated/h.fxr": BROKEN})
    assert sorted(os.path.relpath(p, tmp_path) for p in walk(os.fspath(tmp_path / "rules"), Config())) == [
        "rules/a.fxr", "rules/sub/b.fxr"]


def test_check_a_directory_reports_nothing_from_ignored_folders(tmp_path, monkeypatch, capsys):
    write(tmp_path, {".git/HEAD": "", ".gitignore": "out/\n", "a.fxr": CLEAN, "out/bad.fxr": BROKEN,
                     ".venv/bad.fxr": BROKEN, "fixtures/bad.fxr": BROKEN,
                     "pyproject.toml": '[tool.fxrules]\nextend-exclude = ["fixtures"]\n'})
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 0
    assert "1 file, 1 rule checked: no problems" in capsys.readouterr().out
    # a file named explicitly is always checked, whatever excludes say
    assert main(["check", "out/bad.fxr", "fixtures/bad.fxr"]) == 1
    # and a directory named explicitly is walked
    assert main(["check", "fixtures"]) == 1
    capsys.readouterr()
    assert main(["check", "--exclude", "a.fxr", "."]) == 0
    assert "0 files, 0 rules checked" in capsys.readouterr().out


def test_exclude_replaces_the_defaults(tmp_path):
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\nexclude = ["skip"]\n', "build/a.fxr": CLEAN,
                     "skip/b.fxr": CLEAN})
    config = discover(tmp_path)
    assert "build" not in config.excludes and "build" in DEFAULT_EXCLUDE
    assert [os.path.relpath(p, tmp_path) for p in walk(os.fspath(tmp_path), config)] == ["build/a.fxr"]


def test_globs(tmp_path, monkeypatch, capsys):
    write(tmp_path, {"rules/a.fxr": CLEAN, "rules/deep/b.fxr": "rule keep_b:\n    call_module Dropout($x) -> $x\n",
                     "rules/c.txt": ""})
    monkeypatch.chdir(tmp_path)
    files, missing = collect(["rules/**/*.fxr"], {})
    assert sorted(files) == ["rules/a.fxr", "rules/deep/b.fxr"] and not missing
    assert main(["check", "rules/*.fxr"]) == 0
    assert "1 file, 1 rule" in capsys.readouterr().out
    assert main(["check", "nothing/*.fxr"]) == 2
    assert "nothing/*.fxr: error[io-error]: no rule files match this pattern" in capsys.readouterr().out


def test_a_missing_path_has_no_made_up_line(tmp_path, capsys):
    missing = os.fspath(tmp_path / "nope.fxr")
    assert main(["check", "--format", "json", missing]) == 2
    (diagnostic,) = json.loads(capsys.readouterr().out)["diagnostics"]
    assert (diagnostic["line"], diagnostic["column"]) == (0, 0)
    with pytest.raises(fxrules.RuleFileError) as info:
        fxrules.load_rules(missing)
    assert str(info.value).startswith(f"{missing}: error[io-error]: no such file or directory")


def test_check_reads_standard_input(tmp_path, monkeypatch, capsys):
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\nallow-imports = ["json"]\n'})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BROKEN.encode())))
    assert main(["check", "-", "--stdin-filename", "rules/mine.fxr"]) == 1
    assert "rules/mine.fxr:2:32: error[unbound-capture]" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(JSON_RULE.encode())))
    assert main(["check", "-", "--stdin-filename", "rules/mine.fxr"]) == 0  # its project's allow-imports
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CLEAN.encode())))
    assert main(["check", "-"]) == 0
    assert main(["check", "-", "x.fxr"]) == 2
    assert main(["check", "--stdin-filename", "x.fxr", "x.fxr"]) == 2


def test_the_repository_itself_checks_clean(monkeypatch, capsys):
    """Its own pyproject excludes the corpus of deliberately broken files; nothing else is wrong."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(["check"]) == 0



@pytest.mark.slow
def test_a_projects_own_builder_passes_the_torch_free_check(tmp_path):
    """The pre-commit hook's environment has no torch: a rule naming the project's builder (whose module
    imports torch) checks clean there, as names under torch do; with torch, the builder is checked."""
    import subprocess

    write(tmp_path, {
        "pyproject.toml": '[tool.fxrules]\nallow-imports = ["mybuilders"]\npython-path = ["src"]\n',
        "src/mybuilders.py": "import torch\n\ndef plain_relu(relu):\n    return torch.nn.ReLU()\n",
        "rules/r.fxr": "rule r [exact]:\n    call_module ReLU($x) as r -> call_module mybuilders.plain_relu(r)($x)\n",
    })
    script = ("import sys; sys.modules['torch'] = None\n"
              "from fxrules.tools.cli import main\n"
              "code = main(['check', 'rules/r.fxr'])\n"
              "assert sys.modules['torch'] is None\n"
              "sys.exit(code)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 file, 1 rule checked: no problems" in run.stdout
    # a name the module lacks is still an error where torch is installed
    (tmp_path / "rules" / "r.fxr").write_text(
        "rule r [exact]:\n    call_module ReLU($x) as r -> call_module mybuilders.plain_relux(r)($x)\n")
    run = subprocess.run([sys.executable, "-m", "fxrules", "check", "rules/r.fxr"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "error[unknown-builder]" in run.stdout


def test_force_exclude_applies_excludes_to_files_named_explicitly(tmp_path, monkeypatch, capsys):
    write(tmp_path, {"pyproject.toml": '[tool.fxrules]\nextend-exclude = ["fixtures", "one.fxr"]\n',
                     "fixtures/deep/bad.fxr": BROKEN, "one.fxr": BROKEN, "ok.fxr": CLEAN})
    monkeypatch.chdir(tmp_path)
    named = ["fixtures/deep/bad.fxr", "one.fxr", "ok.fxr"]
    assert main(["check", *named]) == 1
    capsys.readouterr()
    assert main(["check", "--force-exclude", *named]) == 0
    assert "1 file, 1 rule checked: no problems" in capsys.readouterr().out
    assert main(["check", "--force-exclude", "--exclude", "ok.fxr", "ok.fxr"]) == 0
    assert "0 files" in capsys.readouterr().out
