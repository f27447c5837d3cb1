"""The progress display: drawn on a terminal only, erased when done, never on a pipe or under json.

Most tests use a fake terminal (a StringIO that says it is a TTY). Two run the real CLI
with stderr on a pseudo-terminal, to see what a person at a terminal sees.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fxrules.tools.progress import Progress, progress, should_show

ROOT = Path(__file__).resolve().parents[2]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class ClosedTTY(FakeTTY):
    def isatty(self) -> bool:  # as a closed file does
        raise ValueError("I/O operation on closed file")


class BrokenTTY(FakeTTY):
    def write(self, text: str) -> int:
        raise OSError("terminal gone")


def _lines(text: str) -> list[str]:
    """The successive states of the progress line (split at carriage returns)."""
    return [part for part in text.split("\r") if part.strip()]


def test_should_show_only_for_text_on_a_terminal(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert should_show("text", FakeTTY()) is True
    assert should_show("json", FakeTTY()) is False
    assert should_show("github", FakeTTY()) is False
    assert should_show("text", io.StringIO()) is False  # a pipe or a file
    assert should_show("text", ClosedTTY()) is False
    assert should_show("text", object()) is False  # no isatty at all
    monkeypatch.setenv("TERM", "dumb")
    assert should_show("text", FakeTTY()) is False


def test_nothing_is_written_when_disabled():
    stream = FakeTTY()
    with progress(10, "work", False, stream=stream) as bar:
        for _ in range(10):
            bar.advance(note="step")
        bar.note("phase")
    assert stream.getvalue() == ""
    assert bar.done == 10


def test_default_enabled_follows_the_stream(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    pipe = io.StringIO()
    with progress(3, "work", stream=pipe) as bar:
        bar.advance()
    assert pipe.getvalue() == "" and not bar.enabled
    tty = FakeTTY()
    with progress(3, "work", stream=tty) as bar:
        bar.advance(note="a")
    assert bar.enabled and "work [" in tty.getvalue()


def test_bar_counts_notes_and_is_erased_at_the_end():
    stream = FakeTTY()
    with progress(4, "verify", True, stream=stream, min_interval=0.0) as bar:
        bar.advance(note="rule_a")
        bar.advance(note="rule_b")
        bar.advance(2, note="rule_d")
    states = _lines(stream.getvalue())
    assert states[0].startswith("verify [" + "." * Progress.BAR_WIDTH + "] 0/4")
    assert "1/4 rule_a" in states[1]
    assert "2/4 rule_b" in states[2]
    full = "verify [" + "#" * Progress.BAR_WIDTH + "] 4/4 rule_d"
    assert states[3].startswith(full)
    # the last thing written blanks the line and returns the cursor: nothing is left on screen
    assert stream.getvalue().endswith("\r" + " " * len(states[3].rstrip()) + "\r")


def test_a_shorter_line_covers_the_longer_one_before_it():
    stream = FakeTTY()
    with progress(2, "x", True, stream=stream, min_interval=0.0) as bar:
        bar.note("a long phase name")
        bar.note("short")
    parts = stream.getvalue().split("\r")
    long_part = next(p for p in parts if "a long phase name" in p)
    short_part = next(p for p in parts if p.startswith("x [") and "short" in p)
    assert len(short_part) >= len(long_part)  # padded with spaces: no leftover characters


def test_redraws_are_throttled_but_notes_draw_at_once():
    stream = FakeTTY()
    with progress(100_000, "many", True, stream=stream, min_interval=3600.0) as bar:
        for _ in range(100_000):
            bar.advance()
        drawn = len(_lines(stream.getvalue()))
        bar.note("phase two")
        assert "phase two" in stream.getvalue().split("\r")[-1]
    assert drawn <= 2  # the first draw (at the start) and maybe one more, not 100,000


def test_disabled_advance_is_cheap():
    with progress(None, "hot loop", False) as bar:
        start = time.perf_counter()
        for _ in range(200_000):
            bar.advance()
        elapsed = time.perf_counter() - start
    assert bar.done == 200_000
    assert elapsed < 1.0, elapsed  # about 0.05 s; far below any engine step it would count


def test_update_sets_the_count_for_callbacks():
    stream = FakeTTY()
    with progress(3, "verify", True, stream=stream, min_interval=0.0) as bar:
        for done, name in enumerate(["a", "b", "c"]):
            bar.update(done, note=name)  # as verify's progress(done, total, name) callback reports
        bar.update(3)
    states = _lines(stream.getvalue())
    assert any("0/3 a" in s for s in states) and any("2/3 c" in s for s in states)
    assert bar.done == 3 and "3/3" in bar.render()


def test_unknown_total_shows_a_running_count():
    stream = FakeTTY()
    with progress(None, "scan", True, stream=stream, min_interval=0.0) as bar:
        bar.advance(5, note="file.fxr")
    assert "scan: 5 done file.fxr" in stream.getvalue()


def test_write_keeps_the_bar_below_the_message():
    stream = FakeTTY()
    with progress(2, "job", True, stream=stream, min_interval=0.0) as bar:
        bar.advance(note="one")
        bar.write("dot not found; wrote graph.dot")
    text = stream.getvalue()
    message_at = text.index("dot not found; wrote graph.dot\n")
    before, after = text[:message_at], text[message_at:]
    assert before.endswith("\r") and before.rstrip("\r").endswith(" ")  # the bar was blanked first
    assert "job [" in after  # and drawn again after the message


def test_write_when_disabled_just_prints():
    stream = io.StringIO()
    with progress(2, "job", False, stream=stream) as bar:
        bar.write("hello")
    assert stream.getvalue() == "hello\n"


def test_the_bar_is_erased_when_the_block_raises():
    stream = FakeTTY()
    with pytest.raises(RuntimeError):
        with progress(3, "job", True, stream=stream) as bar:
            bar.note("working")
            raise RuntimeError("stop")
    assert stream.getvalue().endswith("\r")
    assert stream.getvalue().split("\r")[-2].strip() == ""


def test_a_broken_terminal_never_fails_the_run():
    stream = BrokenTTY()
    with progress(3, "job", True, stream=stream) as bar:
        bar.advance(note="a")
        bar.note("b")
    assert bar.enabled is False and bar.done == 1


def test_long_lines_are_clipped_to_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    stream = FakeTTY()  # no file descriptor: the width comes from COLUMNS
    with progress(2, "job", True, stream=stream) as bar:
        bar.note("x" * 200)
        line = bar.render()
    assert len(line) <= 39 and line.endswith("...")


def test_bad_total_is_refused():
    with pytest.raises(ValueError):
        Progress(-1, "x", True)
    with pytest.raises(ValueError):
        Progress(True, "x", True)


# ---------------------------------------------------------------------------
# The real CLI with stderr on a pseudo-terminal
# ---------------------------------------------------------------------------


def _run_on_pty(args: list[str]) -> tuple[int, str, str]:
    import pty

    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "fxrules", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    os.close(master)
    return proc.returncode, out.decode("utf-8", "replace"), b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def pty_runs(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    rules = tmp_path_factory.mktemp("pty") / "drop.fxr"
    rules.write_text("rule remove_dropout [exact]:\n    call_module Dropout($x) as d where not d.training -> $x\n")
    commands = {  # the text run shows every phase (--input: outputs compared); the json run is kept cheap
        "text": ["apply", str(rules), "--model", "fxrules.zoo:redundant", "--input", "2x3x16x16"],
        "json": ["apply", str(rules), "--model", "fxrules.zoo:redundant", "--format", "json"],
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = {key: pool.submit(_run_on_pty, args) for key, args in commands.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.slow
def test_apply_on_a_terminal_shows_phases_then_erases_them(pty_runs):
    code, out, err = pty_runs["text"]
    assert code == 0, err
    states = [s for s in err.split("\r") if s.strip()]
    phases = [s for s in states if s.startswith("fxrules apply [")]
    for phase in ("loading rules", "loading the model", "tracing", "rewriting", "comparing outputs"):
        assert any(phase in s for s in phases), (phase, states)
    assert err.rstrip("\n").endswith("\r")  # the bar's line is blanked at the end
    assert states[-1].startswith("fxrules apply [")  # and nothing else was printed on stderr...
    assert out.startswith("fxrules: ") and "rewrites" in out  # ...while the report went to stdout
    assert "fxrules apply [" not in out


def test_apply_json_on_a_terminal_draws_nothing(pty_runs):
    code, out, err = pty_runs["json"]
    assert code == 0, err
    assert "fxrules apply [" not in err and "\r" not in err.replace("\r\n", "\n")
    import json

    assert json.loads(out)["command"] == "apply"
