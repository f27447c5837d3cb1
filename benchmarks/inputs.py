"""Time what the suite (run.py) leaves out: rules given as a file path (read each call; parsed,
checked and compiled once per text: fxrules.lang.load.CHECKED), a run with example inputs (metadata
propagated on fake tensors, the guards' dry runs) and an in-place run that rewrites nothing (a
RulePass whose rules find nothing), beside the same rewrite with a RuleSet and without inputs.

    python -m benchmarks.inputs [--workloads relu_relu,conv_bn] [--sizes 5000] [--repeat 5]

Each workload's rules on its suite graph, each call on a fresh copy of the graph (copied outside
the timing), the cases interleaved round by round; medians in ms. Run by hand, not by pytest.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import warnings

import torch

import fxrules
from benchmarks import graphs, workloads
from benchmarks.run import fresh

NEVER = fxrules.parse_rules("""
rule never "matches nothing in the suite's graphs" [exact]:
    call_function torch.sigmoid(call_function torch.sigmoid($x)) -> $x
""")

DEFAULT = ("relu_relu:5000", "double_transpose:5000", "module_pairs:5000", "conv_bn:1000")


def cases(w: workloads.Workload, g: graphs.Graph, rules_file: str) -> dict:
    rules, example = w.rules, g.example
    return {
        "copying": lambda gm: fxrules.apply_rules(gm, rules),
        "copying, rules file": lambda gm: fxrules.apply_rules(gm, rules_file),
        "copying + inputs": lambda gm: fxrules.apply_rules(gm, rules, example_inputs=example),
        "in place + inputs": lambda gm: fxrules.apply_rules(gm, rules, example_inputs=example, inplace=True),
        "in place, nothing found": lambda gm: fxrules.apply_rules(gm, NEVER, inplace=True),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT),
                        help="comma-separated NAME:NODES (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"fxrules {fxrules.__file__}, torch {torch.__version__}, {args.repeat} runs per case")
    names = None
    folder = tempfile.TemporaryDirectory()
    for item in args.workloads.split(","):
        name, _, size = item.partition(":")
        w = workloads.get(name)
        rules_file = os.path.join(folder.name, f"{name}.fxr")
        with open(rules_file, "w", encoding="utf-8") as handle:
            handle.write(w.rules_text)
        g, small = graphs.make(w.family, int(size or 5000)), graphs.make(w.family, 300)
        timed = cases(w, g, rules_file)
        for call in cases(w, small, rules_file).values():  # imports, caches, the rules' compilation
            call(fresh(small.gm))
        times: dict = {case: [] for case in timed}
        rewrites: dict = {}
        for _ in range(args.repeat):
            for case, call in timed.items():
                gm = fresh(g.gm)
                gc.collect()
                start = time.perf_counter()
                result = call(gm)
                times[case].append(time.perf_counter() - start)
                rewrites[case] = len(result.report.applied)
        if names is None:
            names = list(timed)
            print("| workload | nodes | " + " | ".join(f"{n} ms" for n in names) + " | rewrites |")
            print("|---|---|" + "---|" * len(names) + "---|")
        print(f"| {name} | {len(g.gm.graph.nodes)} | "
              + " | ".join(f"{statistics.median(times[n]) * 1e3:.1f}" for n in names)
              + f" | {'/'.join(str(rewrites[n]) for n in names)} |", flush=True)
    folder.cleanup()


if __name__ == "__main__":
    main()
