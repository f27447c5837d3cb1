"""A small progress display for long runs, on stderr, for people at a terminal only.

    from fxrules.tools.progress import progress, should_show

    with progress(len(rules), "verify", should_show(args.format)) as bar:
        for rule in rules:
            check(rule)
            bar.advance(note=rule.name)

The bar is drawn only when it is enabled: ``should_show(fmt)`` is true when ``fmt`` is
``"text"`` and the stream (stderr by default) is a terminal, so nothing is ever written to
a pipe, a file or under ``--format json``. A disabled bar costs one integer addition per
``advance``. An enabled one redraws at most every ``min_interval`` seconds (a note change
redraws at once: notes mark phases, which are few) and erases its line when the ``with``
block ends, however it ends, so the terminal keeps only the command's real output.

A callback that reports absolute counts uses :meth:`Progress.update`::

    verify(rules, progress=lambda done, total, name: bar.update(done, note=name))

Use :meth:`Progress.write` to print a line to the same stream while the bar is shown.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from contextlib import contextmanager
from typing import IO, Iterator, Optional

__all__ = ["Progress", "progress", "should_show"]


def should_show(fmt: str = "text", stream: Optional[IO[str]] = None) -> bool:
    """True when a progress bar belongs on ``stream`` (default stderr): text output to a terminal."""
    if fmt != "text":
        return False
    stream = sys.stderr if stream is None else stream
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Progress:
    """One progress line: ``label [#######.......] 7/15 note``. Every method is safe when disabled."""

    BAR_WIDTH = 24

    def __init__(self, total: Optional[int], label: str, enabled: bool, stream: Optional[IO[str]] = None,
                 *, min_interval: float = 0.1):
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ValueError(f"total must be a non-negative int or None, got {total!r}")
        self.total = total
        self.label = label
        self.enabled = bool(enabled)
        self.stream = sys.stderr if stream is None else stream
        self.min_interval = min_interval
        self.done = 0
        self.text = ""
        self._last_draw = float("-inf")
        self._shown = 0  # characters of the line now on screen (0: nothing to erase)

    # -- the API ---------------------------------------------------------------
    def advance(self, n: int = 1, note: Optional[str] = None) -> None:
        """Count ``n`` more steps done; ``note`` (optional) replaces the text after the counter."""
        self.done += n
        if not self.enabled:
            return
        if note is not None and note != self.text:
            self.text = note
            self._draw()
        elif time.monotonic() - self._last_draw >= self.min_interval:
            self._draw()

    def update(self, done: int, note: Optional[str] = None) -> None:
        """Set the count of steps done to ``done`` (for callbacks that report (done, total, name))."""
        self.advance(done - self.done, note)

    def note(self, text: str) -> None:
        """Show ``text`` after the counter (a phase: "tracing", "rewriting"); redraws at once."""
        if not self.enabled:
            return
        self.text = text
        self._draw()

    def write(self, line: str) -> None:
        """Print ``line`` on the bar's stream without garbling the bar (it is redrawn below)."""
        if not self.enabled:
            print(line, file=self.stream)
            return
        self._erase()
        print(line, file=self.stream)
        self._draw()

    def close(self) -> None:
        """Erase the bar (called when the ``with`` block ends)."""
        if self.enabled:
            self._erase()

    # -- drawing ---------------------------------------------------------------
    def render(self) -> str:
        """The line as it is drawn (without the carriage return)."""
        if self.total:
            fraction = min(self.done, self.total) / self.total
            filled = int(round(fraction * self.BAR_WIDTH))
            body = f"{self.label} [{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {min(self.done, self.total)}/{self.total}"
        else:
            body = f"{self.label}: {self.done} done" if self.total is None else f"{self.label}"
        if self.text:
            body += f" {self.text}"
        width = max(20, _columns(self.stream) - 1)
        return body if len(body) <= width else body[: width - 3] + "..."

    def _draw(self) -> None:
        line = self.render()
        pad = " " * max(0, self._shown - len(line))
        try:
            self.stream.write("\r" + line + pad)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing, never fail the run
            self.enabled = False
            return
        self._shown = len(line)
        self._last_draw = time.monotonic()

    def _erase(self) -> None:
        if not self._shown:
            return
        try:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False
        self._shown = 0


def _columns(stream: IO[str]) -> int:
    """The terminal's width; 80 when unknown (a fresh pseudo-terminal reports 0)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, TypeError):
        columns = 0
    return columns if columns > 0 else shutil.get_terminal_size((80, 24)).columns or 80


@contextmanager
def progress(total: Optional[int], label: str, enabled: Optional[bool] = None, *,
             stream: Optional[IO[str]] = None, min_interval: float = 0.1) -> Iterator[Progress]:
    """A :class:`Progress` for a ``with`` block; erased when the block ends.

    ``total``: the number of steps (None when unknown: a running count is shown instead).
    ``enabled``: None decides by :func:`should_show` on ``stream`` (text output to a terminal).
    """
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        enabled = should_show("text", stream)
    bar = Progress(total, label, enabled, stream, min_interval=min_interval)
    if bar.enabled:
        bar._draw()
    try:
        yield bar
    finally:
        bar.close()
