"""Verifying rules in worker processes: ``fxrules verify -j N``, ``fxrules.verify(..., jobs=N)``.

Each rule's verification is independent of the others (its own hypothesis run, seeded from the
run's seed alone; its own models), so rules are handed out to ``N`` worker processes, one rule per
task, and the verdicts are put back in rule order: the report is the one ``jobs=1`` gives, verdict
for verdict, for a fixed ``seed`` (timings aside).

Workers are started with the ``spawn`` method (a fresh interpreter: no copy of a parent that may
hold threads, the same on every platform); each receives the rule set and the options once, when
it starts, and runs torch on ``cpu_count // N`` threads so the workers do not oversubscribe the
cores. A script that calls ``verify(jobs=N)`` must guard its top level with
``if __name__ == "__main__":``, as for any ``spawn``ed pool.

Failure modes: an exception raised while verifying a rule is raised by ``verify`` (as with one
process); a worker that dies (killed, out of memory, a crash in native code) is a
:class:`WorkerDied` naming the rule it was verifying; Ctrl-C reaches only the parent (workers
ignore SIGINT), which stops every worker before ``KeyboardInterrupt`` goes on. Nothing hangs.

While the parent waits for verdicts, Ctrl-C only sets a flag (:class:`_Interrupt`), which the loop
reads between waits of at most :data:`POLL_SECONDS`: a ``KeyboardInterrupt`` raised at an arbitrary
point inside ``concurrent.futures.wait`` can leave a future's lock held (``wait`` takes every pending
future's lock in turn), and the pool's manager thread, which must take that lock to post the
result, then blocks forever; so did the interpreter's exit, which joins it. The flag is read, the
workers are stopped, and ``KeyboardInterrupt`` is raised from the loop itself. A caller who set a
SIGINT handler of their own (or ignores SIGINT) keeps it: the flag replaces only Python's default.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from fxrules.lang.ruleset import RuleSet
from fxrules.lang.runtime import entered

START_METHOD = "spawn"
"""How workers start (see the module docstring)."""

POLL_SECONDS = 0.2
"""The longest the parent waits for a verdict before it looks whether Ctrl-C was pressed."""


class WorkerDied(RuntimeError):
    """A worker process ended without a verdict (killed, out of memory, a native crash)."""


@dataclass(frozen=True, slots=True)
class Job:
    """What every worker starts with: the rules, how hard to look, and its torch threads."""

    rule_set: RuleSet
    options: object  # fxrules.verifier.driver.VerifyOptions (its catalogue None: the default, built in the worker)
    threads: int


_job: Optional[Job] = None
"""This worker's job (set by :func:`start_worker` in a worker process; None in the parent)."""


def start_worker(job: Job) -> None:
    """A worker's initializer: ignore Ctrl-C (the parent stops the workers), set torch's threads,
    build the default sampler catalogue once."""
    global _job
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(job.threads)
    options = job.options
    if options.catalogue is None:
        from fxrules.verifier.samplers import default_catalogue

        options = replace(options, catalogue=default_catalogue())
    _job = replace(job, options=options)


def verify_in_worker(name: str):
    """One rule's verdict, in a worker (:func:`fxrules.verifier.driver.verify_rule`, entered as ``verify`` does)."""
    from fxrules.verifier.driver import verify_rule

    if _job is None:
        raise RuntimeError("verify_in_worker runs in a worker started by start_worker")
    with entered():
        return verify_rule(_job.rule_set, name, _job.options)


def threads_per_worker(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // jobs)


def verify_parallel(rule_set: RuleSet, names: Sequence[str], options, jobs: int,
                    progress: Optional[Callable[[int, int, Optional[str]], None]] = None) -> list:
    """The verdicts of ``names`` (in that order), verified by ``jobs`` worker processes.

    ``options``: the run's VerifyOptions, with the caller's catalogue (None for the default; any other
    must pickle). ``progress`` is called as rules finish: (rules done, total, the rule just finished).
    """
    total = len(names)
    job = Job(rule_set, options, threads_per_worker(jobs))
    executor = ProcessPoolExecutor(max_workers=min(jobs, total), mp_context=multiprocessing.get_context(START_METHOD),
                                   initializer=start_worker, initargs=(job,))
    verdicts: list = [None] * total
    processes: list = []
    interrupt = _Interrupt()
    try:
        interrupt.install()
        pending: dict[Future, int] = {executor.submit(verify_in_worker, name): i for i, name in enumerate(names)}
        processes = list(_processes(executor))
        done = 0
        while pending:
            finished, _ = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            interrupt.check()
            processes = list(_processes(executor)) or processes
            for future in sorted(finished, key=pending.__getitem__):
                index = pending.pop(future)
                verdicts[index] = _result(future, names[index])
                done += 1
                if progress is not None:
                    progress(done, total, names[index])
        interrupt.check()  # (pressed as the last verdict came in)
    except BaseException:
        _stop(executor, processes)
        raise
    finally:
        interrupt.uninstall()
    executor.shutdown(wait=True)
    return verdicts


class _Interrupt:
    """Ctrl-C as a flag while the parent waits (see the module docstring): :meth:`install` replaces
    Python's default SIGINT handler (only that one, and only in the main thread, where handlers run),
    :meth:`check` raises ``KeyboardInterrupt`` once it was pressed, :meth:`uninstall` puts the default
    back."""

    def __init__(self) -> None:
        self.pressed = False
        self.installed = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._pressed)
            self.installed = True

    def _pressed(self, signum, frame) -> None:
        self.pressed = True

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt

    def uninstall(self) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.installed = False


def _result(future: Future, name: str):
    try:
        return future.result()
    except BrokenProcessPool as exc:
        raise WorkerDied(f"a verify worker process ended without a verdict while verifying `{name}` (killed, out "
                         f"of memory, or a crash in native code): {exc}") from None


def _processes(executor: ProcessPoolExecutor) -> list:
    """The executor's worker processes: Python before 3.14 has no public way to stop them."""
    return list((getattr(executor, "_processes", None) or {}).values())


def _stop(executor: ProcessPoolExecutor, processes: list) -> None:
    """Cancel what has not started and end every worker now (Ctrl-C, or a rule's error ends the run)."""
    processes = list(_processes(executor)) or processes
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
