"""docs/language.md covers each construct of issue 19 with an example from the bundled library: the
rule it quotes exists in the library file it names, and that rule (or its file) uses the construct."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fxrules

ROOT = Path(__file__).resolve().parents[2]
LANGUAGE = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")

# (construct, library file, rule, a regular expression the rule's text (or, for `use`, the file's) matches)
EXAMPLES = [
    ("named patterns", "fuse/intrinsic.fxr", "fuse_linear_relu", r"^\s+relu\("),
    ("optional parts", "fuse/attention.fxr", "sdpa_mul_scale", r"weights\("),
    ("use", "fuse/collapse.fxr", "to_same_dtype", r'^use "casts\.fxr"'),
    ("commutative operators", "fuse/attention.fxr", "sdpa_mul_scale_mask",
     r"operator\.add\(\s*\$m,\s*call_function operator\.mul\("),
    ("variadic captures", "fuse/permute.fxr", "permute_compose", r"\*\$q\)"),
    ("computed values", "fuse/permute.fxr", "permute_compose", r"\{tuple\("),
    ("conditions over lists", "fuse/permute.fxr", "permute_identity", r"for i in range\("),
    ("shared replacement nodes", "fuse/casts.fxr", "duplicate_cast", r"-> .* as c, c$"),
    ("users conditions", "fuse/casts.fxr", "duplicate_cast", r"used_only_by\(a,"),
]


def _rule_text(source: str, name: str) -> str:
    match = re.search(rf"^rule {re.escape(name)}\b.*?(?=^\S|\Z)", source, re.M | re.S)
    assert match, f"no rule {name}"
    return match.group(0)


@pytest.mark.parametrize("construct, file, rule, used", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_construct_is_quoted_from_a_library_rule(construct, file, rule, used):
    source = (fxrules.LIBRARY / file).read_text(encoding="utf-8")
    text = source if construct == "use" else _rule_text(source, rule)
    assert re.search(used, text, re.M | re.S), f"{file}:{rule} does not show {construct}"
    assert f"rule {rule} " in LANGUAGE, f"docs/language.md does not quote {rule}"
    assert file in LANGUAGE, f"docs/language.md does not name {file}"
    assert rule in fxrules.load_rules(fxrules.LIBRARY / file).names
