"""Files shipped inside the package (the grammar, and tables as JSON): read by path, without importing or running anything.

Three generated tables live next to this module:

- ``parse_tables.json``: the grammar's LALR table (:func:`fxrules.lang.parser.shipped_tables`), made by
  ``python -m fxrules.tools.indexes``;
- ``torch_index.json``: what the checker needs of each allow-listed name (:mod:`fxrules.lang.torch_index`),
  made by ``python -m fxrules.tools.indexes``;
- ``allowlist.json``: what rule files may name (:mod:`fxrules.lang.allowlist`), made by
  ``scripts/gen_allowlist.py`` and reviewed (SECURITY.md).

Why JSON and not Python modules holding the same literals (as they once were): Python compiles a module from source wherever its bytecode is not cached (an editable install
under ``PYTHONDONTWRITEBYTECODE=1``, a read-only tree), and compiling these three took 62 ms of
every cold ``fxrules check`` (0.36 s in all on the bundled library); ``json.loads`` reads them in
about 2 ms, cached bytecode or not. JSON is also data only: reading it cannot run code.

Each file is one JSON object whose ``about`` says what made it. :func:`json_text` writes them: one
key per line, the items of a list (or the entries of an object) at the top level one per line, so
a regenerated table diffs line by line.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["read_json", "read_text", "json_text"]

HERE = os.path.dirname(os.path.abspath(__file__))
"""``fxrules/lang`` on disk. The package is installed as files (``fxrules.LIBRARY`` is a folder too), so
its data is read by path: ``importlib.resources`` would also work from a zip, but importing it costs
every cold start 5 ms (it imports ``tempfile``, ``shutil`` and ``random``)."""


def read_text(name: str) -> str:
    """The text of the shipped file ``name`` (``fxrules/lang/NAME``)."""
    with open(os.path.join(HERE, name), encoding="utf-8") as file:
        return file.read()


def read_json(name: str) -> dict:
    """The object in the shipped file ``name`` (``fxrules/lang/NAME``). A file that is not a JSON
    object raises ValueError naming it: the package is damaged, not the user's input."""
    data = json.loads(read_text(name))
    if not isinstance(data, dict):
        raise ValueError(f"fxrules/lang/{name}: expected a JSON object, found {type(data).__name__}")
    return data


def json_text(about: str, fields: dict[str, Any]) -> str:
    """The text of a shipped table: ``{"about": about, **fields}``, deterministic for the same input
    (keys in the order given; tuples and lists as arrays; sets and frozensets as sorted arrays)."""
    lines = [f'"about": {json.dumps(about)}']
    for key, value in fields.items():
        value = _plain(value)
        if isinstance(value, list) and value:
            body = ",\n".join(json.dumps(item) for item in value)
            lines.append(f"{json.dumps(key)}: [\n{body}\n]")
        elif isinstance(value, dict) and value:
            body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{json.dumps(key)}: {{\n{body}\n}}")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _plain(value: Any) -> Any:
    """``value`` with sets as sorted lists, everywhere inside it (JSON has no sets; tuples it writes as
    arrays itself). A dictionary key that is not a string is an error: JSON would turn it into one."""
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a shipped table's object keys must be strings")
        return {k: _plain(v) for k, v in value.items()}
    return value
