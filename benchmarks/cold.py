"""Cold starts and parallel verification, each measurement in a fresh process. Run by hand:

    python -m benchmarks.cold                         # cold-start table, 5 runs each (~1 min)
    python -m benchmarks.cold --root ../old-checkout  # the same for another checkout (before/after)
    python -m benchmarks.cold --verify-jobs 1,2 --verify-examples 10   # add verify's speed-up per N (minutes)
    python -m benchmarks.cold --bytecode none         # fxrules compiled from source in every process

Each number is the median wall time of ``--repeat`` fresh processes (after one untimed warm-up run
that compiles the bytecode: the checkout is measured as an installed package would run, with its
``.pyc`` files written, into a private ``PYTHONPYCACHEPREFIX``). ``--bytecode none`` measures instead what
an editable install runs where ``PYTHONDONTWRITEBYTECODE=1`` is set (this development machine sets it):
fxrules' modules compiled from source in every process, torch's and the standard library's read from
the bytecode their installation wrote (the checkout must hold no ``__pycache__`` under ``fxrules/``). Rows:

- ``python -c "import torch"``: the floor every torch user pays;
- ``fxrules check LIBRARY``: the bundled library (64 rules), with torch installed, and whether torch was
  imported (it should not be: the shipped torch index answers);
- first ``apply_rules``: in one process, the time from after ``import torch`` to the end of the first
  ``apply_rules`` (import fxrules included) of a bundled family on a zoo model: ``redundant`` (19 nodes)
  with ``cleanup`` and example inputs (metadata propagated), and ``mlp`` (12 nodes) without; and the
  first one again with ``torch._dynamo`` imported before the timer (what fxrules adds beyond the
  import that every propagation through torch's meta or fake kernels pays);
- ``torch.relu`` on a meta tensor: that floor (it imports ``torch._dynamo``);
- ``import fxrules``: the package's own import, timed inside the process (and whether it imported torch);
- ``fxrules apply/explain/verify`` on tiny inputs: the whole command.

``--verify-jobs`` times ``fxrules verify LIBRARY --seed S --max-examples M --no-database -j N`` per N
and prints the speed-up over the first N, with the load average before and after each run (the
development machine is shared: read the speed-up with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent.parent

_FIRST_APPLY = """
import sys, time
import torch
if sys.argv[4:] == ["dynamo"]:
    import torch._dynamo  # the floor below: what fxrules itself adds beyond it
started = time.perf_counter()
import fxrules
from fxrules import zoo
name, family, with_inputs = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
inputs = zoo.example_inputs(name) if with_inputs else None
fxrules.apply_rules(getattr(zoo, name)(), fxrules.LIBRARY / family, example_inputs=inputs)
print(json.dumps({"seconds": time.perf_counter() - started, "dynamo": "torch._dynamo" in sys.modules}))
""".replace("import sys, time", "import json, sys, time")

_META_OP = """
import json, sys, time
import torch
started = time.perf_counter()
torch.relu(torch.empty(2, 3, device="meta"))
print(json.dumps({"seconds": time.perf_counter() - started, "dynamo": "torch._dynamo" in sys.modules}))
"""
"""The floor of any metadata propagation through torch's own kernels: one ``torch.relu`` on a meta
tensor. Its meta kernel is Python (``torch._refs``), wrapped in ``torch._disable_dynamo``, which
imports ``torch._dynamo`` on its first call; fake tensors pay the same import (``FakeTensorMode()``)."""

_IMPORT = """
import json, sys, time
started = time.perf_counter()
import fxrules
print(json.dumps({"seconds": time.perf_counter() - started, "torch": "torch" in sys.modules}))
"""

_CHECK = """
import json, sys, time
started = time.perf_counter()
from fxrules.tools.cli import main
import fxrules
code = main(["check", "-q", str(fxrules.LIBRARY)])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


@dataclass(frozen=True, slots=True)
class Row:
    what: str
    seconds: float
    runs: int
    note: str = ""


