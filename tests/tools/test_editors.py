"""The VS Code extension folder: its manifest names the grammar, the language configuration and the
server command that exist; the TextMate grammar's patterns compile and colour the library's files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import fxrules

VSCODE = Path(__file__).resolve().parents[2] / "editors" / "vscode"


def _patterns(grammar: dict) -> dict[str, str]:
    return {name: entry["match"] for name, entry in grammar["repository"].items()}


def test_the_manifest_points_at_files_that_exist():
    manifest = json.loads((VSCODE / "package.json").read_text())
    (language,) = manifest["contributes"]["languages"]
    (grammar,) = manifest["contributes"]["grammars"]
    assert language["extensions"] == [".fxr"] and grammar["language"] == language["id"] == "fxrules"
    assert (VSCODE / grammar["path"]).is_file() and (VSCODE / language["configuration"]).is_file()
    assert (VSCODE / manifest["main"]).is_file()
    assert manifest["contributes"]["configuration"]["properties"]["fxrules.server.command"]["default"] == [
        "fxrules", "lsp"]
    assert manifest["version"] == fxrules.__version__
    json.loads((VSCODE / language["configuration"]).read_text())


def test_the_grammar_colours_every_library_file():
    grammar = json.loads((VSCODE / "syntaxes" / "fxrules.tmLanguage.json").read_text())
    assert grammar["scopeName"] == "source.fxrules"
    included = {p["include"].lstrip("#") for p in grammar["patterns"]}
    assert included == set(grammar["repository"])
    compiled = {name: re.compile(pattern) for name, pattern in _patterns(grammar).items()}
    lines = [line for p in sorted(fxrules.LIBRARY.rglob("*.fxr")) for line in p.read_text().splitlines()]
    for name in ("comment", "rule-head", "contract", "keyword", "opcode", "capture", "number"):  # line by line,
        assert any(compiled[name].search(line) for line in lines), name  # as TextMate matches
    head = compiled["rule-head"].match("rule fold_conv2d_bn \"x\" [approx]:")
    assert head and head.group(2) == "fold_conv2d_bn"
    opcode = compiled["opcode"].search("    call_module fxrules.builders.fold_conv_bn(conv, bn)($x)")
    assert opcode.group(1) == "call_module" and opcode.group(2) == "fxrules.builders.fold_conv_bn"
    assert compiled["capture"].findall("torch.add($x, $y_2)") == ["$x", "$y_2"]
