"""A process that has imported torch and fxrules once and forks a fresh child per hostile case.

Why: every hostile case must run in a process of its own (an address-space limit, a timeout, a
crash that cannot take pytest with it), but starting Python and importing torch costs 2-3 s,
twice per case. The server imports once, never runs a tensor operation itself (so forking is
safe: no thread pools exist yet), and forks one child per request; the child is as isolated as
a new interpreter for what these tests check (its own memory, limits, files and exit status).

Protocol, one JSON object per line on stdin and stdout:
request ``{"kind": "check" | "code" | "module", "args": [...], "code": "...", "timeout": s, "cwd": path}``,
answer ``{"returncode": int, "stdout": str, "stderr": str, "timed_out": bool}``.
``check`` runs ``fxrules check ARGS`` (``fxrules.tools.cli.main``); ``code`` runs Python source as
``python -c`` would; ``module`` runs ``python -m fxrules ARGS``.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _child(request: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: never returns."""
    code = 1
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.chdir(request.get("cwd") or os.getcwd())
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if request["kind"] in ("check", "module"):
            from fxrules.tools.cli import main

            args = (["check"] if request["kind"] == "check" else []) + list(request["args"])
            sys.argv = ["fxrules", *args]
            code = main(args)
        else:
            sys.argv = ["-c"]
            exec(compile(request["code"], "<hostile case>", "exec"), {"__name__": "__main__"})
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what `python -c` would print
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _serve_one(request: dict) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            _child(request, out.fileno(), err.fileno())
        deadline = time.monotonic() + float(request.get("timeout", 60))
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        return {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace"), "timed_out": timed_out}


def main() -> None:
    import torch  # noqa: F401  (imported once, before any fork)

    import fxrules  # noqa: F401
    import fxrules.engine.driver  # noqa: F401  (the engine's imports, which the first apply pays for)
    import fxrules.tools.cli  # noqa: F401
    import fxrules.verifier.driver  # noqa: F401

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = _serve_one(json.loads(line))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class ForkServer:
    """The client side (used by the tests): this file run as a server, started once; each case runs in a child it forks (its own
    process, limits and exit status) without paying for a new interpreter and torch import."""

    process: "subprocess.Popen | None" = None

    @classmethod
    def ask(cls, request: dict, timeout: float) -> subprocess.CompletedProcess:
        if cls.process is None or cls.process.poll() is not None:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            cls.process = subprocess.Popen([sys.executable, str(Path(__file__))],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            assert cls.process.stdout.readline().strip() == "ready"
            atexit.register(cls.process.kill)
        cls.process.stdin.write(json.dumps({**request, "timeout": timeout, "cwd": str(ROOT)}) + "\n")
        cls.process.stdin.flush()
        answer = json.loads(cls.process.stdout.readline())
        argv = request.get("args") or ["-c", request.get("code", "")]
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, answer["stdout"], answer["stderr"])
        return subprocess.CompletedProcess(argv, answer["returncode"], answer["stdout"], answer["stderr"])


if __name__ == "__main__":
    main()
