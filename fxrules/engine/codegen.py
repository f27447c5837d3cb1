"""The Python source of a graph's ``forward``: the text torch.fx writes, written in a third of the time.

A recompile is most of an fxrules run: at 20,000 nodes ``GraphModule.recompile`` takes about
580 ms, of which ``Graph.python_code`` (writing the source) is 260 ms and Python's ``compile`` of
that source most of the rest. torch.fx's writer is general (verbose annotations, coloured output,
profiler records, pytree signatures, opaque objects) and pays for that generality on every node: it
re-points every node's ``repr`` at a fresh namespace and back (two ``Node.__setattr__`` each),
writes a ``# COUNTER`` line per node and parses them out again with a regular expression, and asks
each argument a chain of ``isinstance`` questions.

:func:`python_code` writes the same :class:`~torch.fx.graph.PythonCode` (the same source text, the
same globals bound to the same objects, the same line map) for the graphs fxrules commits, and
answers None for anything it was not written for, so that the caller uses torch's own writer:

- the graph's code generator must be exactly :class:`torch.fx.graph.CodeGen` or the pytree one
  (``_PyTreeCodeGen``, of torch.export's modules), with no body transformer: not any other
  subclass, whose methods may write differently;
- no ``FX_GRAPH_SHOW_META`` (torch then writes every node's metadata into the source);
- every argument is a node, a plain value (``int``, ``float``, ``complex``, ``bool``, ``str``,
  ``None``, ``...``, a dtype, device, memory format or layout), an operator overload, or a tuple, list, slice or dict of
  those (no operator inside a dict); no type annotation is generic (``list[int]``) or a union.
  Anything else (a named tuple, an enum, a tensor constant, a generic annotation, a subclass of
  any of these types, ...) makes the whole graph torch's.

The names are made exactly as torch makes them: by a fresh :class:`torch.fx.graph._Namespace`,
asked for each node and each global in the order torch's writer asks, so a node whose name
collides with a global (a placeholder called ``torch``) is renamed identically.

Faithfulness is a tested contract, not a hope: the test suite writes every graph it commits with
both writers and requires equal results (``tests/engine/test_codegen.py`` and the session-wide
cross-check in ``tests/conftest.py``), and a hypothesis property does the same on random graphs.
The writer reads torch.fx's private helpers (``_Namespace``, ``_format_target``,
``_get_qualified_name``, ``_is_from_torch``, the operator tables), so it is used only where
:data:`fxrules.engine.fxaccess.FAST` says the torch release is one it was written for.
"""

from __future__ import annotations

import os
import types
from typing import Any, Optional

import torch
from torch import fx
from torch.fx import graph as _fxgraph
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.fx.node import Node

_PLAIN_VALUES = frozenset({int, float, complex, bool, str, type(None), type(Ellipsis), torch.dtype, torch.device,
                           torch.memory_format, torch.layout})
"""Argument types written as ``repr(value)``, as torch.fx's writer writes them (none is an opaque
value type; a test checks that against torch's registry)."""

_CODE_GENERATORS = frozenset({_fxgraph.CodeGen, _fxgraph._PyTreeCodeGen})
"""The code generators whose ``_gen_python_code`` this writer stands in for: torch.fx's plain one and
the pytree one of ``symbolic_trace(concrete_args=...)`` and torch.export's modules (which writes
the same body and its own signature and return, asked of it here as torch asks them)."""

_OPERATORS = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
"""Arguments written as a global naming the operator (torch.export's graphs pass them)."""


def python_code(graph: fx.Graph) -> Optional[_fxgraph.PythonCode]:
    """``graph.python_code(root_module="self")`` for a graph this writer handles (see the module's
    docstring), or None, and then the caller uses torch's writer."""
    codegen = graph._codegen
    if type(codegen) not in _CODE_GENERATORS or codegen._body_transformer is not None:
        return None
    if os.environ.get("FX_GRAPH_SHOW_META", "0") == "1":
        return None
    return _Writer(codegen).write(graph.nodes)


