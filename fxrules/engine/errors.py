"""The exceptions the engine raises on purpose (all :class:`fxrules.errors.FxrulesError`).

Torch-free, so ``fxrules.errors`` can name them without importing torch.
"""

from __future__ import annotations

from typing import Optional

from fxrules.lang.diagnostics import FxrulesError

__all__ = ["AllocationRefused", "BuilderError", "ComparisonError", "ModelError", "RewriteError", "RewriteLoopError"]


class RewriteError(FxrulesError):
    """A rule failed while being applied. The caller's model is unchanged.

    Attributes: ``rule`` (name), ``source`` (rule file:line), ``node`` (graph
    node name) and ``stack_trace`` (where the node came from in the model, when known).
    """

    def __init__(self, message: str, *, rule: str, source: str, node: str, stack_trace: Optional[str] = None):
        text = f"{source}: rule `{rule}` failed at node %{node}: {message}"
        if stack_trace:
            text += "\nthe node was created at:\n    " + stack_trace.strip().replace("\n", "\n    ")
        super().__init__(text)
        self.rule = rule
        self.source = source
        self.node = node
        self.stack_trace = stack_trace


class RewriteLoopError(FxrulesError):
    """The rules kept rewriting past ``max_iterations``: they do not reach a fixpoint."""

    def __init__(self, message: str, rules: list[str]):
        super().__init__(message)
        self.rules = rules


class ModelError(FxrulesError):
    """The model cannot be prepared for rewriting (it does not trace, or is not a module)."""


class AllocationRefused(ModelError):
    """A run of a graph was refused before it ran: it would allocate more than its budget
    (``code`` ``allocation-budget``), or what it allocates could not be known beforehand
    (``allocation-unknown``). See :mod:`fxrules.engine.budget` and SECURITY.md.

    Attributes: ``code`` (stable), ``node`` (the graph node, or the op, where it was decided;
    empty when none), ``nbytes`` and ``limit`` (bytes asked for and allowed; 0 when unknown).
    """

    def __init__(self, message: str, *, code: str, node: str = "", nbytes: int = 0, limit: int = 0):
        super().__init__(f"{code}: {message}")
        self.detail = message
        self.code = code
        self.node = node
        self.nbytes = nbytes
        self.limit = limit

    def again(self) -> "AllocationRefused":
        """The same refusal, with its own message only (torch.fx's interpreter appends a traceback to
        the message of an exception raised while a node runs)."""
        return AllocationRefused(self.detail, code=self.code, node=self.node, nbytes=self.nbytes, limit=self.limit)

    def __reduce__(self):
        return (_allocation_refused, (str(self), self.code, self.node, self.nbytes, self.limit))


def _allocation_refused(text: str, code: str, node: str, nbytes: int, limit: int) -> "AllocationRefused":
    error = AllocationRefused(text.partition(": ")[2], code=code, node=node, nbytes=nbytes, limit=limit)
    return error


class BuilderError(FxrulesError, ValueError):
    """A builder was given modules it cannot turn into an exact replacement.

    It is a :class:`ValueError` (the arguments are the problem) and an
    :class:`~fxrules.errors.FxrulesError` (fxrules raised it on purpose).
    """


class ComparisonError(FxrulesError):
    """The rewritten module does not run on example inputs the original runs on: the rules broke it.

    ``result`` is the rewrite (a RewriteResult), for a look at what the rules did.
    """

    def __init__(self, message: str, result: object):
        super().__init__(message)
        self.result = result
