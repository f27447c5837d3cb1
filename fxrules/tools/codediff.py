"""A unified diff that stays fast on the code of very large graphs (``fxrules apply --diff``).

``difflib.unified_diff`` is quadratic in practice on generated code: 10,000 lines take
about 20 s, 20,000 over a minute. The code torch.fx generates is almost all unique lines
(every line assigns a new name), which is the case patience diff is made for: lines
that occur exactly once on each side are matched first (the longest increasing run of
them, found in O(n log n)), and only the small gaps between those anchors are compared
line by line with difflib. The output is an ordinary unified diff, in difflib's format.
"""

from __future__ import annotations

import bisect
import difflib
from typing import Iterator, Sequence

__all__ = ["opcodes", "unified_diff"]

_GAP_LIMIT = 4_000_000  # gap sizes multiplied: past this, a gap is one replace rather than a slow search
_DEPTH_LIMIT = 64  # nested anchor searches; deeper gaps go to difflib (gaps are small by then)


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """``difflib.SequenceMatcher.get_opcodes()``-style edits turning ``a`` into ``b``."""
    blocks: list[tuple[int, int, int]] = []  # (i, j, size): equal runs
    _match(a, b, 0, len(a), 0, len(b), blocks, 0)
    blocks.sort()
    return _to_opcodes(_merge(blocks), len(a), len(b))


def _match(a, b, alo: int, ahi: int, blo: int, bhi: int, out: list, depth: int) -> None:
    while alo < ahi and blo < bhi and a[alo] == b[blo]:  # common prefix
        out.append((alo, blo, 1))
        alo, blo = alo + 1, blo + 1
    while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:  # common suffix
        ahi, bhi = ahi - 1, bhi - 1
        out.append((ahi, bhi, 1))
    if alo >= ahi or blo >= bhi:
        return
    anchors = _anchors(a, b, alo, ahi, blo, bhi) if depth < _DEPTH_LIMIT else []
    if not anchors:
        out.extend(_difflib_blocks(a, b, alo, ahi, blo, bhi))
        return
    i0, j0 = alo, blo
    for i, j in anchors:
        _match(a, b, i0, i, j0, j, out, depth + 1)
        out.append((i, j, 1))
        i0, j0 = i + 1, j + 1
    _match(a, b, i0, ahi, j0, bhi, out, depth + 1)


def _anchors(a, b, alo, ahi, blo, bhi) -> list[tuple[int, int]]:
    """Lines unique on both sides, matched in order: the longest increasing run of them."""
    count_a: dict[str, int] = {}
    where_a: dict[str, int] = {}
    for i in range(alo, ahi):
        line = a[i]
        count_a[line] = count_a.get(line, 0) + 1
        where_a[line] = i
    count_b: dict[str, int] = {}
    where_b: dict[str, int] = {}
    for j in range(blo, bhi):
        line = b[j]
        if line in count_a:
            count_b[line] = count_b.get(line, 0) + 1
            where_b[line] = j
    pairs = sorted((where_a[line], where_b[line]) for line, n in count_b.items()
                   if n == 1 and count_a[line] == 1)
    if not pairs:
        return []
    # longest increasing subsequence of the b positions (patience sorting with back links)
    tops: list[int] = []  # b position at the top of each pile
    top_index: list[int] = []
    back = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pile = bisect.bisect_left(tops, j)
        back[k] = top_index[pile - 1] if pile else -1
        if pile == len(tops):
            tops.append(j)
            top_index.append(k)
        else:
            tops[pile] = j
            top_index[pile] = k
    chain = []
    k = top_index[-1]
    while k >= 0:
        chain.append(pairs[k])
        k = back[k]
    return chain[::-1]


def _difflib_blocks(a, b, alo, ahi, blo, bhi) -> list[tuple[int, int, int]]:
    if (ahi - alo) * (bhi - blo) > _GAP_LIMIT:
        return []  # one replace: exact, just not minimal
    matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
    return [(alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks() if n]


def _merge(blocks: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    merged: list[tuple[int, int, int]] = []
    for i, j, n in blocks:
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            pi, pj, pn = merged[-1]
            merged[-1] = (pi, pj, pn + n)
        else:
            merged.append((i, j, n))
    return merged


def _to_opcodes(blocks, len_a: int, len_b: int) -> list[tuple[str, int, int, int, int]]:
    codes = []
    i = j = 0
    for bi, bj, n in blocks + [(len_a, len_b, 0)]:
        tag = ""
        if i < bi and j < bj:
            tag = "replace"
        elif i < bi:
            tag = "delete"
        elif j < bj:
            tag = "insert"
        if tag:
            codes.append((tag, i, bi, j, bj))
        if n:
            codes.append(("equal", bi, bi + n, bj, bj + n))
        i, j = bi + n, bj + n
    return codes


class _Fixed(difflib.SequenceMatcher):
    """A SequenceMatcher whose opcodes are given: reuses difflib's hunk grouping."""

    def __init__(self, codes):
        super().__init__(None, [], [])
        self._codes = codes

    def get_opcodes(self):
        return list(self._codes)


def _range(start: int, stop: int) -> str:
    """difflib's unified range: 'start,length' (1-based; an empty range names the line before)."""
    beginning = start + 1
    length = stop - start
    if length == 1:
        return f"{beginning}"
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def unified_diff(a: Sequence[str], b: Sequence[str], fromfile: str = "", tofile: str = "",
                 n: int = 3) -> Iterator[str]:
    """Like ``difflib.unified_diff`` (same arguments and output format), fast on large inputs."""
    started = False
    for group in _Fixed(opcodes(a, b)).get_grouped_opcodes(n):
        if not started:
            started = True
            yield f"--- {fromfile}\n"
            yield f"+++ {tofile}\n"
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for line in a[i1:i2]:
                    yield " " + line
                continue
            if tag in ("replace", "delete"):
                for line in a[i1:i2]:
                    yield "-" + line
            if tag in ("replace", "insert"):
                for line in b[j1:j2]:
                    yield "+" + line
