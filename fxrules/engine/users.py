"""The users of a node read by many, by (op, target) and in graph order, kept through a run's edits.

A multi-root rule's further root is searched among the users of the nodes the first root bound
(:func:`fxrules.engine.matcher.match_program`): the first user, in graph order, that matches. Where
one of those nodes is read by thousands (an input every block reads: ``sin($v), cos($v)`` over a
model whose blocks all read ``x``), walking and sorting its users for each match made the run
quadratic (9,600 nodes: 7.2 s). :class:`UsersByKey` groups the users of such a node (a *hub*: at
least :data:`HUB` users) by their (op, target) once, each group in graph order, and is told of
every later user by the workpiece that makes it (:class:`fxrules.engine.transaction.Workpiece`'s
``new_node``, ``replace_uses`` and ``repoint``: the run's only edits that add a user); the search
then reads only the groups of the pairs the further root can match, from their first live entry.

A user that stops reading the node (erased, or rewired away) is left in its group and skipped when
read (``user in node.users``); the stale entries at a group's front are dropped as they are passed,
so a search that takes each group's first live user costs what it uses, and a read to a group's end
drops the stale entries between live ones. A user that reads the node again is added again (an edit
told of it): at most a duplicate, which the search skips as seen. A module call is grouped by its
module's class (a module pattern matches by class; the group of a subclass counts for its base).

The fixpoint reads the groups too (:meth:`UsersByKey.after`): when a rewrite makes a node that may be a
multi-root rule's further root beside a hub, the hub's users that may be the rule's first root are
tried one at a time, in graph order, until a match takes the node made
(:meth:`fxrules.engine.driver._Session.rewrite`).
Positions never change for a node already in the graph (the engine inserts nodes, it never moves
one), so a group stays in graph order as new users are inserted at their place.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import Any, Callable, Iterator, Optional

from torch import fx

from fxrules.engine import fxaccess

HUB = 64
"""A node with fewer users is searched by walking them, as before: grouping is not worth it."""

_UNHASHABLE = ("", None)
"""The group of users whose target cannot be hashed: read for any pair (the matcher decides)."""


def _no_modules(target: str) -> None:
    return None


def _key(node: fx.Node, module_of: Callable[[str], Any]) -> Any:
    """A user's group: its (op, target); for a module call, ("call_module", the module's class) (a pattern
    matches a module call by class); the group read for any pair when neither can be hashed or the module
    is not known."""
    if node.op == "call_module":
        module = module_of(node.target)
        return _UNHASHABLE if module is None else ("call_module", type(module))
    key = (node.op, node.target)
    try:
        hash(key)
    except TypeError:
        return _UNHASHABLE
    return key


class UsersByKey:
    """For each hub asked about: its users grouped by (op, target), each group in graph order (some
    entries perhaps no longer users: see the module docstring). Empty until a search asks about a hub;
    while it is empty (:attr:`grouped`), an edit asks nothing more of it."""

    __slots__ = ("grouped", "module_of")

    def __init__(self, module_of: Callable[[str], Any] = _no_modules) -> None:
        # hub -> {(op, target): [users in graph order]}; the workpiece's edits test it for emptiness first
        self.grouped: dict = {}
        # the module a call_module target names (the workpiece's; a path's module does not change in a run:
        # a module the run makes gets a path of its own)
        self.module_of = module_of

    def groups(self, hub: fx.Node, keys: frozenset) -> list:
        """Iterators, one per group of ``hub``'s users whose pair is among ``keys`` (a module pair,
        ``("call_module", cls)``, takes the module calls of ``cls`` and of its subclasses), and the group
        of unhashable targets and unknown modules, each over that group's current users in graph order.
        ``hub`` is grouped on the first ask; the iterators are read before the graph is edited again."""
        users = hub.users
        return [_live(members, users) for members in self._lists(hub, keys)]

    def after(self, hub: fx.Node, keys: frozenset, position: Any) -> Optional[fx.Node]:
        """The first of ``hub``'s users in graph order, among the groups ``keys`` select (as :meth:`groups`),
        that comes after ``position`` (a node's :func:`fxrules.engine.fxaccess.sort_key`; None: from the
        first); None when there is none. The stale entries passed on the way are dropped, so a walk of the
        users one at a time costs what it reads."""
        users = hub.users
        sort_key = fxaccess.sort_key
        best = best_key = None
        for members in self._lists(hub, keys):
            start = 0 if position is None else bisect_right(members, position, key=sort_key)
            end = start
            while end < len(members):
                member = members[end]
                if member in users:
                    key = sort_key(member)
                    if best is None or key < best_key:
                        best, best_key = member, key
                    break
                end += 1
            if end > start:  # stale entries passed: dropped
                del members[start:end]
        return best

    def _lists(self, hub: fx.Node, keys: frozenset) -> list:
        """The group lists :meth:`groups` reads (``hub`` grouped on the first ask)."""
        groups = self.grouped.get(hub)
        if groups is None:
            groups = self.grouped[hub] = self._grouped(hub)
        found = [groups[key] for key in keys if key in groups]
        classes = tuple(target for op, target in keys if op == "call_module")
        if classes:  # module calls of a subclass: a group per class among the hub's users (a few)
            found.extend(members for key, members in groups.items()
                         if key[0] == "call_module" and key not in keys and issubclass(key[1], classes))
        if _UNHASHABLE in groups:
            found.append(groups[_UNHASHABLE])
        return found

    def _grouped(self, hub: fx.Node) -> dict:
        groups: dict = {}
        module_of = self.module_of
        for user in hub.users:
            groups.setdefault(_key(user, module_of), []).append(user)
        for members in groups.values():
            members.sort(key=fxaccess.sort_key)
        return groups

    def watches(self, node: fx.Node) -> bool:
        """Whether ``node``'s users are grouped (a user it gains must be :meth:`added`)."""
        return node in self.grouped

    def added(self, hub: fx.Node, user: fx.Node) -> None:
        """``user`` reads ``hub`` now (made, rewired or repointed to it); nothing when ``hub`` is not grouped."""
        groups = self.grouped.get(hub)
        if groups is not None:
            insort(groups.setdefault(_key(user, self.module_of), []), user, key=fxaccess.sort_key)

    def made(self, node: fx.Node) -> None:
        """``node`` was just made: it is a new user of each of its inputs."""
        for hub in node.all_input_nodes:
            self.added(hub, node)


def _live(members: list, users: dict) -> Iterator[fx.Node]:
    """The entries of ``members`` that are still among ``users``, in order; the stale ones before the first
    live entry are dropped from ``members`` (they are stale for good: a user that comes back is added anew),
    and, when the iterator is read to its end, the stale ones between live entries too. (A user replaced
    by one made in its place, before it, left its stale entry behind the live one: a rule set that kept
    replacing the same user grew the group by one per rewrite, and each read walked them all.)"""
    stale = 0
    for member in members:
        if member in users:
            break
        stale += 1
    if stale:
        del members[:stale]
    behind = 0
    for member in members:
        if member in users:
            yield member
        else:
            behind += 1
    if behind:
        members[:] = [member for member in members if member in users]
