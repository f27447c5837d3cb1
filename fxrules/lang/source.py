"""Reading rule files: bytes to text, with located diagnostics for what is not text."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

from fxrules.lang.diagnostics import Diagnostic, RuleFileError

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Larger files are refused before reading (a rule file is untrusted input)."""


@dataclass(frozen=True, slots=True)
class Source:
    """The text of one rule file and the name diagnostics use for it."""

    path: str
    text: str


def decode(data: bytes, path: str) -> Source:
    """UTF-8 (a leading BOM is dropped) with no NUL bytes, or a located RuleFileError."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        line, column = _position(data, nul)
        raise RuleFileError(
            [Diagnostic(path, line, column, "binary-input", "the file contains a NUL byte; rule files are UTF-8 text",
                        end_line=line, end_column=column + 1)]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise RuleFileError(
            [Diagnostic(path, line, column, "invalid-encoding",
                        f"the file is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                        end_line=line, end_column=column + 1)]
        ) from None
    return Source(path, text)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[start:offset].decode("utf-8", errors="replace")) + 1
    return line, column


def read(path: Union[str, os.PathLike]) -> Source:
    """The file's text, read only if it is a regular file (symlinks resolved first) and at most
    :data:`MAX_FILE_BYTES` long, whatever size the file system reports.

    FIFOs, devices and sockets are refused before opening (opening a FIFO blocks; a device
    reports size 0 and never ends): a quick io-error, never a hang or an out-of-memory.
    """
    shown = os.fspath(path)
    try:
        info = os.stat(path)  # follows symlinks: the target decides
        if not stat.S_ISREG(info.st_mode):
            raise RuleFileError([Diagnostic(shown, 0, 0, "io-error", f"not a regular file ({_kind(info.st_mode)}); "
                                                                     f"rule files are read only from regular files")])
        if info.st_size > MAX_FILE_BYTES:
            raise RuleFileError(
                [Diagnostic(shown, 0, 0, "io-error", f"the file is {info.st_size} bytes; rule files are limited to {MAX_FILE_BYTES}")]
            )
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped between stat and open
                raise RuleFileError([Diagnostic(shown, 0, 0, "io-error", "not a regular file")])
            data = _read_capped(handle, info.st_size)
        if len(data) > MAX_FILE_BYTES:
            raise RuleFileError(
                [Diagnostic(shown, 0, 0, "io-error", f"the file is over {MAX_FILE_BYTES} bytes; rule files are limited to it")]
            )
    except OSError as exc:
        raise RuleFileError([Diagnostic(shown, 0, 0, "io-error", f"cannot read the file: {exc.strerror or exc}")]) from None
    return decode(data, shown)


_CHUNK = 1 << 20


def _read_capped(handle, size: int) -> bytes:
    """At most ``MAX_FILE_BYTES + 1`` bytes: the reported ``size`` (and one more) first, then chunks while
    the file goes on (it grew, or its size was not reported, as for files under /proc).

    Not one ``read(MAX_FILE_BYTES + 1)``: that allocates a buffer of the cap (64 MiB) for any file,
    64 times the size of a 1 MiB file before a byte of it is parsed.
    """
    chunks = [handle.read(min(size, MAX_FILE_BYTES) + 1)]
    total = len(chunks[0])
    while chunks[-1] and total <= MAX_FILE_BYTES:
        chunks.append(handle.read(min(_CHUNK, MAX_FILE_BYTES + 1 - total)))
        total += len(chunks[-1])
    return chunks[0] if len(chunks) <= 2 and not chunks[-1] else b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def expand(paths: Iterable[Union[str, os.PathLike]]) -> list[str]:
    """Files as given, and every ``*.fxr`` under each directory, sorted. Missing paths are an io-error."""
    found: list[str] = []
    missing: list[Diagnostic] = []
    for path in paths:
        shown = os.fspath(path)
        if os.path.isdir(path):
            found.extend(sorted(os.fspath(p) for p in Path(path).rglob("*.fxr") if p.is_file()))
        elif os.path.exists(path):
            found.append(shown)
        else:
            missing.append(Diagnostic(shown, 0, 0, "io-error", "no such file or directory"))
    if missing:
        raise RuleFileError(missing)
    return found
