"""The fixpoint's worklist: the (rule, node) candidates the driver tries, lowest rule index first, then
in graph order.

An entry is ``(rule index, node position, serial, node, program)``: tuples compare in that order, so
the entry taken is the least one, as a heap of all of them would give it (the serial, unique per entry,
settles two entries for nodes at one position: an erased node and the node made in its place).

Most entries come from the run's first scan of the graph, which finds them in graph order: for each
rule index they are already sorted. Those are kept as one list per rule index, read with a cursor; the
entries the run adds later (the nodes a rewrite touched) go on a heap. :meth:`Worklist.pop` takes the
lesser of the two heads. A heap of everything paid a sift of about log2(n) tuple comparisons per entry
taken (1.6 us an entry at 37,500 entries, 0.9 us at 3,750); a cursor costs one comparison with the
heap's head.
"""

from __future__ import annotations

import heapq
from typing import Optional

__all__ = ["Worklist"]


class Worklist:
    """Entries are added by :meth:`add_first` while the first scan runs and by :meth:`add` afterwards;
    :meth:`pop` gives them back least first, whatever the order they came in: an entry :meth:`add_first`
    cannot put at the end of its rule's list (out of graph order), or one added after reading began, goes
    on the heap."""

    __slots__ = ("_first", "_runs", "_run", "_next", "_heap")

    def __init__(self) -> None:
        self._first: Optional[dict] = {}  # rule index -> its first-scan entries, in order; None once reading
        self._runs: list = []  # the lists not yet read, the lowest rule index last (taken with list.pop())
        self._run: Optional[list] = None  # the list being read
        self._next = 0  # the cursor in it
        self._heap: list = []

    def add_first(self, entry: tuple) -> None:
        """An entry of the first scan, which finds each rule's entries in increasing order (the graph's)."""
        first = self._first
        if first is None:
            heapq.heappush(self._heap, entry)
            return
        run = first.get(entry[0])
        if run is None:
            first[entry[0]] = [entry]
        elif run[-1] < entry:
            run.append(entry)
        else:
            heapq.heappush(self._heap, entry)

    def add(self, entry: tuple) -> None:
        """An entry found later (a node a rewrite touched), in any order."""
        heapq.heappush(self._heap, entry)

    def pop(self) -> Optional[tuple]:
        """The least entry, removed; None when there is none."""
        if self._first is not None:
            self._start()
        run = self._run
        heap = self._heap
        if run is None:
            return heapq.heappop(heap) if heap else None
        entry = run[self._next]
        if heap and heap[0] < entry:
            return heapq.heappop(heap)
        self._next += 1
        if self._next == len(run):
            self._advance()
        return entry

    def __len__(self) -> int:
        waiting = len(self._heap) + sum(len(run) for run in self._runs)
        if self._first is not None:
            waiting += sum(len(run) for run in self._first.values())
        if self._run is not None:
            waiting += len(self._run) - self._next
        return waiting

    def _start(self) -> None:
        """Reading begins: the first scan's lists, the lowest rule index first."""
        first, self._first = self._first, None
        self._runs = [first[index] for index in sorted(first, reverse=True)]
        self._advance()

    def _advance(self) -> None:
        """Read the next rule's list (the lowest index left), or none."""
        self._run = self._runs.pop() if self._runs else None
        self._next = 0

    def __repr__(self) -> str:
        return f"<Worklist: {len(self)} waiting>"