def _environment(root: Path, cache: Optional[str]) -> dict:
    """The measured processes' environment: bytecode written to and read from ``cache``, or (None) none
    written and fxrules' own read from nowhere (see ``--bytecode``)."""
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cached = sorted(str(p) for p in (root / "fxrules").rglob("__pycache__"))
        if cached:
            raise SystemExit(f"--bytecode none: {root / 'fxrules'} holds cached bytecode ({cached[0]}, ...); remove "
                             f"it or measure with --bytecode cached")
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _timed(command: Sequence[str], env: dict, cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(list(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    return time.perf_counter() - started, done.stdout


def _median(command: Sequence[str], env: dict, cwd: Path, repeat: int) -> tuple[float, str]:
    _timed(command, env, cwd)  # warm-up: writes the bytecode, fills the page cache
    runs = [_timed(command, env, cwd) for _ in range(repeat)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def _reported(command: Sequence[str], env: dict, cwd: Path, repeat: int) -> tuple[float, dict]:
    """The median of what the process reports about itself (its last stdout line, JSON)."""
    _timed(command, env, cwd)
    reports = [json.loads(_timed(command, env, cwd)[1].strip().splitlines()[-1]) for _ in range(repeat)]
    return statistics.median(r["seconds"] for r in reports), reports[-1]


def cold_rows(root: Path, repeat: int, cache: Optional[str]) -> list[Row]:
    env = _environment(root, cache)
    py = sys.executable
    library = root / "fxrules" / "library"
    rows = []
    seconds, _ = _median([py, "-c", "import torch"], env, root, repeat)
    rows.append(Row('python -c "import torch"', seconds, repeat))
    seconds, out = _median([py, "-m", "fxrules", "check", str(library)], env, root, repeat)
    _, probe = _timed([py, "-c", _CHECK], env, root)
    imported = json.loads(probe.strip().splitlines()[-1])["torch"] if probe.strip() else None
    rows.append(Row("fxrules check LIBRARY (python -m fxrules)", seconds, repeat,
                    f"torch imported: {'yes' if imported else 'no'}"))
    for name, family, inputs in (("redundant", "cleanup", True), ("mlp", "cleanup", False)):
        seconds, report = _reported([py, "-c", _FIRST_APPLY, name, family, "1" if inputs else "0"], env, root, repeat)
        rows.append(Row(f"first apply_rules beyond import torch: {name} + {family}"
                        f"{' + example_inputs' if inputs else ''}", seconds, repeat,
                        f"torch._dynamo imported: {'yes' if report.get('dynamo') else 'no'}"))
    seconds, report = _reported([py, "-c", _FIRST_APPLY, "redundant", "cleanup", "1", "dynamo"], env, root, repeat)
    rows.append(Row("first apply_rules beyond import torch and torch._dynamo: redundant + cleanup + example_inputs",
                    seconds, repeat, "fxrules' own share: torch._dynamo imported before the timer"))
    seconds, report = _reported([py, "-c", _META_OP], env, root, repeat)
    rows.append(Row("torch.relu on a meta tensor beyond import torch (the floor of propagating on meta tensors)",
                    seconds, repeat, f"torch._dynamo imported: {'yes' if report.get('dynamo') else 'no'}"))
    seconds, report = _reported([py, "-c", _IMPORT], env, root, repeat)
    rows.append(Row("import fxrules (in the process, interpreter start-up excluded)", seconds, repeat,
                    f"torch imported: {'yes' if report.get('torch') else 'no'}"))
    commands = {
        "fxrules apply cleanup --model fxrules.zoo:redundant --input 2x3x16x16":
            ["apply", "cleanup", "--model", "fxrules.zoo:redundant", "--input", "2x3x16x16"],
        "fxrules explain cleanup --model fxrules.zoo:redundant --input 2x3x16x16":
            ["explain", "cleanup", "--model", "fxrules.zoo:redundant", "--input", "2x3x16x16"],
        "fxrules verify cleanup --rule mul_one --max-examples 5 --seed 0 --no-database":
            ["verify", "cleanup", "--rule", "mul_one", "--max-examples", "5", "--seed", "0", "--no-database"],
    }
    for label, arguments in commands.items():
        seconds, _ = _median([py, "-m", "fxrules", *arguments, "-q"], env, root, repeat)
        rows.append(Row(label, seconds, repeat))
    return rows


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "?"


def verify_rows(root: Path, jobs: Sequence[int], examples: int, seed: int, cache: Optional[str]) -> list[Row]:
    env = _environment(root, cache)
    library = root / "fxrules" / "library"
    rows, first, reference = [], None, []
    for n in jobs:
        before = _load()
        seconds, out = _timed([sys.executable, "-m", "fxrules", "verify", str(library), "--seed", str(seed),
                               "--max-examples", str(examples), "--no-database", "--format", "json", "-j", str(n)],
                              env, root)
        report = json.loads(out) if out.strip() else {"counts": {}, "rules": []}
        # What must not depend on N: each rule's grade and host counts, in rule order.
        verdicts = [(r["rule"], r["grade"], r["hosts_checked"], r["hosts_discarded"], r["hosts_discarded_by"])
                    for r in report["rules"]]
        if first is None:
            first, reference = seconds, verdicts
        differ = sum(a != b for a, b in zip(verdicts, reference)) + abs(len(verdicts) - len(reference))
        same = "the same as the first row" if not differ else f"{differ} rules differ from the first row"
        rows.append(Row(f"verify LIBRARY -j {n}", seconds, 1,
                        f"speed-up {first / seconds:.2f}x; load before {before}, after {_load()}; "
                        f"{', '.join(f'{v} {k}' for k, v in report['counts'].items() if v)}; "
                        f"grades and host counts {same}"))
    return rows


def render(rows: Sequence[Row]) -> str:
    lines = ["| what | seconds (median) | runs | note |", "|---|---|---|---|"]
    lines += [f"| {r.what} | {r.seconds:.3f} | {r.runs} | {r.note} |" for r in rows]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout to measure (default: this one)")
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per row (default 5)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-start rows")
    parser.add_argument("--verify-jobs", default="", help="comma-separated N for verify -j N (default: none)")
    parser.add_argument("--verify-examples", type=int, default=10, help="--max-examples for the verify runs")
    parser.add_argument("--seed", type=int, default=3, help="--seed for the verify runs")
    parser.add_argument("--bytecode", choices=("cached", "none"), default="cached",
                        help="cached: as an installed package runs (default); none: fxrules compiled from source in "
                             "every process (an editable install under PYTHONDONTWRITEBYTECODE=1)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="fxrules-cold-") as folder:
        cache = folder if args.bytecode == "cached" else None
        rows = [] if args.no_cold else cold_rows(root, args.repeat, cache)
        if args.verify_jobs:
            rows += verify_rows(root, [int(n) for n in args.verify_jobs.split(",")], args.verify_examples,
                                args.seed, cache)
    print(f"root {root}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {_load()}, "
          f"bytecode {args.bytecode}")
    print(render(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