def unique_name(namespace: _fxgraph._Namespace, candidate: str, obj: Any) -> str:
    """``namespace.create_name(candidate, obj)``: the same name and the same namespace state, without
    torch's regular expressions for the names a graph makes most: an ASCII identifier (every node name a
    graph's own namespace hands out, which the source writer names again) and a module path of such
    parts (``layer1.0.conv1``: the base name of a new ``call_module`` node, which torch first rewrites
    to ``layer1_0_conv1``). Anything else goes to ``create_name``.

    torch's pattern ``([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\\d+))?`` splits an identifier at its last ``_``
    when digits alone follow it and something precedes it, else not at all; its substitution turns
    each run of characters outside ``[0-9a-zA-Z_]`` into one ``_`` and puts ``_`` before a leading
    digit. Torch's ``Graph.create_node`` asks with ``obj=None``; the source writer with the node."""
    known = namespace._obj_to_name
    if obj is not None and obj in known:
        return known[obj]
    if not candidate.isascii():
        return namespace.create_name(candidate, obj)
    if not candidate.isidentifier():
        parts = candidate.split(".")
        if len(parts) == 1 or not all(p.isidentifier() or p.isdigit() for p in parts):
            return namespace.create_name(candidate, obj)
        candidate = "_".join(parts)
        if candidate[0].isdigit():
            candidate = "_" + candidate
    head, _, tail = candidate.rpartition("_")
    if head and tail.isdigit():
        base, number = head, tail
    else:
        base, number = candidate, None
    used, counts = namespace._used_names, namespace._base_count
    if number is None or candidate in used:
        count = counts.get(base, 0)
        if _fxgraph._illegal_names.get(candidate, obj) is not obj:
            count += 1
            candidate = f"{base}_{count}"
    else:
        count = int(number)
    while candidate in used:
        count += 1
        candidate = f"{base}_{count}"
    used.add(candidate)
    counts[base] = count
    if obj is not None:
        known[obj] = candidate
    return candidate


class _Unsupported(Exception):
    """Raised inside :class:`_Writer` only, at the first thing it does not write; caught by
    :meth:`_Writer.write`, which then answers None. (Checking every argument in a pass of its own
    first would cost as much as writing it.)"""


