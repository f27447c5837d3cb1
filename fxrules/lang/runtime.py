"""The process-wide state fxrules changes while it works, in one place: :func:`entered`.

Two settings belong to the whole Python process, not to fxrules, so no stage (parser,
checker, engine) touches them; the entry points of the public API enter :func:`entered`
around their work and every setting is restored when the outermost entry leaves:

* **The cyclic garbage collector is paused.** Loading rules, copying a graph and rewriting
  it allocate millions of small objects that all stay alive, and the collector would
  traverse them again and again (about half of the time of checking 2,000 rules; two thirds
  of a 20,000-node graph copy). Nothing here needs garbage cycles freed early; the first
  collection after the entry finds any. A collector the caller disabled stays disabled.
  ``apply_rules``, ``find_matches`` and ``explain`` enter before they import the engine: right
  after ``import torch`` a full collection is due, and the first few thousand allocations set
  it off, a traversal of every object torch made (about 55 ms, a quarter of a first
  ``apply_rules`` on a small model). That collection is torch's debt, not the call's work:
  it stays due, and the caller's next full collection makes it (in a script that ends after
  the call, the one at the interpreter's exit: moved, not saved). (What the call allocated
  while paused is still traversed once, by the young collection just after the exit.)
* **The recursion limit is at least** :data:`RECURSION_LIMIT`. The checker, the compiler and
  the matcher recurse once or a few times per nesting level, and the parser allows
  :data:`fxrules.lang.parser.MAX_DEPTH` levels: more frames than Python's default limit of
  1,000. A higher limit the caller set stays.

Entries nest and may come from several threads: they are counted, and only the last to
leave restores what the first found (exceptions included). This module lives in
``fxrules.lang``, the lowest layer, so every layer above can enter it (the engine's, the
verifier's and the command line's entry points do); it imports nothing of fxrules.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
from typing import Iterator

RECURSION_LIMIT = 10_000
"""The recursion limit while entered. Python 3.11+ runs Python-to-Python calls without
deepening the C stack, so this limit is safe."""

_lock = threading.Lock()
_entries = 0  # entries not yet left, all threads together
_gc_was_enabled = False  # what the first entry found
_limit_before = 0


class _FakeKernelFailures(logging.Filter):
    """Drops torch's log of an op that failed on fake tensors ("failed while attempting to run meta
    for ..."): fxrules runs replacements and hosts on fake tensors to learn their shapes, and an op
    that fails there is an answer it handles (the value is unknown, or the rule is refused), not an
    error for the user's log; torch logs each with a full traceback at ERROR level."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


_FAKE_TENSOR_LOG = "torch._subclasses.fake_tensor"  # a logger's name: nothing of torch is imported here
_QUIET_FAKE_KERNELS = _FakeKernelFailures()


@contextlib.contextmanager
def entered() -> Iterator[None]:
    """For the duration: the collector paused, the recursion limit at least RECURSION_LIMIT, and
    torch's log of ops failing on fake tensors silenced (:class:`_FakeKernelFailures`).

    Re-entrant and thread-safe: the outermost exit restores both settings as the outermost
    entry found them (a recursion limit changed meanwhile by someone else is left as it is).
    """
    global _entries, _gc_was_enabled, _limit_before
    with _lock:
        if _entries == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
            _limit_before = sys.getrecursionlimit()
            if _limit_before < RECURSION_LIMIT:
                sys.setrecursionlimit(RECURSION_LIMIT)
            logging.getLogger(_FAKE_TENSOR_LOG).addFilter(_QUIET_FAKE_KERNELS)
        _entries += 1
    try:
        yield
    finally:
        with _lock:
            _entries -= 1
            if _entries == 0:
                logging.getLogger(_FAKE_TENSOR_LOG).removeFilter(_QUIET_FAKE_KERNELS)
                if sys.getrecursionlimit() == max(_limit_before, RECURSION_LIMIT):  # as we left it
                    sys.setrecursionlimit(_limit_before)
                if _gc_was_enabled:
                    gc.enable()
