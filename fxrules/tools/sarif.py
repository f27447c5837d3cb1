"""SARIF 2.1.0 output (``--format sarif``): code-scanning services (GitHub, GitLab, Azure DevOps) and
editors read it.

:func:`render_sarif` takes diagnostic-like records (:class:`DiagnosticLike`: what
:class:`fxrules.lang.diagnostics.Diagnostic` has) and the tool's rules (a stable code and what
it means), so ``check``'s diagnostics, ``verify``'s findings and any other command's findings
render the same way once they are Diagnostics. One run, one result per diagnostic; a result's
``ruleId`` is the diagnostic's code and ``ruleIndex`` its place in ``tool.driver.rules``.

Paths: a relative path stays relative (to ``%SRCROOT%``, the working directory: what code
scanning expects), ``/``-separated and percent-encoded; an absolute path becomes a ``file://``
URI. Columns count Unicode code points (``columnKind``), as Diagnostic's do. A diagnostic about a
whole file (line 0, such as a path that does not exist) has no region.
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse
from typing import Iterable, Mapping, Protocol

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"
_LEVELS = {"error": "error", "warning": "warning", "note": "note", "info": "note"}


class DiagnosticLike(Protocol):
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    code: str
    message: str
    severity: str
    notes: tuple[str, ...]


def render_sarif(diagnostics: Iterable[DiagnosticLike], rules: Mapping[str, str], *, tool: str = "fxrules",
                 version: str = "", information_uri: str = "") -> dict:
    """A SARIF 2.1.0 log (as a JSON-ready dict) of ``diagnostics``.

    ``rules`` maps each code to a one-line description (``fxrules.errors.CODES`` for check); codes
    the diagnostics use but ``rules`` lacks are listed with the code as their description.
    """
    diagnostics = list(diagnostics)
    codes = list(dict.fromkeys([*rules, *(d.code for d in diagnostics)]))
    used = [code for code in codes if any(d.code == code for d in diagnostics)]
    index = {code: i for i, code in enumerate(used)}
    driver: dict = {"name": tool, "rules": [_rule(code, rules.get(code, code)) for code in used]}
    if version:
        driver["version"] = version
    if information_uri:
        driver["informationUri"] = information_uri
    run = {"tool": {"driver": driver}, "columnKind": "unicodeCodePoints",
           "originalUriBaseIds": {"%SRCROOT%": {"uri": _directory_uri(os.getcwd())}},
           "results": [_result(d, index[d.code]) for d in diagnostics]}
    return {"$schema": SCHEMA_URI, "version": VERSION, "runs": [run]}


def _rule(code: str, description: str) -> dict:
    return {"id": code, "name": _camel(code), "shortDescription": {"text": description}}


def _camel(code: str) -> str:
    """SARIF's rule names are identifiers: ``unknown-target`` -> ``UnknownTarget``."""
    return "".join(part[:1].upper() + part[1:] for part in code.replace("_", "-").split("-") if part) or code


def _result(d: DiagnosticLike, rule_index: int) -> dict:
    text = d.message + "".join(f"\n{note}" for note in d.notes)
    physical: dict = {"artifactLocation": _artifact(d.path)}
    if d.line >= 1:
        region = {"startLine": d.line, "startColumn": max(1, d.column)}
        if d.end_line >= d.line and d.end_line >= 1:
            region["endLine"] = d.end_line
            if d.end_column >= 1 and (d.end_line > d.line or d.end_column > region["startColumn"]):
                region["endColumn"] = d.end_column
        physical["region"] = region
    return {"ruleId": d.code, "ruleIndex": rule_index, "level": _LEVELS.get(d.severity, "warning"),
            "message": {"text": text}, "locations": [{"physicalLocation": physical}]}


def _artifact(path: str) -> dict:
    if os.path.isabs(path):
        return {"uri": pathlib.Path(path).as_uri()}
    return {"uri": urllib.parse.quote(path.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def _directory_uri(path: str) -> str:
    uri = pathlib.Path(path).as_uri()
    return uri if uri.endswith("/") else uri + "/"
