"""fxrules.tools.codediff: a unified diff that is correct (applying it gives the new text) and fast on big code."""

from __future__ import annotations

import difflib
import re
import time

from hypothesis import given, strategies as st

from fxrules.tools.codediff import opcodes, unified_diff


def patch(a: list[str], diff: list[str]) -> list[str]:
    """Apply a unified diff to ``a`` strictly: every context and removed line must be where the hunk says."""
    out: list[str] = []
    pos = 0
    lines = iter(diff[2:]) if diff else iter(())
    if diff:
        assert diff[0].startswith("--- ") and diff[1].startswith("+++ ")
    for line in lines:
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@\n$", line)
        if m:
            start, length = int(m.group(1)), int(m.group(2) or 1)
            first = start - 1 if length else start  # an empty range names the line before
            assert first >= pos
            out.extend(a[pos:first])
            pos = first
            continue
        kind, text = line[0], line[1:]
        if kind == " ":
            assert a[pos] == text
            out.append(text)
            pos += 1
        elif kind == "-":
            assert a[pos] == text
            pos += 1
        else:
            assert kind == "+"
            out.append(text)
    out.extend(a[pos:])
    return out


def check_hunk_counts(diff: list[str]) -> None:
    """Each hunk header's lengths equal its lines, as patch(1) requires."""
    i = 2
    while i < len(diff):
        m = re.match(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", diff[i])
        assert m, diff[i]
        old, new = int(m.group(1) or 1), int(m.group(2) or 1)
        i += 1
        seen_old = seen_new = 0
        while i < len(diff) and not diff[i].startswith("@@"):
            seen_old += diff[i][0] in " -"
            seen_new += diff[i][0] in " +"
            i += 1
        assert (seen_old, seen_new) == (old, new)


lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "x = 1\n", "y = f(x)\n", "return y\n", "\n"]), max_size=40)


@given(lines, lines)
def test_the_diff_applies_and_its_hunks_add_up(a, b):
    diff = list(unified_diff(a, b, "before", "after"))
    assert patch(a, diff) == b
    check_hunk_counts(diff)
    assert (diff == []) == (a == b)


@given(lines, lines)
def test_opcodes_cover_both_sides(a, b):
    codes = opcodes(a, b)
    i = j = 0
    for tag, i1, i2, j1, j2 in codes:
        assert (i1, j1) == (i, j)
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


def test_same_format_as_difflib_on_a_simple_change():
    a = [f"line {k}\n" for k in range(20)]
    b = a[:5] + ["new\n"] + a[7:]
    assert list(unified_diff(a, b, "before", "after")) == list(difflib.unified_diff(a, b, "before", "after"))


def test_large_generated_code_is_fast():
    # 20,000 unique lines, a quarter deleted and some renamed, as a rewrite of generated code does
    a = [f"    v{k} = torch.relu(v{k - 1});  v{k - 1} = None\n" for k in range(20_000)]
    b = [line.replace("relu", "gelu") if k % 97 == 0 else line for k, line in enumerate(a) if k % 4 != 1]
    start = time.perf_counter()
    diff = list(unified_diff(a, b, "before", "after"))
    elapsed = time.perf_counter() - start
    assert patch(a, diff) == b
    assert elapsed < 5.0, elapsed  # about 0.1 s; difflib.unified_diff takes minutes here
