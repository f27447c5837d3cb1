"""Time fxrules against torch.fx's replace_pattern, inductor's PatternMatcherPass and a floor.

    python -m benchmarks.run [--sizes 1000,5000,20000] [--workloads a,b] [--repeat 5] [--smoke]
                             [--tools fxrules,replace_pattern,inductor,floor] [--timeout 60]
                             [--budget 20] [--json out.json] [--profile]

For each graph size and workload, in one process, side by side:

fxrules          ``fxrules.apply_rules(gm, rules)``: the rules are parsed once, outside the
                 timing; the timing is the whole call (copying the graph, matching,
                 rewriting, the final lint and GraphModule construction).
replace_pattern  ``torch.fx.replace_pattern``, one call per pattern, and for module patterns
                 one call per submodule name (it matches ``call_module`` by name); each call
                 recompiles the module itself.
inductor         ``torch._inductor.pattern_matcher.PatternMatcherPass`` with the equivalent
                 patterns registered once outside the timing; ``apply(gm)`` then one
                 ``gm.recompile()``.
floor            the issue's floor: one pass over the nodes with a dict lookup per node (the
                 (op, target) index of the workload's rules), plus the graph edits the
                 rewrites need at torch.fx's own unit costs (``Graph.create_node`` per created
                 node, ``replace_all_uses_with`` per replaced root, ``erase_node`` per removed
                 node: each unit measured on a copy of this graph, times fxrules' counts),
                 plus one ``gm.recompile()``; measured separately and added: what any tool
                 that looks at every node once, edits only what changes and emits code once
                 must pay.

Each timing is the median of up to ``--repeat`` runs (``--large-repeat`` from 10,000 nodes),
each on a fresh copy of the traced input (copied outside the timing; the floor's parts
do not edit the graph and reuse it), stopping early once a cell has used ``--budget``
seconds. The tools take turns (round r runs each once), so a noisy machine slows them
alike. A peer run longer than ``--timeout`` seconds is interrupted and shown as
``timeout``; larger sizes of that peer and workload are then not attempted (also shown
as ``timeout``). A peer whose time at the previous size, scaled quadratically, predicts
more than the timeout is not attempted either and is shown as ``timeout*``
(replace_pattern per submodule name is quadratic by construction: one call per module,
each scanning and recompiling the whole graph). ``copy ms`` is
``fxrules.engine.transaction.copy_graph`` of the input graph (what ``copy.deepcopy`` of the graph
makes, faster), which apply_rules does first (it never edits its input; the peers edit in
place). ``--parse`` times ``fxrules.parse_rules`` on generated files of that many rules. Every tool's result is checked: its outputs on a random input equal the
original model's (bit for bit for [exact] workloads, within 1e-4 relative for conv+bn
folding), and the tools' rewrite counts and final node counts agree. The exit status is 1
when any check fails, so ``--smoke`` (tiny graphs, one repeat, every workload, well under
a minute) works as a CI step.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import fx

import fxrules
from fxrules.engine import fxaccess
from fxrules.engine.program import compile_rules
from fxrules.engine.transaction import copy_graph

from . import graphs
from .workloads import WORKLOADS, Workload

TOOLS = ("fxrules", "inplace", "replace_pattern", "inductor", "floor")
RUNNERS = ("fxrules", "inplace", "replace_pattern", "inductor")  # the tools timed as a whole call
ENGINES = ("fxrules", "inplace")  # fxrules' two modes
LARGE = 10_000  # graphs at least this large are timed --large-repeat times


class Timeout(BaseException):
    """Raised by the interval timer; a BaseException so no tool's `except Exception` swallows it."""


def _on_alarm(signum, frame):
    raise Timeout()


def _timed(fn: Callable[[Any], Any], arg: Any, cap: Optional[float]) -> tuple[float, Any]:
    if cap:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, cap)
    try:
        start = time.perf_counter()
        out = fn(arg)
        return time.perf_counter() - start, out
    finally:
        if cap:
            signal.setitimer(signal.ITIMER_REAL, 0)


