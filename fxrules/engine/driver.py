"""The rewrite driver: prepare a workpiece, rewrite to a fixpoint with a worklist, commit.

Priority, when matches overlap: rule order first, then graph order. Candidates
are taken by (rule index, node position) from a :class:`~fxrules.engine.worklist.Worklist`;
the first candidate whose match passes its conditions and the planner's checks is
rewritten, and the nodes the rewrite touched (new nodes, users of replaced nodes up
to the deepest pattern's depth) go back on it, with the matches turned down earlier
that read a node the rewrite left with fewer users. The whole graph is scanned once;
afterwards only those are revisited.

The run stops when the worklist is empty (a fixpoint: no rule applies anywhere) or
raises :class:`RewriteLoopError` after ``max_iterations`` rewrites.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch
from torch import fx, nn

from fxrules.engine import fxaccess
from fxrules.engine.conditions import ConditionRaised, Evaluator, MissingMetadata
from fxrules.lang.diagnostics import FxrulesError
from fxrules.engine.matcher import (UNHASHABLE_INPUT, GraphView, Match, Miss, direct_matcher, input_keys,
                                    match_program, may_match)
from fxrules.engine.planner import STORAGE_REFUSALS, Plan, plan
from fxrules.engine.program import (CompiledRules, PAlt, PBind, PCall, PSeq, Program, compile_rules, further_roots,
                                    index_programs)
from fxrules.engine.refusals import MissCode, Refusal, RefusalCode
from fxrules.engine.report import Applied, MatchInfo, NearMiss, Rejected, Report, RewriteResult
from fxrules.lang.ruleset import RuleSet
from fxrules.engine.budget import Budget, RealRunGuard, Unsized
from fxrules.engine.guards import read_beyond
from fxrules.engine.errors import AllocationRefused, ModelError, RewriteError, RewriteLoopError
from fxrules.engine.transaction import Journal, Workpiece, apply_match, copy_graph, refusal_before_edit
from fxrules.engine.worklist import Worklist
from fxrules.engine.users import HUB


# ---------------------------------------------------------------------------
# Preparing a model
# ---------------------------------------------------------------------------


def prepare(model: Any, *, tracer: Optional[fx.Tracer] = None, concrete_args: Optional[dict] = None,
            example_inputs: Optional[tuple] = None) -> Workpiece:
    """A workpiece for ``model`` (nn.Module, GraphModule or ExportedProgram); the model is not modified."""
    if isinstance(model, torch.export.ExportedProgram):
        try:
            module = model.module()  # a fresh module every call: ours to rewrite
        except Exception as exc:
            raise ModelError(f"cannot unlift the ExportedProgram: {type(exc).__name__}: {exc}") from exc
        work = Workpiece(module.graph, module, class_name=type(module).__name__, donor=module)
        work.trains = False  # an ExportedProgram keeps no training mode: taken as inference (docs/semantics.md)
    elif isinstance(model, fx.GraphModule):
        graph = copy_graph(model.graph)
        work = Workpiece(graph, model, class_name=type(model).__name__, donor=model)
    elif isinstance(model, nn.Module):
        work = _trace(model, tracer, concrete_args)
    else:
        raise ModelError(f"expected an nn.Module, a torch.fx.GraphModule or a torch.export.ExportedProgram, "
                         f"got {type(model).__name__}")
    if example_inputs is not None and not work.has_values:
        with torch.enable_grad():  # requires_grad in the values, for the guards (the real fallback runs without)
            propagate_values(work, tuple(example_inputs))
        work.tracks_grad = any(fxaccess.is_fake_tensor(n.meta.get("val")) for n in work.graph.find_nodes(op="placeholder"))
    return work


def prepare_in_place(model: Any, *, example_inputs: Optional[tuple] = None) -> Workpiece:
    """A workpiece on ``model``'s own graph (a GraphModule), every edit journaled; metadata from
    ``example_inputs`` is written into its nodes (and undone with the rest on a failure)."""
    if not isinstance(model, fx.GraphModule):
        kind = "an ExportedProgram" if isinstance(model, torch.export.ExportedProgram) else \
            f"a {type(model).__name__}" if isinstance(model, nn.Module) else f"{type(model).__name__}"
        raise ModelError(f"inplace=True rewrites the torch.fx.GraphModule it is given; {kind} is not one "
                         f"(it would be traced or unlifted into a new module first): pass a GraphModule, or "
                         f"leave inplace off")
    work = Workpiece(model.graph, model, class_name=type(model).__name__, journal=Journal(model.graph))
    if example_inputs is not None and not work.has_values:
        try:
            with torch.enable_grad():
                propagate_values(work, tuple(example_inputs))
        except BaseException:
            work.journal.rollback()
            raise
        work.tracks_grad = any(fxaccess.is_fake_tensor(n.meta.get("val")) for n in work.graph.find_nodes(op="placeholder"))
    return work


_TRACE_LOCK = threading.Lock()
"""One torch.fx trace at a time in this process: overlapping traces corrupt each other."""


def _trace(model: nn.Module, tracer: Optional[fx.Tracer], concrete_args: Optional[dict]) -> Workpiece:
    tracer = tracer if tracer is not None else fx.Tracer()
    before = set(fxaccess.members(model))
    try:
        with _TRACE_LOCK:  # torch.fx patches nn.Module.__call__ globally while it traces
            graph = tracer.trace(model, concrete_args)
    except Exception as exc:
        raise ModelError(f"{type(model).__name__} does not trace with torch.fx ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else exc}); pass a torch.fx.GraphModule or a "
                         f"torch.export.ExportedProgram, or concrete_args") from exc
    # The tracer stores tensor constants on the traced module; keep them in the workpiece instead.
    extra = {}
    for key in [k for k in fxaccess.members(model) if k not in before]:
        extra[key] = fxaccess.take_member(model, key)
    return Workpiece(graph, model, class_name=type(model).__name__, extra_attrs=extra)


def propagate_values(work: Workpiece, example_inputs: tuple) -> None:
    """Fill meta['val'] of every node by running the graph on fake tensors (real ones as a fallback).

    Neither run touches the caller's tensors or modules: the fake run uses fake copies of modules
    and attributes; the real fallback runs on copies, with the random number generators forked,
    each op sized on fake tensors first and refused over the allocation budget
    (:class:`fxrules.engine.budget.RealRunGuard`: :class:`AllocationRefused`, a ModelError).

    Why fake tensors and not meta tensors (issue 17, measured on torch 2.13): a meta run would
    need the facts meta tensors drop kept beside them (the device, for conditions and the
    ``device-changed`` guard), but it would not start faster. ``FakeTensorMode()`` imports
    ``torch._dynamo`` (about 1 s), and so does a meta run: the meta kernels of relu, add, mul,
    cat, gelu, layer_norm and batch_norm's decomposition are Python functions wrapped in
    ``torch._disable_dynamo``, which imports ``torch._dynamo`` on its first call. Beyond that
    import the fake run of a small model takes tens of milliseconds (benchmarks/README.md,
    "Cold start"; ``tests/test_benchmarks_cold.py`` fails if torch stops importing it).
    """
    import copy

    class _Run(fx.Interpreter):
        def __init__(self, copy_module, copy_value):
            super().__init__(nn.Module(), graph=work.graph)
            self.copy_module, self.copy_value = copy_module, copy_value
            self.modules_cache: dict = {}
            self.attrs_cache: dict = {}
            self.current = ""
            self.guard: Optional[RealRunGuard] = None
            self.depths: dict = {}  # node -> how many views deep its fake value is (see _shallow_view)

        def fetch_attr(self, target: str) -> Any:
            if target not in self.attrs_cache:
                self.attrs_cache[target] = self.copy_value(work.attr_of(target))
            return self.attrs_cache[target]

        def call_module(self, target, args, kwargs):
            if target not in self.modules_cache:
                self.modules_cache[target] = self.copy_module(work.module_of(target))
            # _call_impl (hooks and forward), not __call__: while another thread traces, torch.fx
            # patches nn.Module.__call__
            module = self.modules_cache[target]
            call = fxaccess.hooks_call(module)
            return call(*args, **kwargs)

        def run_node(self, n: fx.Node) -> Any:
            self.current = n.name
            if self.guard is None:
                result = super().run_node(n)
            else:  # copies first, outside the guard: it counts what the graph's own ops allocate
                if n.op == "call_module" and n.target not in self.modules_cache:
                    self.modules_cache[n.target] = self.copy_module(work.module_of(n.target))
                elif n.op == "get_attr":
                    self.fetch_attr(n.target)
                with self.guard:
                    result = super().run_node(n)
            if not real and isinstance(result, torch.Tensor) and fxaccess.view_base(result) is not None:
                result = _shallow_view(n, result, self.depths)
            work.meta_of(n)["val"] = _as_meta(result) if real else result
            return result

    real = False
    try:
        mode = fxaccess.new_fake_mode()

        shared = work.fake_runs(mode)  # the run's modules that compute alike share one fake copy

        def fake_module(module: nn.Module) -> nn.Module:
            return fxaccess.fake_module_to_run(mode, module, shared)

        def fake_value(value: Any) -> Any:
            return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value

        fake_inputs = [fake_value(t) for t in example_inputs]
        with mode:
            _Run(fake_module, fake_value).run(*fake_inputs)
    except Exception:
        real = True
        try:
            def clone(value: Any) -> Any:
                return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)

            run = _Run(copy.deepcopy, clone)
            # the fake run failed, so nothing was measured: each op is sized on fake tensors before it runs
            run.guard = RealRunGuard(Budget.for_model(work.root, example_inputs), Unsized.RUN_AND_COUNT,
                                     lambda: run.current)
            inputs = [clone(t) for t in example_inputs]
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                run.run(*inputs)
        except AllocationRefused as exc:
            raise exc.again() from None
        except Exception as exc:
            raise ModelError(f"the model does not run on the example inputs: {type(exc).__name__}: {exc}") from exc
    work.has_values = True


VIEW_DEPTH = 8
"""How many views of views a fake value may be before :func:`_shallow_view` makes it one view of its base."""


def _shallow_view(node: fx.Node, value: torch.Tensor, depths: dict) -> torch.Tensor:
    """``value`` (a fake view, ``node``'s), or the same view taken from its base in one step once it is
    :data:`VIEW_DEPTH` views deep, counted along the graph (``depths``: node -> depth).

    A fake tensor's view op costs time in proportion to how many views deep its input is (torch records
    each view's replay function, chained through every view above it): a chain of 4,000 transposes took
    1.6 ms per op at its end and 8 s in all to propagate. An ``as_strided`` of the base with the view's
    sizes, strides and offset is the same tensor to everything that reads it (storage, layout, dtype,
    device, requires_grad, all compared before it is used) and starts a new chain; where any of those
    differ (a view that reinterprets the dtype, a conjugate) the view is kept as it was."""
    depth = 1 + max((depths.get(i, 0) for i in node.all_input_nodes), default=0)
    if depth < VIEW_DEPTH:
        depths[node] = depth
        return value
    try:
        shallow = fxaccess.view_base(value).as_strided(value.size(), value.stride(), value.storage_offset())
        same = shallow.dtype == value.dtype and shallow.device == value.device \
            and shallow.requires_grad == value.requires_grad and shallow.is_conj() == value.is_conj() \
            and shallow.is_neg() == value.is_neg() and shallow.layout == value.layout \
            and fxaccess.storage_key(shallow) == fxaccess.storage_key(value)
    except Exception:  # (a tensor without strides or storage: kept as it is)
        same = False
    if not same:
        depths[node] = depth
        return value
    depths[node] = 1
    return shallow


def _as_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_as_meta(v) for v in value)
    return value


# ---------------------------------------------------------------------------
# Matching with conditions and planning
# ---------------------------------------------------------------------------


def _pattern_depth(pattern: Any) -> int:
    depth, stack = 0, [(pattern, 1)]
    while stack:
        p, d = stack.pop()
        if isinstance(p, PCall):
            depth = max(depth, d)
            stack.extend((a, d + 1) for a in p.args or ())
            stack.extend((v, d + 1) for _, v in p.kwargs)
        elif isinstance(p, (PAlt, PSeq)):
            stack.extend((o, d) for o in (p.options if isinstance(p, PAlt) else p.items))
        elif isinstance(p, PBind):
            stack.append((p.inner, d))
    return depth


def _revisit_reach(programs: tuple, depth: int) -> int:
    """How many levels of users above a node a rewrite touched may hold a root whose match it changed.

    ``depth`` is the most call patterns nested in any rule (``relu(relu($x))``: 2). A rewrite touches
    nodes whose inputs changed (users of a replaced root, created nodes, re-pointed readers) and nodes
    whose users changed (the replacing value, kept and surviving matched nodes). A call pattern is at
    most ``depth - 1`` levels below its root, so a match that reads a node as a call (its inputs, or its
    users when it is an interior node: ``interior-used-outside``) is rooted at most ``depth - 1``
    levels above it. A capture is one level deeper, and what a match may read of a capture's node that
    a rewrite changes is its users (``users($x)``), its metadata, or, through a function a condition
    calls, the node itself: so ``depth`` levels, unless no rule reads a capture at all. A rule set
    whose conditions are all module flags (``not d.training``: read from the module an ``as`` name
    calls, which no rewrite changes) and that has no multi-root rule (whose other roots are found
    through the captures' users) needs ``depth - 1`` (``module_pairs`` at 5,000 nodes: 7,499 nodes
    revisited for 2,500 rewrites, against 9,997)."""
    for program in programs:
        if len(program.roots) > 1 or any(flag is None for flag in program.flags):
            return depth
    return depth - 1


class _Session:
    """One engine run over one workpiece."""

    def __init__(self, work: Workpiece, rule_set: RuleSet):
        self.work = work
        self.rule_set = rule_set
        self.compiled: CompiledRules = compile_rules(rule_set)
        self.view = GraphView(work.module_of, work.effects.module_is_known, work.hubs)
        self.depth = max((_pattern_depth(r) for p in self.compiled.programs for r in p.roots), default=1)
        self.multi_root = any(len(p.roots) > 1 for p in self.compiled.programs)
        # which touched nodes may be a further root of a multi-root rule (their siblings are revisited)
        self.further = further_roots(self.compiled.programs) if self.multi_root else None
        # the multi-root programs by their first roots: what a sibling of such a node is revisited for
        self.multi_first = (index_programs(tuple(p for p in self.compiled.programs if len(p.roots) > 1))
                            if self.multi_root else None)
        # per multi-root program (by rule index): the pairs of its first root, for the walk of a hub's users
        # that may be one (work.hubs groups them by (op, target), a module call by (op, class); a get_attr
        # first root reads nothing: it is no one's sibling)
        self.first_keys = {p.rule.index: frozenset(k for k in p.keys if k[0] != "get_attr")
                           for p in (self.multi_first.programs if self.multi_root else ())}
        self.reach = _revisit_reach(self.compiled.programs, self.depth)

    def error(self, program: Program, node: fx.Node, message: str) -> RewriteError:
        return RewriteError(message, rule=program.name, source=program.rule.source, node=node.name,
                            stack_trace=node.meta.get("stack_trace"))

    def conditions(self, match: Match) -> Optional[Any]:
        """None when every condition holds, else the first condition that does not, or the
        ``condition-raised`` :class:`Refusal` of one that raised (:func:`condition_raised`)."""
        return self.judged(match)[0]

    def judged(self, match: Match) -> tuple:
        """(what :meth:`conditions` answers, whether the conditions read what may change while the match's
        nodes stay as they are: :attr:`fxrules.engine.conditions.Evaluator.read_graph`)."""
        program = match.program
        if not program.conditions:
            return None, False
        env = match.bindings
        evaluator = None
        for condition, flag in zip(program.conditions, program.flags):
            if flag is not None:  # `not bn.training`: read from the module, when it answers plainly
                holds = flag.holds(env.names, self.work.module_of)
                if holds is True:
                    continue
                if holds is False:
                    return condition, evaluator is not None and evaluator.read_graph
            if evaluator is None:
                evaluator = Evaluator(env.captures, env.names, self.work.module_of, self.work.attr_of,
                                      program.rule.aliases, self.rule_set.resolver, self.work.effects)
            try:
                holds = evaluator.holds(condition)
            except ConditionRaised as exc:
                return condition_raised(self.rule_set, match, exc), True
            except MissingMetadata as exc:
                raise self.error(program, match.roots[0],
                                 f"a condition reads `{exc.attr}` of %{exc.node.name}, but the graph has no "
                                 f"shape/dtype metadata; pass example_inputs= to apply_rules, or a graph with "
                                 f"meta['val'] (torch.export)") from None
            except (RewriteError, RewriteLoopError):
                raise
            except Exception as exc:
                raise self.error(program, match.roots[0],
                                 f"evaluating condition at {condition.span} raised {type(exc).__name__}: {exc}") from exc
            if not holds:
                return condition, evaluator.read_graph
        return None, False

    def try_match(self, program: Program, node: fx.Node, *, explain: bool = False) -> "Match | Miss":
        try:
            return match_program(program, node, self.view, explain=explain)
        except (RewriteError, RewriteLoopError):
            raise
        except Exception as exc:
            raise self.error(program, node, f"matching raised {type(exc).__name__}: {exc}") from exc

    def match_directly(self, program: Program, node: fx.Node) -> "Match | None":
        """:meth:`try_match` without a reason for a miss (None), as the fixpoint needs it: by the program's
        direct matcher (:func:`fxrules.engine.matcher.direct_matcher`, made once per compiled rule set)
        where it has one (every single-root rule), else by the interpreter (errors reported as
        :meth:`try_match` reports them)."""
        made = self.compiled.direct
        entry = made.get(id(program))
        if entry is None or entry[0] is not program:
            entry = made[id(program)] = (program, direct_matcher(program))
        direct = entry[1]
        try:
            if direct is not None:
                return direct(node, self.view)
            result = match_program(program, node, self.view, explain=False)
        except (RewriteError, RewriteLoopError):
            raise
        except Exception as exc:
            raise self.error(program, node, f"matching raised {type(exc).__name__}: {exc}") from exc
        return None if isinstance(result, Miss) else result

    def plan(self, match: Match) -> "Plan | Refusal":
        return plan(match, self.work.effects)

    def refusal_before_edit(self, program: Program, match: Match) -> Optional[Refusal]:
        """What applying the match would refuse after the planner (a builder declining, a contract
        guard), for find_matches and explain: asked as apply_rules asks it, nothing is rewritten."""
        try:
            return refusal_before_edit(self.work, match)
        except (RewriteError, RewriteLoopError):
            raise
        except Exception as exc:
            raise self.error(program, match.roots[0],
                             f"building the replacement raised {type(exc).__name__}: {exc}") from exc

    # -- the fixpoint ------------------------------------------------------------
    def rewrite(self, max_iterations: int) -> tuple[list[Applied], list[Rejected]]:
        worklist = Worklist()
        queued: set = set()
        counter = itertools.count()
        module_of = self.work.module_of

        def push(node: fx.Node, programs: tuple, add: Callable[[tuple], None]) -> None:
            keys = None
            for program in programs:
                index = program.rule.index
                key = (index, node)
                if key in queued:  # already waiting: it will be tried as the graph is then
                    if linked_only:  # (and now whatever the links say)
                        linked_only.discard(key)
                    continue
                # The pre-check (may_match); a rule skipped here is re-examined if the node's inputs
                # change: a replaced input's users are revisited. Its common form, one call pattern
                # among the root's arguments, is a set test made here.
                if program.requires:
                    prefilter = program.prefilter
                    if prefilter is not None:
                        if keys is None:
                            keys = input_keys(node)
                        if UNHASHABLE_INPUT not in keys:
                            if prefilter.isdisjoint(keys):
                                continue
                        elif not may_match(program, node, module_of, keys):
                            continue
                    elif not may_match(program, node, module_of, keys):  # (it finds the keys if it needs them)
                        continue
                queued.add(key)
                add((index, sort_key(node), next(counter), node, program))

        # A further root made beside a hub (a node read by many) is followed through the hub's users that may
        # be a first root of its rule one at a time, in graph order (_revisit's links: (the node made, the
        # hub, the program)): each such user is queued with the link, and when it comes off the worklist the
        # next one is queued before it is tried; once the node made is gone (a match took it) the rest are
        # not tried, as they would find nothing new. Queuing them all at once made every rewrite that makes
        # the further root next to a hub try every first root there (`sin(x)` beside 1,000 `cos(neg(neg(x)))`
        # made `cos(x)` one by one: 500,000 matches, 16 s).
        chains: dict = {}  # (rule index, node) -> [links] it was queued with
        linked_only: set = set()  # the keys queued by links alone (none pushed them otherwise since)
        hubs = self.work.hubs

        def follow(link: tuple, position: Any) -> None:
            """Queue the first user of the link's hub after ``position`` that its program may root on."""
            _, hub, program = link
            keys = self.first_keys[program.rule.index]
            index = program.rule.index
            while (user := hubs.after(hub, keys, position)) is not None:
                key = (index, user)
                if key not in queued:
                    push(user, (program,), add)
                    if key in queued:
                        linked_only.add(key)
                if key in queued:
                    found = chains.get(key)
                    if found is None:
                        chains[key] = [link]
                    else:
                        found.append(link)
                    return
                position = sort_key(user)  # its pre-check says the program cannot root there: the next

        sort_key = fxaccess.sort_key
        scan = self.compiled.scan
        add_first, add = worklist.add_first, worklist.add
        for node, programs in scan(self.work.graph.nodes, module_of):  # graph order: each rule's in order
            push(node, programs, add_first)
        pop = worklist.pop
        applied: list[Applied] = []
        rejected: dict = {}
        recent: list[Program] = []  # the program of each rewrite, for a loop's error
        effects = self.work.effects
        # A node that only loses users (an input of an erased node), or only gains them (the value `-> $x` puts
        # in a root's place), changes no match's structure: a match that found the graph's shape wrong still
        # does. What it may change is a match found and then turned down (a condition on `users($x)`, an
        # interior node used outside, a guard): those wait on the nodes they read, and such a node sends back
        # only them. (Revisiting a node's users instead made a graph whose input every node reads quadratic:
        # each rewrite next to it revisited all of them; so did revisiting the users of a value that gained
        # some: 300 eval Dropouts of one input, 3.7 s at 600 nodes.) A match turned down by conditions that read
        # nothing that can change while its nodes stay (metadata, literals, module flags: Evaluator.read_graph)
        # does not wait: its answer stands until the match changes, and then its root is revisited. (800 casts
        # of one input, each turned down by `duplicate_cast`'s dtype condition, were all sent back by each
        # rewrite that gave the input a user: 2,400 nodes, 20.8 s.)
        # A multi-root rule's search for its further roots reads the captures' users, but a node losing one
        # gives it no new candidate: one it took and then saw turned down waits on the nodes it read; a new
        # candidate is a node made or rewired, revisited with its siblings (_revisit). (Not sent back: a
        # multi-root match whose first further-root candidate fitted the pattern but bound a name otherwise
        # than another root did, when that candidate is later erased and a second one would fit; such a
        # match is found by the next run.)
        # A match the planner turns down for a reason about storage (STORAGE_REFUSALS: a later write the
        # replacement would redirect, a read across a write) reads the values it bound only through their
        # storage: it waits on its own nodes as above, and on those values only for the loss of a user that may
        # view, write or return them (the workpiece's StorageWatch records one). Else each rewrite beside
        # an input that every block reads sent back every such match: per block `(x * 1).add_(1)` (mul_one
        # turned down) beside `x + 0` (rewritten), 1,600 nodes took 15.6 s. (Multi-root rules wait as before:
        # their further roots are found among the bound values' users.)
        waiting: dict = {}  # node -> [(program, the match's first root)] turned down while reading the node
        storage = self.work.storage
        on_storage = storage.waiting  # node -> [(program, first root)] waiting on its storage only

        def wait(program: Program, match: Match, own: Optional[dict] = None) -> None:
            """``match`` waits on every node it read; with ``own`` (its own nodes), on the others' storage."""
            item = (program, match.roots[0])
            for n in _nodes_read(match):
                waiters = waiting if own is None or n in own else on_storage
                found = waiters.get(n)
                if found is None:
                    waiters[n] = [item]
                else:
                    found.append(item)

        # A guard refusal that read the graph beyond the match (a stride reader below the root, the graph's
        # outputs: guards.ReadBeyond) cannot wait on all it read (the path to a reader is as long as the rest
        # of a chain): such matches are kept here and, when the worklist runs dry, the ones whose reading may
        # have lapsed since rewrites followed them are tried again (see _lapsed). Before, the next run found
        # them (a `view` below a chain rewritten into `reshape` freed an `[exact]` rule above it).
        beyond: list = []  # [rewrites applied when refused, program, first root, guards.ReadBeyond]

        while (entry := pop()) is not None or (beyond and self._lapsed(beyond, len(applied), push, add)):
            if entry is None:
                continue
            _, position, _, node, program = entry
            key = (program.rule.index, node)
            queued.discard(key)
            if chains:
                links = chains.pop(key, None)
                if links is not None:
                    live = [link for link in links if link[0].graph is not None and not fxaccess.erased(link[0])]
                    for link in live:
                        follow(link, position)
                    if key in linked_only:
                        linked_only.discard(key)
                        if not live:
                            continue
            if node.graph is None or fxaccess.erased(node):
                continue
            result = self.match_directly(program, node)
            if result is None:
                continue
            failed, read_graph = self.judged(result)
            if failed is not None:
                if isinstance(failed, Refusal):
                    rejected[_rejected_key(program, result)] = _rejected(program, result, failed)
                if read_graph:  # else its answer stands until the match changes (its root is then revisited)
                    wait(program, result)
                continue
            decision = plan(result, effects)
            if isinstance(decision, Refusal):
                rejected[_rejected_key(program, result)] = _rejected(program, result, decision)
                if decision.code in STORAGE_REFUSALS and len(program.roots) == 1:
                    wait(program, result, _own_nodes(result))
                else:
                    wait(program, result)
                continue
            try:
                outcome = apply_match(self.work, result, decision)
            except (RewriteError, RewriteLoopError):
                raise
            except Exception as exc:
                raise self.error(program, node, f"building the replacement raised {type(exc).__name__}: {exc}") from exc
            if isinstance(outcome, Refusal):  # a builder declined these modules, or a guard refused
                rejected[_rejected_key(program, result)] = _rejected(program, result, outcome)
                wait(program, result)
                read = read_beyond(self.work, result, outcome)
                if read is not None:
                    beyond.append([len(applied), program, result.roots[0], read])
                    item = (program, result.roots[0])
                    for n in read.watched():
                        waiting.setdefault(n, []).append(item)
                continue
            entry, touched, lost = outcome
            if rejected:  # a match refused earlier that now rewrites is not reported refused
                rejected.pop(_rejected_key(program, result), None)
            applied.append(entry)
            recent.append(program)
            if len(applied) > max_iterations:
                window = Counter(p.name for p in recent[-200:])
                names = [name for name, _ in window.most_common()]
                raise RewriteLoopError(
                    f"the rules did not reach a fixpoint after {max_iterations} rewrites; these kept firing: "
                    + ", ".join(f"`{n}` ({c} of the last {min(200, len(recent))})" for n, c in window.most_common())
                    + ". A rule set must not contain rules that undo each other (A -> B with B -> A) or grow the "
                      "graph forever", names)
            if waiting:
                for n in lost:
                    for program_, root in waiting.pop(n, ()):
                        if root.graph is not None and not fxaccess.erased(root):
                            push(root, (program_,), add)
            if storage.changed:
                for n in storage.take_changed():
                    for program_, root in on_storage.pop(n, ()):
                        if root.graph is not None and not fxaccess.erased(root):
                            push(root, (program_,), add)
            revisit, siblings, links = self._revisit(touched)
            for n, programs in scan(revisit, module_of):  # the nodes some rule roots on
                push(n, programs, add)
            if siblings:
                for n, programs in self.multi_first.scan(siblings, module_of):
                    push(n, programs, add)
            if links:
                for link in links:
                    follow(link, None)
        return applied, list(rejected.values())

    def _lapsed(self, beyond: list, applied: int, push: Callable, add: Callable) -> bool:
        """Send back each match of ``beyond`` (see :meth:`rewrite`) refused before the last rewrite whose
        refusal may have lapsed (:meth:`ReadBeyond.may_have_lapsed`); keep the others, as of now. Whether one
        was sent back. A match sent back that is refused again comes back to the list: the sweeps end with a
        round that rewrites nothing after them."""
        kept = []
        sent = False
        work = self.work
        for entry in beyond:
            at, program, root, read = entry
            if fxaccess.erased(root) or root.graph is None:
                continue
            if at != applied:
                if read.may_have_lapsed(work):
                    push(root, (program,), add)
                    sent = True
                    continue
                entry[0] = applied
            kept.append(entry)
        beyond[:] = kept
        return sent

    def _revisit(self, touched: Iterable[fx.Node]) -> tuple[set, set, list]:
        """What a rewrite that touched ``touched`` sends back:

        - for every rule: the touched nodes and their users up to :func:`_revisit_reach` levels;
        - for the multi-root rules only, around a touched node that may be a further root of one: the other
          users of its inputs (siblings), which may be the first root of a match that now finds it. Only
          those rules: a sibling's own single-root matches are unchanged by a node made beside it (sending
          them back made each rewrite of a multi-root rule next to a value read by many re-plan every match
          turned down among its users: a looping `sin, cos -> cos, sin` beside refused rewrites over shared
          inputs, 6 ms a rewrite at 1,200 nodes);
        - where such an input is a hub (read by many), links ``(node, hub, program)`` instead, one per program
          whose further root the node may be: the driver follows each through the hub's users that may be
          the program's first root, one at a time (see :meth:`rewrite`).
        """
        found: set = set()
        siblings: Any = _NO_NODES
        links: Any = ()
        frontier = [n for n in touched if not fxaccess.erased(n)]
        found.update(frontier)
        if self.multi_root:
            siblings, links = set(), []
            # Only the touched nodes that may be a further root: in a graph whose input has thousands of
            # users, every rewrite next to it would otherwise revisit them all (quadratic)
            further = self.further
            if further is None:
                sources = [(n, self.multi_first.programs) for n in frontier]
            else:
                sources = list(further.scan(frontier, self.work.module_of))
            for n, programs in sources:
                for inp in n.all_input_nodes:
                    if len(inp.users) < HUB:
                        siblings.update(inp.users)
                    else:
                        links.extend((n, inp, program) for program in programs)
        for _ in range(self.reach):
            nxt = []
            for n in frontier:
                for user in n.users:
                    if user not in found:
                        found.add(user)
                        nxt.append(user)
            frontier = nxt
            if not frontier:
                break
        return found, siblings - found if siblings else _NO_NODES, links


_NO_NODES: frozenset = frozenset()
"""What :meth:`_Session._revisit` answers for siblings when there are none (a run without multi-root rules
makes no set per rewrite for them)."""


def _own_nodes(match: Match) -> dict:
    """The match's own nodes among those it read: roots, matched nodes and get_attr nodes (not the values
    its captures and names bound outside it)."""
    found = dict.fromkeys(match.roots)
    bindings = match.bindings
    found.update(bindings.nodes)
    found.update(bindings.attrs)
    return found


def _nodes_read(match: Match) -> dict:
    """The nodes a match read: its own (:func:`_own_nodes`) and the nodes its captures and names bound (in
    lists and tuples too), as an ordered set."""
    found = _own_nodes(match)
    bindings = match.bindings
    fx.node.map_arg((list(bindings.captures.values()), list(bindings.names.values())),
                    lambda n: found.setdefault(n, None))
    return found


def condition_raised(rule_set: RuleSet, match: Match, raised: ConditionRaised) -> Refusal:
    """The refusal of a match whose condition raised: the condition, quoted, and the error."""
    condition = _quoted(rule_set, raised.cond.span)
    root = match.roots[0]
    return Refusal(RefusalCode.CONDITION_RAISED,
                   f"the condition {condition or f'at {raised.cond.span}'} raised {raised}", (root.name,))


def _rejected_key(program: Program, match: Match) -> tuple:
    """What identifies a refused match across the fixpoint's retries: the rule and the roots' names."""
    return program.rule.index, tuple([n.name for n in match.roots])


def _rejected(program: Program, match: Match, refusal: Refusal) -> Rejected:
    return Rejected(program.name, program.rule.source, tuple(n.name for n in match.nodes), refusal.message,
                    code=refusal.code, nodes=refusal.nodes)


# ---------------------------------------------------------------------------
# Entry points (wrapped by fxrules.api, which holds fxrules.lang.runtime.entered around them:
# the copy, the rewrite and the commit allocate a node, dicts and strings per graph node, all kept
# alive, and matching recurses per pattern nesting level)
# ---------------------------------------------------------------------------


def count_nodes(graph: fx.Graph) -> int:
    return len(graph.nodes)


@dataclass(frozen=True, slots=True)
class Copying:
    """Where a run's result goes by default: a new GraphModule around a copy of the graph; the
    caller's model is never written, and a failed run just drops its copy."""

    def prepare(self, model: Any, *, example_inputs, tracer, concrete_args) -> Workpiece:
        return prepare(model, tracer=tracer, concrete_args=concrete_args, example_inputs=example_inputs)

    def commit(self, work: Workpiece) -> fx.GraphModule:
        return work.commit()

    def abandon(self, work: Workpiece) -> None:
        pass


@dataclass(frozen=True, slots=True)
class InPlace:
    """The caller's GraphModule itself, edited under an undo log (:class:`fxrules.engine.transaction.Journal`)
    and recompiled; a failed run, recompile included, is rolled back."""

    def prepare(self, model: Any, *, example_inputs, tracer, concrete_args) -> Workpiece:
        if tracer is not None or concrete_args is not None:
            raise ModelError("inplace=True rewrites a GraphModule as it is: tracer and concrete_args do not apply")
        return prepare_in_place(model, example_inputs=example_inputs)

    def commit(self, work: Workpiece) -> fx.GraphModule:
        return work.commit_in_place()

    def abandon(self, work: Workpiece) -> None:
        work.journal.rollback()


COPYING = Copying()
IN_PLACE = InPlace()
Destination = Union[Copying, InPlace]


def run_apply(model: Any, rule_set: RuleSet, *, example_inputs=None, max_iterations: Optional[int] = None,
              tracer=None, concrete_args=None, destination: Destination = COPYING) -> RewriteResult:
    start = time.perf_counter()
    work = destination.prepare(model, example_inputs=example_inputs, tracer=tracer, concrete_args=concrete_args)
    try:
        before = count_nodes(work.graph)
        session = _Session(work, rule_set)
        limit = max_iterations if max_iterations is not None else 10_000 + 10 * before
        applied, rejected = session.rewrite(limit)
        try:
            module = destination.commit(work)
        except FxrulesError:
            raise
        except Exception as exc:
            raise ModelError(f"the rewritten graph does not compile: {type(exc).__name__}: {exc}") from exc
    except BaseException:  # KeyboardInterrupt too: the caller's model goes back as it was
        destination.abandon(work)
        raise
    finally:
        work.close()  # freed now by reference counting, not left to the cyclic collector
    report = Report(tuple(applied), tuple(rejected), before, count_nodes(module.graph),
                    time.perf_counter() - start, tuple(work.notes))
    return RewriteResult(module, report, report.counts)


def run_find(model: Any, rule_set: RuleSet, *, example_inputs=None, tracer=None, concrete_args=None) -> list[MatchInfo]:
    work = prepare(model, tracer=tracer, concrete_args=concrete_args, example_inputs=example_inputs)
    session = _Session(work, rule_set)
    found: list[MatchInfo] = []
    for node in work.graph.nodes:
        keys = input_keys(node)
        for program in session.compiled.candidates(node, work.module_of):
            if program.requires and not may_match(program, node, work.module_of, keys):
                continue
            result = session.try_match(program, node)
            if isinstance(result, Miss):
                continue
            failed = session.conditions(result)
            if failed is not None and not isinstance(failed, Refusal):
                continue
            decision = failed if failed is not None else session.plan(result)
            refusal = decision if isinstance(decision, Refusal) else session.refusal_before_edit(program, result)
            found.append(MatchInfo(program.name, program.rule.source, tuple(n.name for n in result.roots),
                                   tuple(n.name for n in result.nodes),
                                   {k: (v.name if isinstance(v, fx.Node) else v)
                                    for k, v in result.bindings.captures.items()},
                                   None if refusal is None else refusal.message,
                                   None if refusal is None else refusal.code))
    return found


def _condition_false(rule_set: RuleSet, span) -> str:
    """The near-miss reason for a false condition, quoting it from the rule file when its text is known."""
    quoted = _quoted(rule_set, span)
    if quoted:
        return f"the pattern matched, but the condition {quoted} is false"
    return "the pattern matched, but this condition is false"


def _quoted(rule_set: RuleSet, span) -> str:
    """```text``` of a one-line span of a rule file whose text is known; empty otherwise."""
    text = rule_set.sources.get(span.path)
    lines = text.split("\n") if text is not None else []
    if span.line == span.end_line and 1 <= span.line <= len(lines):
        quoted = lines[span.line - 1][span.column - 1:span.end_column - 1].strip()
        if quoted:
            return f"`{quoted}`"
    return ""


def run_explain(model: Any, rule_set: RuleSet, *, rule: Optional[str] = None, example_inputs=None, tracer=None,
                concrete_args=None) -> list[NearMiss]:
    if rule is not None:
        rule_set = rule_set.select(names=[rule])
    work = prepare(model, tracer=tracer, concrete_args=concrete_args, example_inputs=example_inputs)
    session = _Session(work, rule_set)
    misses: list[NearMiss] = []
    for node in work.graph.nodes:
        for program in session.compiled.candidates(node, work.module_of):
            result = session.try_match(program, node, explain=True)
            trace = node.meta.get("stack_trace")
            if isinstance(result, Miss):
                misses.append(NearMiss(program.name, str(result.span), node.name, result.reason, result.depth, trace,
                                       code=result.code))
                continue
            failed = session.conditions(result)
            if isinstance(failed, Refusal):
                misses.append(NearMiss(program.name, str(program.rule.span), node.name,
                                       f"the pattern matched, but the rewrite is refused: {failed.message}", 1 << 21,
                                       trace, code=failed.code))
                continue
            if failed is not None:
                misses.append(NearMiss(program.name, str(failed.span), node.name,
                                       _condition_false(rule_set, failed.span), 1 << 20, trace,
                                       code=MissCode.CONDITION_FALSE))
                continue
            decision = session.plan(result)
            if not isinstance(decision, Refusal):
                decision = session.refusal_before_edit(program, result)
            if isinstance(decision, Refusal):
                misses.append(NearMiss(program.name, str(program.rule.span), node.name,
                                       f"the pattern matched, but the rewrite is refused: {decision.message}", 1 << 21,
                                       trace, code=decision.code))
    return misses
