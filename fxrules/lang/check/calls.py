"""What every call is checked for, in patterns, replacements and examples alike: its argument list
(``...`` at most once and last; no keyword twice) and the shape of its module attributes.

``code`` says where the call is (``bad-pattern``, ``bad-replacement`` or ``bad-example``): the
same mistake gets the code of the part of the rule it is in.
"""

from __future__ import annotations

from typing import Iterator, Optional

import fxrules.lang.ast as A
from fxrules.lang.check.reporter import Reporter

NOT_AN_ATTRIBUTE = (A.Call, A.GetAttr, A.Alt, A.Bind, A.Ellipsis_)
"""What a module attribute or constructor argument may not be (an attribute is a value, not a node)."""


def check_argument_list(reporter: Reporter, call: A.Call, code: str) -> Optional[A.Span]:
    """Report a repeated or misplaced ``...`` and keywords given twice; the first ``...``'s span, if any."""
    args = call.args or ()
    positions = [i for i, arg in enumerate(args) if isinstance(arg, A.Ellipsis_)]
    for i in positions[1:]:
        reporter.error(args[i].span, "ellipsis-misuse", "`...` may appear only once in an argument list")
    if len(positions) == 1 and positions[0] != len(args) - 1:
        reporter.error(args[positions[0]].span, "ellipsis-misuse", "`...` must be the last positional argument")
    check_duplicate_keywords(reporter, call.kwargs, code, "keyword argument")
    return args[positions[0]].span if positions else None


def check_duplicate_keywords(reporter: Reporter, keywords: tuple[A.Keyword, ...], code: str, what: str) -> None:
    """Each keyword (argument or attribute) whose name an earlier one of ``keywords`` has.

    By name only: keywords compare equal without their spans, so ``inplace=False,
    inplace=False`` are two equal keywords, and looking one up by equality finds the first."""
    if len(keywords) < 2:
        return
    first: dict[str, A.Keyword] = {}
    for keyword in keywords:
        earlier = first.get(keyword.name)
        if earlier is None:
            first[keyword.name] = keyword
        else:
            reporter.error(keyword.span, code, f"{what} `{keyword.name}` is given twice",
                           notes=[f"first given at {earlier.span}"])


def attribute_values(reporter: Reporter, value: A.Expr, code: str) -> Iterator[A.Expr]:
    """The values inside a module attribute (a list's items, in order) for the caller to check.

    What cannot be an attribute is reported here, in its place among them: the caller checks
    each value as it comes, so the diagnostics keep the order of the text."""
    if isinstance(value, NOT_AN_ATTRIBUTE):
        reporter.error(value.span, code,
                       "a module attribute must be a literal, a capture, a constant or a list of them")
    elif isinstance(value, (A.ListExpr, A.TupleExpr)):
        for item in value.items:
            yield from attribute_values(reporter, item, code)
    else:
        yield value
