"""Count the machine instructions each tool executes for one rewrite of a suite graph (valgrind).

Wall-clock ratios on a shared 2-core machine move by 5-10% from one minute to the next, which is the
size of most engine changes. An instruction count does not: valgrind's callgrind counts every
instruction the process executes, and with the hash seed fixed two runs of the same code agree to
about 0.1%. So this script is the A/B for a change to the engine (``--root`` runs another checkout's
fxrules on the same graph), and ``run.py`` stays the measure of time (instructions are not time:
cache misses and allocation are not in the count, and fxrules executes fewer instructions than
inductor's pass on workloads where its wall time is at parity).

    python -m benchmarks.instructions --workloads module_pairs --size 2000
    python -m benchmarks.instructions --workloads double_transpose --size 2000 --rules rules/cleanup/transpose.fxr
    python -m benchmarks.instructions --workloads module_pairs --tools fxrules --root /path/to/old/checkout

Only the timed call is counted: collection is off at the start and is toggled on and off around
``operator.call`` (its C function, ``_operator_call``), through which the child makes exactly that
call. Nothing else calls it: it is new in Python 3.11, which torch does not require. Each tool runs ``--runs`` times on a fresh copy of
the graph (copied outside the count), after a warm-up on a 300-node graph (outside it too). Needs
``valgrind`` on the PATH; about two minutes per tool here (most of it ``import torch`` under
valgrind), two tools at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import operator
import os
import re
import shutil
import subprocess
import sys
from typing import Optional

TOOLS = ("fxrules", "inplace", "inductor")
_COUNTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(tool: str, workload: str, size: int, runs: int, rules_file: Optional[str]) -> None:
    """In the process valgrind watches: make the graph, warm the tool up, then make each counted call
    through ``operator.call`` (the toggle)."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    import fxrules
    from benchmarks import graphs, workloads
    from benchmarks.run import fresh

    w = workloads.get(workload)
    rules = fxrules.load_rules(rules_file) if rules_file else w.rules
    if tool == "inductor":
        call = w.inductor()
    else:
        inplace = tool == "inplace"
        call = lambda gm: fxrules.apply_rules(gm, rules, inplace=inplace)  # noqa: E731
    call(fresh(graphs.make(w.family, 300).gm))
    g = graphs.make(w.family, size)
    import gc

    for _ in range(runs):
        gm = fresh(g.gm)
        gc.collect()
        operator.call(call, gm)


def count(tool: str, workload: str, size: int, runs: int, rules_file: Optional[str], root: str) -> int:
    """The instructions executed inside the counted calls (all ``runs`` of them). The child is this file,
    run by path, with ``root`` first on the path: fxrules and the suite's graphs come from ``root``
    (which need not have this script)."""
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=_operator_call",
               "--callgrind-out-file=/dev/null", sys.executable, os.path.abspath(__file__), "--child", tool,
               "--workloads", workload, "--size", str(size), "--runs", str(runs)]
    if rules_file:
        command += ["--rules", os.path.abspath(rules_file)]
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    found = _COUNTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{tool} on {workload} under valgrind failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return int(found[-1])


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="module_pairs", help="comma-separated workload names")
    parser.add_argument("--size", type=int, default=2000, help="approximate node count (default 2000)")
    parser.add_argument("--tools", default="fxrules,inductor", help=f"comma-separated, of {','.join(TOOLS)}")
    parser.add_argument("--runs", type=int, default=2, help="counted calls per tool (default 2)")
    parser.add_argument("--rules", default=None, help="a rule file or folder to use instead of the workload's")
    parser.add_argument("--root", default=os.getcwd(), help="the checkout whose fxrules and benchmarks run")
    parser.add_argument("--jobs", type=int, default=2, help="tools counted at a time (default 2)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.workloads, args.size, args.runs, args.rules)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not on the PATH", file=sys.stderr)
        return 2
    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)}")
    jobs = [(w, t) for w in args.workloads.split(",") if w for t in tools]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {job: pool.submit(count, job[1], job[0], args.size, args.runs, args.rules, os.path.abspath(args.root))
                   for job in jobs}
        counts = {job: future.result() for job, future in futures.items()}
    print(f"instructions per call (millions), {args.size} nodes, {args.runs} counted calls each, "
          f"root {os.path.abspath(args.root)}" + (f", rules {args.rules}" if args.rules else ""))
    print("| workload | tool | instructions (M) | inductor/tool |")
    print("|---|---|---|---|")
    for (workload, tool), total in counts.items():
        per_call = total / args.runs / 1e6
        peer = counts.get((workload, "inductor"))
        ratio = f"{peer / total:.3f}x" if peer is not None and tool != "inductor" else "-"
        print(f"| {workload} | {tool} | {per_call:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
