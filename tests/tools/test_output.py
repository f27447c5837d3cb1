"""Output of the commands: SARIF 2.1.0 (validated against the standard's schema), colour by
NO_COLOR/FORCE_COLOR/terminal, --quiet/--verbose, and the subcommand's usage on a bad option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxrules.lang.diagnostics import CODES, Diagnostic
from fxrules.tools.cli import main
from fxrules.tools.sarif import render_sarif
from fxrules.tools.style import Style, wants_colour

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0-subset.json").read_text())
TWO_PROBLEMS = ("rule a:\n    call_module Dropout($x) -> $y\n"
                "rule b:\n    call_function torch.relux($x) -> $x\n")


def _validate(log: dict) -> None:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_schema_rejects_what_sarif_forbids():
    """The vendored schema is not vacuous: it rejects a bad level, a zero line and an unknown property."""
    good = render_sarif([Diagnostic("a.fxr", 2, 3, "unknown-target", "m", end_line=2, end_column=7)], CODES)
    _validate(good)
    for path, value in ((("runs", 0, "results", 0, "level"), "fatal"),
                        (("runs", 0, "results", 0, "locations", 0, "physicalLocation", "region", "startLine"), 0),
                        (("runs", 0, "results", 0, "extra"), 1), (("version",), "2.0.0")):
        bad = json.loads(json.dumps(good))
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(AssertionError):
            _validate(bad)


def test_check_sarif_is_valid_and_says_what_text_says(tmp_path, monkeypatch, capsys):
    (tmp_path / "r.fxr").write_text(TWO_PROBLEMS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "sarif", "r.fxr", "missing.fxr"]) == 2
    log = json.loads(capsys.readouterr().out)
    _validate(log)
    (run,) = log["runs"]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    results = run["results"]
    assert sorted(rules) == ["io-error", "unbound-capture", "unknown-target"]
    assert [(r["ruleId"], r["level"]) for r in results] == [
        ("io-error", "error"), ("unbound-capture", "error"), ("unknown-target", "error")]
    for result in results:
        assert rules[result["ruleIndex"]] == result["ruleId"]
    missing, unbound, target = results
    assert "region" not in missing["locations"][0]["physicalLocation"]  # a path as a whole: no made-up line
    location = unbound["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "r.fxr", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 2, "startColumn": 32, "endLine": 2, "endColumn": 34}
    assert unbound["message"]["text"].endswith("\nthe pattern binds: $x")
    assert "did you mean `torch.relu`?" in target["message"]["text"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].startswith("file://")


def test_sarif_of_a_clean_check_has_no_results(tmp_path, capsys):
    (tmp_path / "r.fxr").write_text("rule a:\n    call_module Dropout($x) -> $x\n", encoding="utf-8")
    assert main(["check", "--format", "sarif", str(tmp_path / "r.fxr")]) == 0
    log = json.loads(capsys.readouterr().out)
    _validate(log)
    assert log["runs"][0]["results"] == [] and log["runs"][0]["tool"]["driver"]["rules"] == []


def test_absolute_paths_become_file_uris():
    log = render_sarif([Diagnostic("/tmp/a b.fxr", 1, 1, "x-code", "m", severity="warning")], {})
    _validate(log)
    result = log["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "file:///tmp/a%20b.fxr"}
    assert result["level"] == "warning" and log["runs"][0]["tool"]["driver"]["rules"][0]["id"] == "x-code"


def test_verify_sarif_reports_the_wrong_rule_only(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    (tmp_path / "w.fxr").write_text(
        "rule wrong_neg [exact]:\n    call_function torch.relu($x) -> call_function torch.neg($x)\n"
        "rule fine [exact]:\n    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n",
        encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(["verify", "w.fxr", "--format", "sarif", "--max-examples", "5", "--seed", "0", "--no-database"])
    log = json.loads(capsys.readouterr().out)
    _validate(log)
    assert code == 1
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "wrong" and "wrong_neg" in result["message"]["text"]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 1
    assert "--reproduce" in result["message"]["text"]


@pytest.mark.parametrize("env, tty, expected", [
    ({}, True, True), ({}, False, False), ({"NO_COLOR": "1"}, True, False), ({"FORCE_COLOR": "1"}, False, True),
    ({"FORCE_COLOR": "0"}, False, False), ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),
    ({"TERM": "dumb"}, True, False), ({"NO_COLOR": ""}, True, True),
])
def test_colour_follows_no_color_force_color_and_the_terminal(monkeypatch, env, tty, expected):
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Stream:
        def isatty(self):
            return tty

    assert wants_colour(Stream()) is expected


def test_check_text_is_coloured_only_when_asked(tmp_path, monkeypatch, capsys):
    (tmp_path / "r.fxr").write_text(TWO_PROBLEMS, encoding="utf-8")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(["check", str(tmp_path / "r.fxr")]) == 1
    coloured = capsys.readouterr().out
    assert "\x1b[1;31merror[unbound-capture]\x1b[0m" in coloured and "\x1b[1;36mnote\x1b[0m" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["check", str(tmp_path / "r.fxr")]) == 1
    plain = capsys.readouterr().out
    assert "\x1b[" not in plain and "error[unbound-capture]" in plain
    assert Style(True).diagnostic(plain.split("\n\n")[0]).replace("\x1b[0m", "").count("\x1b[") >= 3
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR")
    assert main(["check", "--format", "json", str(tmp_path / "r.fxr")]) == 1
    assert "\x1b[" not in capsys.readouterr().out


def test_quiet_drops_the_summary_and_verbose_names_config_and_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "r.fxr").write_text(TWO_PROBLEMS, encoding="utf-8")
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["check", "-q", str(tmp_path / "r.fxr")]) == 1
    out, err = capsys.readouterr()
    assert "error[unbound-capture]" in out and err == ""
    (tmp_path / "pyproject.toml").write_text("[tool.fxrules]\n", encoding="utf-8")
    assert main(["check", "--verbose", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"configuration {tmp_path / 'pyproject.toml'}" in err and f"reading {tmp_path / 'r.fxr'}" in err
    assert "1 file, 0 rules checked: 2 errors, 0 warnings" in err
    with pytest.raises(SystemExit) as info:
        main(["check", "-q", "-v", str(tmp_path)])
    assert info.value.code == 2


@pytest.mark.parametrize("command", ["check", "fmt", "verify", "apply", "explain"])
def test_an_unknown_option_prints_the_subcommands_usage(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "x.fxr", "--bogus", *(["--model", "m:f"] if command in ("apply", "explain") else [])])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: fxrules {command} ") and err.rstrip().endswith(
        f"fxrules {command}: error: unrecognized arguments: --bogus")


def test_an_unknown_option_before_the_command_is_fxrules_own(capsys):
    with pytest.raises(SystemExit):
        main(["--bogus"])
    err = capsys.readouterr().err
    assert err.startswith("usage: fxrules [-h]") and "error: unrecognized arguments: --bogus" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    import fxrules

    assert info.value.code == 0 and capsys.readouterr().out == f"fxrules {fxrules.__version__}\n"


def test_analyze_sarif_is_valid_and_locates_each_finding(tmp_path, monkeypatch, capsys):
    """analyze's findings through the same renderer: a warning at the rule, its code from the finding codes."""
    (tmp_path / "r.fxr").write_text(
        "rule never: call_function torch.relu($x) where $x.ndim == 2 and $x.ndim == 3 -> $x\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--static", "--format", "sarif", "r.fxr"]) == 1
    log = json.loads(capsys.readouterr().out)
    _validate(log)
    (run,) = log["runs"]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["unsatisfiable"]
    (result,) = run["results"]
    assert result["ruleId"] == "unsatisfiable" and result["level"] == "warning"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] == 1 and region["startColumn"] == 6  # the rule's name