class _Writer:
    """One use: the source of one graph, in torch.fx's order of naming."""

    __slots__ = ("codegen", "namespace", "globals", "names")

    def __init__(self, codegen: _fxgraph.CodeGen):
        self.codegen = codegen
        self.namespace = _fxgraph._Namespace()
        self.globals: dict = {}
        self.names: dict = {}  # node -> its name in the source

    # -- names -------------------------------------------------------------------------
    def add_global(self, hint: str, obj: Any) -> str:
        """The name the source uses for ``obj``: torch's own qualified name for torch objects
        (reached through the ``torch`` global), else a global of the namespace."""
        if _fxgraph._is_from_torch(obj) and obj != torch.device:
            return _fxgraph._get_qualified_name(obj)
        name = self.namespace.create_name(hint, obj)
        bound = self.globals.get(name, _NOTHING)
        if bound is _NOTHING:
            self.globals[name] = obj
        elif bound != obj:
            raise AssertionError(f"Global name {name} already assigned to different object")
        return name

    def name(self, node: Node) -> str:
        name = self.names.get(node)
        if name is None:
            name = self.names[node] = self.node_name(node)
        return name

    def node_name(self, node: Node) -> str:
        """``self.namespace.create_name(node.name, node)`` (:func:`unique_name`). Asked once per node of
        every graph written (a fifth of the writer's time, through torch's)."""
        return unique_name(self.namespace, node.name, node)

    def annotation(self, kind: Any) -> str:
        """An annotation's text (``type_repr`` in torch's writer) for one that is not generic (no
        ``__origin__``) nor a union: a class, or a string from ``from __future__ import
        annotations``, becomes a global."""
        if kind == ():
            return "()"
        if isinstance(kind, types.UnionType) or getattr(kind, "__origin__", None) is not None:
            raise _Unsupported
        return self.add_global(_fxgraph._type_repr(kind), kind)

    # -- values ------------------------------------------------------------------------
    def value(self, arg: Any) -> str:
        """An argument as torch's writer writes it (``_get_repr``)."""
        kind = type(arg)
        if kind is Node:
            name = self.names.get(arg)
            return name if name is not None else self.name(arg)
        if kind in _PLAIN_VALUES:
            return repr(arg)
        if kind in _SEQUENCES:
            return _sequence(arg, kind, self.value)
        if kind is slice:
            return f"slice({self.value(arg.start)}, {self.value(arg.stop)}, {self.value(arg.step)})"
        if isinstance(arg, _OPERATORS):
            return self.add_global(_fxgraph._get_qualified_name(arg), arg)
        if kind is dict or kind is immutable_dict:  # torch writes ``repr(arg)``, nodes by their names
            return self.literal(arg)
        raise _Unsupported

    def literal(self, arg: Any) -> str:
        """``repr(arg)`` with each node written as its name: how torch's writer writes a dictionary
        (a model returning a dict, say), whose items it does not look into. Tuples and lists are
        written as Python writes them, which is also how :meth:`value` writes them; an operator
        inside (Python's ``repr`` of it, not a global) is left to torch."""
        kind = type(arg)
        if kind is Node:
            return self.value(arg)
        if kind in _PLAIN_VALUES:
            return repr(arg)
        if kind in _SEQUENCES:
            return _sequence(arg, kind, self.literal)
        if kind is dict or kind is immutable_dict:
            return "{" + ", ".join([f"{self.literal(k)}: {self.literal(v)}" for k, v in arg.items()]) + "}"
        raise _Unsupported

    def arguments(self, args: tuple, kwargs: dict) -> str:
        value = self.value
        parts = [value(a) for a in args]
        if kwargs:
            parts.extend([f"{k} = {value(v)}" for k, v in kwargs.items()])
        return ", ".join(parts)

    def spelling(self, target: Any) -> tuple:
        """How a call of ``target`` is written: ``(_MAGIC, format)`` for an operator written as an
        expression (``{} + {}``), ``(_INPLACE, format)`` for an in-place one (``{} += {}``), else
        ``(_CALL, the global naming it)``; asked at its first call, where torch's writer adds that
        global, and kept for the rest."""
        name = getattr(target, "__name__", None) if getattr(target, "__module__", "") == "_operator" else None
        if name in _fxgraph.magic_methods:
            return _MAGIC, _fxgraph.magic_methods[name]
        if name in _fxgraph.inplace_methods:
            return _INPLACE, _fxgraph.inplace_methods[name]
        return _CALL, self.add_global(_fxgraph._get_qualified_name(target), target)

    # -- the function ----------------------------------------------------------------------
    def write(self, nodes: Any) -> Optional[_fxgraph.PythonCode]:
        try:
            return self._write(nodes)
        except _Unsupported:
            return None

    def _write(self, nodes: Any) -> _fxgraph.PythonCode:
        if not nodes:
            raise _Unsupported  # torch writes ``pass`` and maps its lines to no node
        for hint, (_, obj) in _fxgraph._custom_builtins.items():
            self.add_global(hint, obj)

        last_uses: dict = {}  # node -> the nodes whose last reader it is, in torch's order
        seen: set = set()
        for node in reversed(nodes):
            for used in node._input_nodes:
                if used not in seen:
                    seen.add(used)
                    bucket = last_uses.get(node)
                    if bucket is None:
                        last_uses[node] = [used]
                    else:
                        bucket.append(used)

        spelled: dict = {}  # call_function target -> its spelling (see :meth:`spelling`)
        format_target = _fxgraph._format_target
        free_vars: list = []
        chunks: list = []  # (node index, text): the text of each node, newline-terminated
        returns = ""
        wrapped: dict = {}
        name, value, arguments = self.name, self.value, self.arguments
        names, node_name = self.names, self.node_name
        for index, node in enumerate(nodes):
            op = node.op
            kind = node.type
            typed = "" if kind is None else f" : {self.annotation(kind)}"
            if op == "placeholder":
                default = f" = {value(node.args[0])}" if node.args else ""
                free_vars.append(f"{node.target}{typed}{default}")
                raw = node.target.replace("*", "")
                own = names[node] = node_name(node)
                if raw != own:
                    chunks.append((index, f"{own} = {raw}\n"))
                continue
            if op == "call_function":
                target = node.target
                try:
                    how = spelled.get(target)
                except TypeError:  # an unhashable callable
                    raise _Unsupported from None
                if how is None:
                    how = spelled[target] = self.spelling(target)
                form, text = how
                args = node._args
                if form is _MAGIC:
                    own = names[node] = node_name(node)
                    line = f"{own}{typed} = {text.format(*[value(a) for a in args])}"
                elif form is _INPLACE:
                    line = (f"{text.format(*[value(a) for a in args])};  "
                            f"{name(node)}{typed} = {value(args[0])}")
                else:
                    own = names[node] = node_name(node)
                    if text == "getattr" and len(args) == 2 and isinstance(args[1], str) \
                            and args[1].isidentifier():
                        line = f"{own}{typed} = {format_target(value(args[0]), args[1])}"
                    else:
                        line = f"{own}{typed} = {text}({arguments(args, node._kwargs)})"
                        if node.meta.get("is_wrapped", False):
                            wrapped.setdefault(text)
            elif op == "call_method":
                own = names[node] = node_name(node)
                args = node._args
                line = (f"{own}{typed} = {format_target(value(args[0]), node.target)}"
                        f"({arguments(args[1:], node._kwargs)})")
            elif op == "call_module":
                own = names[node] = node_name(node)
                line = f"{own}{typed} = {format_target('self', node.target)}({arguments(node._args, node._kwargs)})"
            elif op == "get_attr":
                own = names[node] = node_name(node)
                line = f"{own}{typed} = {format_target('self', node.target)}"
            elif op == "output":
                if kind is not None:
                    returns = f" -> {self.annotation(kind)}"
                ret = self.codegen._call_method_with_signature_check(
                    self.codegen.generate_output, node.args[0], descs=None, repr_fn=value)
                chunks.append((index, ret + "\n"))
                continue
            else:
                raise _Unsupported
            dead = last_uses.get(node)
            if not node.users:
                dead = [*dead, node] if dead else [node]
            if dead:
                chunks.append((index, f"{line};  {' = '.join([name(n) for n in dead])} = None\n"))
            else:
                chunks.append((index, line + "\n"))

        if wrapped:
            wrap = self.add_global("wrap", torch.fx.wrap)
            wrap_statements = "\n".join([f'{wrap}("{function}")' for function in wrapped])
        else:
            wrap_statements = ""
        for hint, obj in self.codegen.additional_globals():
            self.add_global(hint, obj)
        prologue = self.codegen._call_method_with_signature_check(
            self.codegen.gen_fn_def, free_vars, returns, expanded_def=False)
        return self._assemble(chunks, len(nodes), prologue, wrap_statements)

    def _assemble(self, chunks: list, count: int, prologue: str, wrap_statements: str) -> _fxgraph.PythonCode:
        """Lines, line map and function text, as torch's writer leaves them once it has taken its
        ``# COUNTER`` lines out again: each line maps to the index of the node that wrote it; the
        text after the last node's newline is an empty line mapped to the last node."""
        first = prologue.count("\n") + 1
        lines: list = []  # each body line, indented as torch indents it
        line_map: dict = {}
        for index, text in chunks:
            body = text[:-1]
            if "\n" in body:
                for line in body.split("\n"):
                    line_map[len(lines) + first] = index
                    lines.append("    " + line)
            else:
                line_map[len(lines) + first] = index
                lines.append("    " + body)
        line_map[len(lines) + first] = count - 1 if count else None
        lines.append("    ")
        # torch strips the body's leading empty lines (``lstrip("\n")`` before indenting): all but the last
        start = 0
        while start < len(lines) - 1 and lines[start] == "    ":
            start += 1
        code = "\n".join(lines[start:] if start else lines)
        source = f"\n{wrap_statements}\n\n{prologue}\n{code}"
        return _fxgraph.PythonCode(source, self.globals, _lineno_map=line_map,
                                   _prologue_start=wrap_statements.count("\n") + 4)


def _sequence(arg: Any, kind: type, write: Any) -> str:
    """A tuple or list, each item written by ``write`` (a one-item tuple keeps its comma)."""
    if kind is tuple:
        return f"({write(arg[0])},)" if len(arg) == 1 else "(" + ", ".join([write(a) for a in arg]) + ")"
    return "[" + ", ".join([write(a) for a in arg]) + "]"


_SEQUENCES = frozenset({tuple, list, immutable_list})

_NOTHING = object()
_MAGIC, _INPLACE, _CALL = "magic", "inplace", "call"