def fresh(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy to rewrite: a new graph and module tree; leaf modules and parameters are shared.
    (The graph is copied with ``copy_graph``: the graph ``copy.deepcopy`` makes, in a fraction of
    the time; this runs outside every timing, before each run.)"""
    return fx.GraphModule(gm, copy_graph(gm.graph), class_name=type(gm).__name__)


@dataclass
class Cell:
    """One tool on one (workload, size)."""

    seconds: Optional[float] = None  # median
    runs: int = 0
    status: str = "ok"  # ok | timeout | skipped | failed | n/a
    rewrites: Optional[int] = None
    nodes_after: Optional[int] = None
    note: str = ""
    all_seconds: list = field(default_factory=list)
    edits: Optional[tuple] = None  # fxrules: nodes (created, rewired, erased), for the floor

    def show(self) -> str:
        if self.status in ("timeout", "skipped-timeout"):
            return "timeout"
        if self.status == "predicted-timeout":
            return "timeout*"
        if self.seconds is None:
            return self.status
        return f"{self.seconds * 1000:.1f}"


def measure(fn: Callable[[Any], Any], make_input: Callable[[], Any], repeat: int, cap: Optional[float],
            budget: float) -> tuple[Cell, Any, Any]:
    """Median of up to ``repeat`` runs on fresh inputs; returns the cell, the last input and output."""
    cell = Cell()
    inp = out = None
    spent = 0.0
    for _ in range(repeat):
        inp = make_input()
        gc.collect()
        try:
            seconds, out = _timed(fn, inp, cap)
        except Timeout:
            cell.status = "timeout"
            cell.note = f"> {cap:.0f} s"
            return cell, None, None
        cell.all_seconds.append(seconds)
        spent += seconds
        if spent >= budget:
            break
    cell.runs = len(cell.all_seconds)
    cell.seconds = statistics.median(cell.all_seconds)
    return cell, inp, out


def _outputs(gm: torch.nn.Module, example: tuple) -> torch.Tensor:
    with torch.no_grad():
        return gm(*example)


def _same(y: torch.Tensor, ref: torch.Tensor, exact: bool) -> tuple[bool, str]:
    if y.shape != ref.shape:
        return False, f"shape {tuple(y.shape)}, expected {tuple(ref.shape)}"
    scale = max(1.0, ref.abs().max().item())
    err = (y - ref).abs().max().item()
    if exact:
        return torch.equal(y, ref), f"not bit-identical (max abs error {err:.2e})"
    return err <= 1e-4 * scale, f"max abs error {err:.2e} (scale {scale:.2g}, allowed {1e-4 * scale:.1e})"


@dataclass
class Row:
    workload: str
    family: str
    nodes: int
    cells: dict
    floor_scan: Optional[float] = None
    floor_recompile: Optional[float] = None
    fx_recompile: Optional[float] = None  # the same recompile with fxrules' source writer (engine.codegen)
    floor_mutation: Optional[float] = None  # the rewrites' create/rewire/erase at torch.fx's unit costs
    floor_build: Optional[float] = None  # building the modules the rewrites need (Workload.builds)
    builds: Optional[int] = None  # how many
    graph_copy: Optional[float] = None
    phases: Optional[dict] = None  # fxrules' own time by phase (one instrumented run), seconds
    peak: dict = field(default_factory=dict)  # tool -> peak bytes of Python allocations in one run
    failures: list = field(default_factory=list)

    @property
    def floor(self) -> Optional[float]:
        if self.floor_scan is None or self.floor_recompile is None:
            return None
        return self.work_floor + self.floor_recompile

    @property
    def work_floor(self) -> Optional[float]:
        """The floor without its recompile: scan, the edits, and building modules."""
        if self.floor_scan is None:
            return None
        return self.floor_scan + (self.floor_mutation or 0.0) + (self.floor_build or 0.0)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tools = args.tools
        self.graph_cache: dict = {}
        self.ref_cache: dict = {}
        self.timed_out: dict = {}  # (tool, workload) -> size at which it timed out
        self.last: dict = {}  # (tool, workload) -> (nodes, median seconds) of its last measurement
        self.graph_copy: dict = {}  # (family, depth) -> seconds to copy the graph (copy_graph)
        self.unit_costs: dict = {}  # (family, depth) -> seconds per (created, rewired, erased) node
        self.warmed_replace_pattern = False
        self.runners: dict = {}  # (tool, workload) -> runner
        self.rows: list[Row] = []
        self.failures: list[str] = []

    # -- inputs ------------------------------------------------------------------
    def graph(self, family: str, size: int) -> graphs.Graph:
        """The graph of ``family`` near ``size`` nodes (made once). Everything the harness holds
        for the whole run (graphs, models, reference outputs) is then frozen out of the garbage
        collector's sight (``gc.freeze``): otherwise every collection during a timed run, and the
        ``gc.collect()`` before each, would traverse millions of objects no tool made (up to a
        second each at 20k nodes, and more as the cache grows), charging the tools for the
        harness. Each tool's own allocations are still collected as usual."""
        key = (family, size)
        if key not in self.graph_cache:
            g = self.graph_cache[key] = graphs.make(family, size)
            self.reference(g)
            gc.collect()
            gc.freeze()
        return self.graph_cache[key]

    def reference(self, g: graphs.Graph) -> torch.Tensor:
        key = (g.family, g.depth)
        if key not in self.ref_cache:
            self.ref_cache[key] = _outputs(g.model, g.example)
        return self.ref_cache[key]

    def runner(self, tool: str, w: Workload) -> Optional[Callable]:
        key = (tool, w.name)
        if key not in self.runners:
            rules = w.rules
            compile_rules(rules)  # parse and compile once, outside every timing
            if tool == "fxrules":
                self.runners[key] = lambda gm: fxrules.apply_rules(gm, rules)
            elif tool == "inplace":
                self.runners[key] = lambda gm: fxrules.apply_rules(gm, rules, inplace=True)
            elif tool == "replace_pattern":
                self.runners[key] = w.replace_pattern()
            elif tool == "inductor":
                self.runners[key] = w.inductor() if w.inductor is not None else None
        return self.runners[key]

    def repeat(self, nodes: int) -> int:
        return self.args.repeat if nodes < LARGE else min(self.args.repeat, self.args.large_repeat)

    # -- one (workload, size) --------------------------------------------------------
    def warm_up(self, w: Workload) -> None:
        """One untimed run of every tool on a small graph: imports, caches, the rules' compilation.
        replace_pattern keeps nothing per workload (its patterns are traced when its runner is
        made), so it warms up once per process: on 500 rules its warm-up alone took 10 s."""
        g = self.graph(w.family, 300)
        for tool in RUNNERS:
            if tool not in self.tools or self.runner(tool, w) is None:
                continue
            if tool == "replace_pattern" and self.warmed_replace_pattern:
                continue
            self.runner(tool, w)(fresh(g.gm))
            self.warmed_replace_pattern |= tool == "replace_pattern"

    def run_one(self, w: Workload, size: int) -> Row:
        """Time every tool on one graph, interleaved: round r runs each tool once, so the noise of a
        shared machine falls on all of them alike."""
        a = self.args
        g = self.graph(w.family, size)
        ref = self.reference(g)
        row = Row(w.name, w.family, g.nodes, {})
        make = lambda: fresh(g.gm)  # noqa: E731
        same = lambda: g.gm  # noqa: E731  (the floor's parts do not edit the graph)
        timers: dict = {}  # name -> (function, input maker, cap)
        for tool in RUNNERS:
            cell = self.skip(tool, w, g)
            if cell is not None:
                row.cells[tool] = cell
                continue
            timers[tool] = (self.runner(tool, w), make, a.timeout if tool not in ENGINES else max(a.timeout, 600))
        if "floor" in self.tools:
            index = compile_rules(w.rules).by_key

            def scan(gm: fx.GraphModule) -> int:
                get, found = index.get, 0
                for node in gm.graph.nodes:
                    if get((node.op, node.target)) is not None:
                        found += 1
                return found

            timers["scan"] = (scan, same, None)
            timers["recompile"] = (lambda gm: gm.recompile(), same, None)
            timers["fx_recompile"] = (_fxrules_recompile, same, None)
            if w.builds is not None:
                builder, calls = w.builds(g.gm)
                row.builds = len(calls)
                timers["build"] = (lambda calls: [builder(*args) for args in calls], lambda: calls, None)
        cells = {name: Cell() for name in timers}
        last: dict = {}
        active = list(timers)
        for _ in range(self.repeat(g.nodes)):
            for name in list(active):
                fn, make_input, cap = timers[name]
                inp = make_input()
                gc.collect()
                try:
                    seconds, out = _timed(fn, inp, cap)
                except Timeout:
                    cells[name] = Cell(status="timeout", note=f"> {cap:.0f} s")
                    active.remove(name)
                    continue
                cells[name].all_seconds.append(seconds)
                last[name] = (inp, out)
                if sum(cells[name].all_seconds) >= a.budget:
                    active.remove(name)
        for name, cell in cells.items():
            if cell.all_seconds:
                cell.runs = len(cell.all_seconds)
                cell.seconds = statistics.median(cell.all_seconds)
        for tool in RUNNERS:
            if tool not in timers:
                continue
            cell = row.cells[tool] = cells[tool]
            if cell.status == "timeout":
                self.timed_out[(tool, w.name)] = g.nodes
                continue
            self.last[(tool, w.name)] = (g.nodes, cell.seconds)
            self.check(tool, w, g, ref, row, cell, *last[tool])
        row.cells = {tool: row.cells[tool] for tool in RUNNERS}
        if a.memory:
            for tool in RUNNERS:
                cell = row.cells[tool]
                if tool in timers and cell.status == "ok" and cell.seconds is not None \
                        and cell.seconds <= MEMORY_RUN_LIMIT:
                    row.peak[tool] = peak_memory(timers[tool][0], make)
        if "floor" in self.tools:
            row.floor_scan, row.floor_recompile = cells["scan"].seconds, cells["recompile"].seconds
            row.fx_recompile = cells["fx_recompile"].seconds
            row.floor_build = cells["build"].seconds if "build" in cells else None
            key = (g.family, g.depth)
            if key not in self.graph_copy:  # informative, and the same for every workload on this graph
                self.graph_copy[key] = measure(lambda gm: copy_graph(gm.graph), same, self.repeat(g.nodes),
                                               None, a.budget)[0].seconds
            row.graph_copy = self.graph_copy[key]
            fx_cell = next((row.cells[t] for t in ENGINES if row.cells[t].edits is not None), None)
            if fx_cell is not None:
                if key not in self.unit_costs:
                    self.unit_costs[key] = edit_unit_costs(g.gm)
                row.floor_mutation = sum(n * c for n, c in zip(fx_cell.edits, self.unit_costs[key]))
        if "fxrules" in timers and a.breakdown:
            row.phases = breakdown(w, g)
        self.cross_check(w, row)
        return row

    def skip(self, tool: str, w: Workload, g: graphs.Graph) -> Optional[Cell]:
        """A cell saying why ``tool`` is not run here, or None to run it."""
        if tool not in self.tools:
            return Cell(status="-")
        if self.runner(tool, w) is None:
            return Cell(status="n/a", note=w.inductor_note)
        if (tool, w.name) in self.timed_out:
            return Cell(status="skipped-timeout", note=f"timed out at {self.timed_out[(tool, w.name)]} nodes")
        if tool not in ENGINES and (tool, w.name) in self.last:
            nodes, seconds = self.last[(tool, w.name)]
            predicted = seconds * (g.nodes / nodes) ** 2
            if predicted > self.args.timeout:
                return Cell(status="predicted-timeout",
                            note=f"{seconds:.1f} s at {nodes} nodes; ~{predicted:.0f} s if quadratic")
        return None

    def check(self, tool: str, w: Workload, g: graphs.Graph, ref: torch.Tensor, row: Row, cell: Cell,
              inp: Any, out: Any) -> None:
        """What the tool produced, and whether it computes what the model computes."""
        if tool in ENGINES:
            report = out.report
            result_gm, cell.rewrites = out.module, len(report.applied)
            if tool == "inplace" and result_gm is not inp:
                row.failures.append("inplace: the result is not the module it was given")
            created = sum(len(entry.created) for entry in report.applied)
            rewired = sum(len(entry.replaced_by) for entry in report.applied)
            cell.edits = (created, rewired, created + report.nodes_before - report.nodes_after)
            if report.rejected:
                cell.note = f"{len(report.rejected)} rejected"
        else:
            result_gm, cell.rewrites = inp, out
        cell.nodes_after = len(result_gm.graph.nodes)
        try:
            result_gm.graph.lint()
            ok, how = _same(_outputs(result_gm, g.example), ref, w.exact)
        except Exception as exc:  # a broken graph is a failed check, not a crash
            ok, how = False, f"{type(exc).__name__}: {exc}"
        if ok and not w.exact:
            cell.note = how
        if not ok:
            cell.status = "failed"
            row.failures.append(f"{tool}: outputs differ from the model's: {how}")

    def cross_check(self, w: Workload, row: Row) -> None:
        done = {t: c for t, c in row.cells.items() if c.rewrites is not None}
        fx_cell = done.get("fxrules")
        if fx_cell is not None and fx_cell.rewrites == 0:
            row.failures.append("fxrules made no rewrite: the workload does not exercise anything")
        counts = {t: c.rewrites for t, c in done.items()}
        if len(set(counts.values())) > 1:
            row.failures.append(f"rewrite counts differ: {counts}")
        if row.builds is not None and fx_cell is not None and fx_cell.rewrites != row.builds:
            row.failures.append(f"the floor builds {row.builds} modules, fxrules rewrote {fx_cell.rewrites} matches")
        after = {t: c.nodes_after for t, c in done.items()}
        if len(set(after.values())) > 1:
            row.failures.append(f"node counts after rewriting differ: {after}")
        for message in row.failures:
            self.failures.append(f"{w.name} @ {row.nodes} nodes: {message}")

    # -- everything ----------------------------------------------------------------
    def run(self) -> None:
        a = self.args
        for name in a.workloads:
            w = WORKLOADS[name]
            if a.warmup:
                self.warm_up(w)
            for size in a.sizes:
                started = time.perf_counter()
                row = self.run_one(w, size)
                self.rows.append(row)
                print(f"  {w.name:20} {row.nodes:6} nodes  "
                      + "  ".join(f"{t}={c.show()}" for t, c in row.cells.items())
                      + f"  floor={_ms(row.floor)}  ({time.perf_counter() - started:.1f} s)"
                      + ("  FAILED" if row.failures else ""), file=sys.stderr, flush=True)
                if a.profile:
                    print(profile_fxrules(w, self.graph(w.family, size)), flush=True)

    def table(self) -> str:
        head = ("| workload | graph | nodes | fxrules ms | inplace ms | replace_pattern ms | inductor ms | floor ms "
                "| copy ms | recompile ms torch/fxrules | fxrules/floor | inplace/floor | replace_pattern/fxrules | inductor/fxrules "
                "| peak MB fx/ip/rp/ind | rewrites fx/ip/rp/ind | check |")
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for r in self.rows:
            fx_c, ip_c, rp_c, ind_c = (r.cells[t] for t in RUNNERS)
            rewrites = "/".join("-" if c.rewrites is None else str(c.rewrites) for c in (fx_c, ip_c, rp_c, ind_c))
            peaks = "/".join(_mb(r.peak[t]) if t in r.peak else "-" for t in RUNNERS)
            lines.append(
                f"| {r.workload} | {r.family} | {r.nodes} | {fx_c.show()} | {ip_c.show()} | {rp_c.show()} "
                f"| {ind_c.show()} | {_ms(r.floor)} | {_ms(r.graph_copy)} | {_ms(r.floor_recompile)}/{_ms(r.fx_recompile)} "
                f"| {_ratio(fx_c.seconds, r.floor)} "
                f"| {_ratio(ip_c.seconds, r.floor)} | {_ratio(rp_c.seconds, fx_c.seconds)} "
                f"| {_ratio(ind_c.seconds, fx_c.seconds)} | {peaks} | {rewrites} | {'FAIL' if r.failures else 'ok'} |")
        return "\n".join(lines)

    def goals_table(self) -> str:
        """Issue 17's goals, cell by cell: the copying mode no slower than inductor (inductor/fxrules
        >= 1), the in-place mode within 1.15x the floor, and replace_pattern at least 30x slower than
        fxrules on `rules50` (measured there only)."""
        head = "| workload | nodes | inductor/fxrules (>= 1.00) | inplace/floor (<= 1.15) | replace_pattern/fxrules (>= 30, rules50) |"
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for r in self.rows:
            fx_c, ip_c, rp_c, ind_c = (r.cells[t] for t in RUNNERS)
            lines.append(f"| {r.workload} | {r.nodes} | {_goal(ind_c.seconds, fx_c.seconds, 1.0, True)} "
                         f"| {_goal(ip_c.seconds, r.floor, GOAL_INPLACE_FLOOR, False)} "
                         f"| {_goal(rp_c.seconds, fx_c.seconds, 30.0, True) if r.workload == 'rules50' else '-'} |")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "machine": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform(), "threads": torch.get_num_threads(),
                        "cpus": os.cpu_count(), "commit": _commit()},
            "args": {k: v for k, v in vars(self.args).items()},
            "rows": [{
                "workload": r.workload, "family": r.family, "nodes": r.nodes,
                "floor_scan_s": r.floor_scan, "floor_recompile_s": r.floor_recompile,
                "fxrules_recompile_s": r.fx_recompile,
                "floor_mutation_s": r.floor_mutation, "floor_build_s": r.floor_build, "builds": r.builds,
                "graph_copy_s": r.graph_copy, "fxrules_phases_s": r.phases,
                "peak_bytes": r.peak,
                "cells": {t: {"median_s": c.seconds, "runs": c.runs, "all_s": c.all_seconds, "status": c.status,
                              "rewrites": c.rewrites, "nodes_after": c.nodes_after, "note": c.note}
                          for t, c in r.cells.items()},
                "failures": r.failures,
            } for r in self.rows],
            "failures": self.failures,
        }


