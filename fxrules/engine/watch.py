"""Which watched nodes lost a user that may hand their storage on, kept through a run's edits.

A match the planner turns down for a reason about storage (a later in-place write the replacement would
redirect, a read across a write, an output that would alias: :data:`fxrules.engine.planner.STORAGE_REFUSALS`)
depends on the values it bound (``$x``) only through their storage: which of their users view them,
write them, return them or may do anything with them. A user that does none of these (``x + 0``,
``x.sum()``: a fresh result, no write, no effect) changes none of those answers when it comes or goes.
A user that does, gained, can only add to what those checks look for (a view, a write, an output: each
check refuses when it finds one), so the match stays turned down; only a loss can let it through.

The fixpoint used to send such a match back whenever a bound value's users changed at all. Where the
value is read by many (an input every block reads) and the rewrites next to it keep changing its users,
every turned-down match was tried again per rewrite: per block ``(x * 1).add_(1)`` (``mul_one`` turned
down: ``replaced-node-mutated``) beside ``x + 0`` (``add_zero`` rewritten), 1,600 nodes took 15.6 s.

:class:`StorageWatch` holds the nodes such matches wait on (the driver's waiters, kept opaque here) and
is told of every user a node loses by the workpiece that makes the edit
(:class:`fxrules.engine.transaction.Workpiece`'s ``erase``, ``replace_uses`` and ``repoint``: the run's
only edits that take a user away). A watched node that loses a user which may hand on its storage is
recorded; the driver sends back the matches waiting on it and no others. The user is judged by
:meth:`fxrules.engine.planner.Effects.hands_on_storage` before the edit (an erased node's arguments are
gone after it), whatever the value it reads: a view of another argument counts too.
"""

from __future__ import annotations

from typing import Callable

from torch import fx


class StorageWatch:
    """The nodes watched (each with what the driver keeps for it), and those that lost such a user since last asked.

    ``hands_on(user)``: whether ``user`` may view, write, return or otherwise reach the storage of what it
    reads. While nothing is watched (:attr:`waiting` empty) an edit asks nothing more of it."""

    __slots__ = ("waiting", "changed", "hands_on")

    def __init__(self, hands_on: Callable[[fx.Node], bool]) -> None:
        # node -> the driver's waiters on it (a list); the workpiece's edits test it for emptiness first
        self.waiting: dict = {}
        self.changed: dict = {}  # watched nodes that lost such a user, as an ordered set
        self.hands_on = hands_on

    def lost(self, node: fx.Node, users) -> None:
        """``node`` is about to lose ``users`` (an iterable of nodes), if it is watched."""
        if node in self.waiting and node not in self.changed:
            hands_on = self.hands_on
            for user in users:
                if hands_on(user):
                    self.changed[node] = None
                    return

    def erasing(self, node: fx.Node) -> None:
        """``node`` is about to be erased: each of its inputs loses it as a user."""
        waiting = self.waiting
        for value in node.all_input_nodes:
            if value in waiting:
                self.lost(value, (node,))

    def take_changed(self) -> list:
        """The watched nodes changed since the last call (then forgotten)."""
        changed = list(self.changed)
        self.changed.clear()
        return changed
