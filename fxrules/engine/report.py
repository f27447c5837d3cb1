"""What a run did: applied rewrites, rejected matches, counts; printable as a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fxrules.engine.refusals import MissCode, RefusalCode


@dataclass(frozen=True, slots=True)
class MetadataChange:
    """A replaced value whose metadata the replacement does not keep: what ``[changes]`` rewrites
    report (applied), and what ``[exact]``/``[approx]`` refuse (see :mod:`fxrules.engine.guards`).

    ``what``: ``"shape"``, ``"dtype"``, ``"device"`` or ``"requires_grad"``; ``before``/``after``:
    the root's and the replacement's metadata as text (``float32[2, 3] on cpu``)."""

    rule: str
    source: str
    root: str  # the replaced node's name
    replacement: str  # ``%name`` of an existing value, or ``a new call_function torch.f``
    what: str
    before: str
    after: str

    def __str__(self) -> str:
        return (f"rule `{self.rule}` changed the {self.what} of %{self.root}: {self.before} -> "
                f"{self.after} ({self.replacement})")


@dataclass(frozen=True, slots=True)
class Applied:
    """One rewrite: the rule (name and file:line), the nodes it matched (roots first), the nodes it
    created, what stands in each root's place now, and a ``[changes]`` rewrite's metadata changes."""

    rule: str
    source: str  # rule file:line
    matched: tuple[str, ...]  # names of the matched nodes (roots first)
    created: tuple[str, ...]  # names of the nodes the replacement created
    replaced_by: tuple[str, ...]  # per root: the node now standing in its place
    changes: tuple[MetadataChange, ...] = ()  # a [changes] rewrite's shape/dtype/device changes


@dataclass(frozen=True, slots=True)
class Rejected:
    """A match that was refused: ``code`` says why (stable, see docs/semantics.md), ``reason`` in words."""

    rule: str
    source: str
    matched: tuple[str, ...]
    reason: str
    code: RefusalCode = field(kw_only=True)
    nodes: tuple[str, ...] = field(kw_only=True)  # the nodes the refusal is about, the offending one first


@dataclass(frozen=True, slots=True)
class Report:
    """What a run did: the rewrites in the order they were made, the matches refused (each with its
    code), the node counts before and after, the run's time and its notes."""

    applied: tuple[Applied, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def changes(self) -> tuple[MetadataChange, ...]:
        """The metadata changes of every applied ``[changes]`` rewrite, in order."""
        return tuple(c for a in self.applied for c in a.changes)

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.applied:
            counts[item.rule] = counts.get(item.rule, 0) + 1
        return counts

    def to_json(self) -> dict:
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "seconds": self.seconds,
            "counts": self.counts,
            "applied": [{"rule": a.rule, "source": a.source, "matched": list(a.matched), "created": list(a.created),
                         "replaced_by": list(a.replaced_by),
                         "changes": [{"root": c.root, "replacement": c.replacement, "what": c.what,
                                      "before": c.before, "after": c.after} for c in a.changes]}
                        for a in self.applied],
            "rejected": [{"rule": r.rule, "source": r.source, "matched": list(r.matched), "reason": r.reason,
                          "code": str(r.code), "nodes": list(r.nodes)} for r in self.rejected],
            "notes": list(self.notes),
        }

    def table(self) -> str:
        """A readable summary: counts per rule, then each rewrite, then each rejection."""
        lines = [f"fxrules: {len(self.applied)} rewrite{'s' * (len(self.applied) != 1)}, "
                 f"{len(self.rejected)} rejected match{'es' * (len(self.rejected) != 1)}; "
                 f"nodes {self.nodes_before} -> {self.nodes_after}; {self.seconds * 1000:.1f} ms"]
        if self.applied:
            lines.append("")
            lines.extend(_table(["rule", "source", "rewrites"],
                                [[rule, self._source(rule), str(n)] for rule, n in self.counts.items()]))
            lines.append("")
            lines.extend(_table(["rule", "matched", "replaced by", "new nodes"],
                                [[a.rule, ", ".join(a.matched), ", ".join(a.replaced_by), ", ".join(a.created) or "-"]
                                 for a in self.applied]))
        if self.rejected:
            lines.append("")
            lines.extend(_table(["rejected rule", "at", "reason"],
                                [[r.rule, ", ".join(r.matched[:3]) + (", ..." if len(r.matched) > 3 else ""),
                                  r.reason] for r in self.rejected]))
        for change in self.changes:
            lines.append(f"changed: {change}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def _source(self, rule: str) -> str:
        for a in self.applied:
            if a.rule == rule:
                return a.source
        return ""

    def __str__(self) -> str:
        return self.table()


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    rows = [[_clip(c) for c in row] for row in rows]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
           "  ".join("-" * w for w in widths)]
    out.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
    return out


def _clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass(frozen=True)
class RewriteResult:
    """The outcome of ``apply_rules``: the new module, counts per rule, and the report."""

    module: Any  # torch.fx.GraphModule
    report: Report
    counts: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.report.table()


@dataclass(frozen=True)
class MatchInfo:
    """One match found by ``find_matches`` (nothing is rewritten)."""

    rule: str
    source: str
    roots: tuple[str, ...]
    nodes: tuple[str, ...]
    captures: dict
    rejected: Optional[str] = None  # why the rewrite would be refused, if it would
    code: Optional[RefusalCode] = None  # the refusal's code, if it would


@dataclass(frozen=True)
class NearMiss:
    """A node where a rule's root target matched but the rule did not apply (``explain``).

    ``code``: a :class:`MissCode` when the pattern or a condition failed, the refusal's
    :class:`RefusalCode` when everything matched and the rewrite is refused."""

    rule: str
    location: str  # rule file:line:col of the pattern part that failed
    node: str
    reason: str
    depth: int
    stack_trace: Optional[str] = None
    code: "MissCode | RefusalCode" = field(kw_only=True)

    @property
    def stage(self) -> str:
        """Where the rule stopped: ``"pattern"``, ``"condition"`` (the pattern matched, a ``where``
        clause is false) or ``"refused"`` (everything matched, the planner refused the rewrite)."""
        if isinstance(self.code, RefusalCode):
            return "refused"
        return "condition" if self.code is MissCode.CONDITION_FALSE else "pattern"

    def __str__(self) -> str:
        text = f"{self.location}: rule `{self.rule}` did not match at %{self.node}: {self.reason}"
        if self.stack_trace:
            text += "\n  node created at:\n    " + self.stack_trace.strip().replace("\n", "\n    ")
        return text