MEMORY_RUN_LIMIT = 0.6
"""Seconds: a tool whose median run takes longer gets no memory run (tracemalloc slows runs
several times over: with memory runs at 20k nodes the full benchmark took 15.6 minutes, over
its 15-minute budget; peaks at 1k and 5k nodes show how memory grows)."""


def peak_memory(fn: Callable[[Any], Any], make_input: Callable[[], Any]) -> int:
    """Peak bytes of Python allocations (``tracemalloc``) during one extra, untimed run of ``fn`` on a
    fresh input: the graph objects, code strings and modules a tool makes. Tensor storage that
    torch allocates outside Python's allocator (folded weights) is not counted."""
    import tracemalloc

    inp = make_input()
    gc.collect()
    tracemalloc.start()
    try:
        fn(inp)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _fxrules_recompile(gm: fx.GraphModule) -> None:
    """``gm.recompile()`` as fxrules' commit runs it: the source written by ``fxrules.engine.codegen``
    (the same text as torch.fx's writer; the floor keeps torch's)."""
    with fxaccess.recompiling(gm.graph):
        gm.recompile()


def edit_unit_costs(gm: fx.GraphModule, count: int = 2000) -> tuple[float, float, float]:
    """Seconds per created, rewired and erased node: torch.fx's own ``create_node``,
    ``replace_all_uses_with`` and ``erase_node``, measured on a copy of ``gm``'s graph (each the
    median of 3 batches of ``count``), at the graph's end, where the rewrites' inputs are."""
    times: dict = {"create": [], "rewire": [], "erase": []}
    for _ in range(3):
        graph = copy_graph(gm.graph)
        source = next(n for n in graph.nodes if n.op == "placeholder")
        gc.collect()
        start = time.perf_counter()
        with graph.inserting_before(graph.output_node()):
            made = [graph.call_function(torch.neg, (source,)) for _ in range(count)]
        middle = time.perf_counter()
        with graph.inserting_before(graph.output_node()):
            readers = [graph.call_function(torch.neg, (n,)) for n in made]
        times["create"].append((middle - start) / count)
        start = time.perf_counter()
        for node in made:
            node.replace_all_uses_with(source)
        times["rewire"].append((time.perf_counter() - start) / count)
        start = time.perf_counter()
        for node in made:
            graph.erase_node(node)
        times["erase"].append((time.perf_counter() - start) / count)
        del readers
    return tuple(statistics.median(times[k]) for k in ("create", "rewire", "erase"))


