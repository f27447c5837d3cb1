"""``fxrules new NAME``: a new rule file to start from, with a doc string, a contract and examples.

The scaffold is a working rule (it checks clean and its examples pass: ``fxrules test`` on it
exits 0), so a new user edits something that runs rather than a blank page. The family picks the
folder and the contract: ``fold`` rules change numerics within tolerance (``approx``), ``swap``
rules change outputs on purpose (``changes``), the others keep them bit for bit (``exact``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

CONTRACTS = {"cleanup": "exact", "canonicalize": "exact", "fold": "approx", "swap": "changes", "aten": "exact"}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ScaffoldError(Exception):
    """The rule cannot be scaffolded (a bad name, a file already there): one line for the user."""


@dataclass(frozen=True, slots=True)
class Scaffold:
    """The file ``fxrules new`` writes: its path and text."""

    path: str
    text: str


def scaffold(name: str, family: str = "", directory: str = "") -> Scaffold:
    """The file ``fxrules new`` writes: ``DIRECTORY/[FAMILY/]NAME.fxr`` (DIRECTORY: ``rules`` when that
    folder exists, else the working directory)."""
    if not NAME.match(name):
        raise ScaffoldError(f"a rule name is a letter or _ then letters, digits or _, got {name!r}")
    if family and not NAME.match(family):
        raise ScaffoldError(f"a family is a folder name of letters, digits or _, got {family!r}")
    base = directory or ("rules" if os.path.isdir("rules") else ".")
    path = os.path.join(base, family, f"{name}.fxr") if family else os.path.join(base, f"{name}.fxr")
    contract = CONTRACTS.get(family, "exact")
    return Scaffold(path, _TEMPLATE.format(name=name, contract=contract))


def write(found: Scaffold) -> None:
    """Write the scaffold; never over an existing file."""
    os.makedirs(os.path.dirname(found.path) or ".", exist_ok=True)
    try:
        with open(found.path, "x", encoding="utf-8") as handle:
            handle.write(found.text)
    except FileExistsError:
        raise ScaffoldError(f"{found.path} exists already; pick another name or remove it") from None
    except OSError as exc:
        raise ScaffoldError(f"cannot write {found.path}: {exc.strerror or exc}") from None


_TEMPLATE = '''\
# {name}: say what the rule rewrites, and why the rewrite keeps its contract.
# Contracts: [exact] outputs bit-identical, [approx] within tolerance, [changes] outputs change on purpose.
# Check it with `fxrules check`, run its examples with `fxrules test`, property-test it with `fxrules verify`.

rule {name} "relu(relu(x)) is relu(x)" [{contract}]:
    call_function torch.relu(call_function torch.relu($x))
    -> call_function torch.relu($x)
    # an example model: the rule must rewrite it once (`example 0:` says it must not fire)
    example: call_function torch.relu(call_function torch.relu($x)) given $x: [2, 8]
    example 0: call_function torch.relu($x) given $x: [2, 8]
'''