def breakdown(w: Workload, g: graphs.Graph) -> dict:
    """fxrules' time by phase, from one instrumented run (not one of the timed ones): copying the
    input, matching (incl. conditions and the pre-check scan), planning, editing the graph, the
    commit's checks and GraphModule assembly, and its one recompile."""
    import fxrules.engine.driver as engine
    import fxrules.engine.transaction as transaction

    spent: dict = {}

    def timed(owner: Any, name: str, label: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        setattr(owner, name, wrapper)
        return lambda: setattr(owner, name, original)

    gm = fresh(g.gm)
    rules = w.rules
    gc.collect()
    undo = [timed(engine, "prepare", "copy"), timed(engine._Session, "rewrite", "rewrite"),
            timed(engine._Session, "plan", "plan"), timed(engine, "apply_match", "edit"),
            timed(transaction.Workpiece, "commit", "commit"), timed(fx.GraphModule, "recompile", "recompile")]
    try:
        started = time.perf_counter()
        fxrules.apply_rules(gm, rules)
        total = time.perf_counter() - started
    finally:
        for restore in undo:
            restore()
    phases = {
        "copy": spent.get("copy", 0.0),
        "match": spent.get("rewrite", 0.0) - spent.get("plan", 0.0) - spent.get("edit", 0.0),
        "plan": spent.get("plan", 0.0),
        "edit": spent.get("edit", 0.0),
        "commit": spent.get("commit", 0.0) - spent.get("recompile", 0.0),
        "recompile": spent.get("recompile", 0.0),
    }
    phases["other"] = max(0.0, total - sum(phases.values()))
    phases["total"] = total
    return phases


def breakdown_table(rows: list) -> str:
    """fxrules' phases per row, and its work without the recompile against the floor's."""
    head = ("| workload | nodes | total ms | copy | match | plan | edit | commit | recompile | other "
            "| work excl. recompile | scan + edits floor | ratio |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p = r.phases
        if not p:
            continue
        work = p["total"] - p["recompile"]
        lines.append(
            f"| {r.workload} | {r.nodes} | {p['total'] * 1000:.0f} | "
            + " | ".join(f"{p[k] * 1000:.0f}" for k in ("copy", "match", "plan", "edit", "commit", "recompile", "other"))
            + f" | {work * 1000:.0f} | {_ms(r.work_floor)} | {_ratio(work, r.work_floor)} |")
    return "\n".join(lines)


def parse_texts(count: int) -> str:
    """``count`` distinct generated rules (about 26 tokens each), as one file's text.

    The workload generator's rules (``torch.A(torch.B($x))``, ``x.B().A()``, module pairs,
    near misses) while its distinct pairs last, then the same patterns again under new names.
    """
    from .workloads import _gen_text, _generated

    pool = _generated(min(count, 3000))
    parts = []
    for i in range(count):
        text = _gen_text(i, pool[i % len(pool)])
        if i >= len(pool):
            text = text.replace(f"rule gen_{i:03d}_", f"rule gen_{i:03d}_again{i // len(pool)}_", 1)
        parts.append(text)
    return "\n".join(parts) + "\n"


def time_parsing(counts: list[int], repeat: int) -> list[dict]:
    """parse+check (``fxrules.parse_rules``) of generated files: median seconds per size."""
    fxrules.parse_rules(parse_texts(10), "<warm-up>")  # builds the Lark parser once, outside the timing
    out = []
    for count in counts:
        text = parse_texts(count)
        times = []
        for _ in range(repeat if count <= 5000 else max(1, repeat // 2)):
            gc.collect()
            started = time.perf_counter()
            rules = fxrules.parse_rules(text, f"<{count} rules>")
            times.append(time.perf_counter() - started)
        if len(rules) != count:
            raise AssertionError(f"parsed {len(rules)} of {count} rules")
        out.append({"rules": count, "characters": len(text), "median_s": statistics.median(times), "all_s": times})
        print(f"  parse+check {count:6} rules  {statistics.median(times) * 1000:.0f} ms", file=sys.stderr,
              flush=True)
    return out


def parse_table(results: list[dict]) -> str:
    lines = ["| rules | characters | parse+check ms | per rule us |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['rules']} | {r['characters']} | {r['median_s'] * 1000:.0f} | "
                     f"{r['median_s'] / r['rules'] * 1e6:.0f} |")
    return "\n".join(lines)


def scaling_table(rows: list) -> str:
    """Per workload and tool, the exponent k in time ~ nodes^k between the smallest and largest size."""
    by_workload: dict = {}
    for r in rows:
        by_workload.setdefault(r.workload, []).append(r)
    lines = ["| workload | sizes | fxrules | inplace | replace_pattern | inductor | floor |", "|---|---|---|---|---|---|---|"]
    import math

    for name, group in by_workload.items():
        if len(group) < 2:
            continue
        lo, hi = min(group, key=lambda r: r.nodes), max(group, key=lambda r: r.nodes)
        cells = []
        for tool in TOOLS:
            a = lo.floor if tool == "floor" else lo.cells[tool].seconds
            b = hi.floor if tool == "floor" else hi.cells[tool].seconds
            cells.append("-" if not a or not b else f"{math.log(b / a) / math.log(hi.nodes / lo.nodes):.2f}")
        lines.append(f"| {name} | {lo.nodes}-{hi.nodes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit() -> Optional[str]:
    """The checkout's commit (with ``+dirty`` when it has changes), if git can say."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def _mb(size: int) -> str:
    mb = size / 2**20
    return f"{mb:.1f}" if mb < 10 else f"{mb:.0f}"


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


GOAL_INPLACE_FLOOR = 1.15
"""Issue 17: the in-place mode at most this many times the floor."""


def _goal(a: Optional[float], b: Optional[float], bound: float, at_least: bool) -> str:
    """``a / b`` and whether it meets ``bound`` (at least it, or at most it): ``1.04x ok``, ``0.97x MISS``."""
    if a is None or b is None or b == 0:
        return "-"
    ratio = a / b
    met = ratio >= bound if at_least else ratio <= bound
    return f"{_ratio(a, b)} {'ok' if met else 'MISS'}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.1f}x" if a / b >= 10 else f"{a / b:.2f}x"


def profile_fxrules(w: Workload, g: graphs.Graph, top: int = 15) -> str:
    """cProfile of one apply_rules run (its own run, outside the timings), top entries by tottime."""
    gm = fresh(g.gm)
    rules = w.rules
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    fxrules.apply_rules(gm, rules)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    text = text[text.find("ncalls") - 3:] if "ncalls" in text else text
    return f"--- profile: fxrules, {w.name}, {g.nodes} nodes ({stats.total_tt * 1000:.0f} ms under cProfile)\n{text}"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,5000,20000", help="approximate node counts (comma-separated)")
    p.add_argument("--workloads", default=None, help=f"comma-separated; known: {', '.join(WORKLOADS)}")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {', '.join(TOOLS)}")
    p.add_argument("--repeat", type=int, default=5, help="runs per timing (median); default 5")
    p.add_argument("--large-repeat", type=int, default=3,
                   help=f"runs per timing for graphs of {LARGE} nodes or more (default 3)")
    p.add_argument("--budget", type=float, default=10.0,
                   help="stop repeating a cell once its runs took this many seconds (default 10)")
    p.add_argument("--timeout", type=float, default=60.0, help="cap on one peer run, seconds (default 60)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed warm-up run of each tool per workload")
    p.add_argument("--smoke", action="store_true",
                   help="tiny graphs (~300 nodes), one repeat, every workload: a correctness check")
    p.add_argument("--json", help="also write every measurement to this file")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one fxrules run per cell")
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="skip the extra tracemalloc run per tool and cell behind the peak MB column")
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                   help="skip the extra instrumented fxrules run per cell that splits its time by phase")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1; see README)")
    p.add_argument("--parse", default="100,2000,20000",
                   help="rule counts for the parse+check timing (comma-separated; empty: none)")
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeat, args.warmup = "300", 1, False
        args.parse = "100" if args.parse == "100,2000,20000" else args.parse
    if args.workloads is None:
        args.workloads = ",".join(WORKLOADS)
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    args.parse = [int(s) for s in str(args.parse).split(",") if s]
    args.workloads = [s for s in args.workloads.split(",") if s]
    args.tools = [s for s in args.tools.split(",") if s]
    for name in args.workloads:
        if name not in WORKLOADS:
            p.error(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    for tool in args.tools:
        if tool not in TOOLS:
            p.error(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    bench = Bench(args)
    print(f"fxrules {fxrules.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
          f"{torch.get_num_threads()} torch thread(s); sizes {args.sizes}, repeat {args.repeat}, "
          f"timeout {args.timeout:.0f} s", file=sys.stderr)
    bench.run()
    parsing = time_parsing(args.parse, args.repeat) if args.parse else []
    print(bench.table())
    print("\nIssue 17's goals per cell (ratios of the medians above):\n")
    print(bench.goals_table())
    if len(args.sizes) > 1:
        print("\nScaling exponents (time ~ nodes^k, smallest to largest size):\n")
        print(scaling_table(bench.rows))
    if any(r.phases for r in bench.rows):
        print("\nWhere fxrules' time goes (ms; one instrumented run per row, so it differs from the "
              "median above; `match` includes the scan and conditions, `commit` the checks and module "
              "assembly without the recompile):\n")
        print(breakdown_table(bench.rows))
    if parsing:
        print("\nParse and check (`fxrules.parse_rules`) of generated rule files:\n")
        print(parse_table(parsing))
    if args.json:
        data = bench.to_json()
        data["parsing"] = parsing
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, default=str)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if bench.failures:
        print(f"\n{len(bench.failures)} check(s) FAILED:", file=sys.stderr)
        for message in bench.failures:
            print("  " + message, file=sys.stderr)
        return 1
    print("all checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
