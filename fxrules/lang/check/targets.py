"""Names in rules: every dotted target, constant, method, module type and builder, through the Resolver.

All resolution goes through :class:`fxrules.lang.names.Resolver`, under its import policy; a
failed resolution becomes one diagnostic (:func:`report_resolution`), with the policy's own code
when the policy refused it. With torch importable, method names, module types and constructor
arguments are checked against torch itself (through the shipped torch index,
:mod:`fxrules.lang.torch_index`, where it answers: then torch is not imported); without it they
are left for the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Container, Optional

import fxrules.lang.ast as A
from fxrules.lang import allowlist, torch_index
from fxrules.lang.allowlist import Position
from fxrules.lang.check.reporter import Reporter, closest, did_you_mean
from fxrules.lang.check.scope import Aliases
from fxrules.lang.names import BUILTIN_ALIASES, Resolution, Resolver, builtin_path
from fxrules.lang.torch_index import Facts, Kind

NEVER_CREATED = frozenset({
    "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.type", "builtins.vars",
    "operator.attrgetter", "operator.methodcaller", "operator.call", "operator.itemgetter",
})
"""Targets a replacement may not create (nor a condition call): with them a rule could reach any
attribute or callable at run time."""

POLICY_CODES = frozenset({"import-not-allowed", "forbidden-target", "unknown-alias", "not-allowed"})
"""Resolution failures reported under their own code, whatever the name was used for."""


def report_resolution(reporter: Reporter, resolver: Resolver, span: A.Span, resolution: Resolution, code: str,
                      reported_aliases: Container[str]) -> None:
    """Turn a failed resolution into a diagnostic: its own code for policy errors, else ``code``.

    An unknown alias whose ``use`` line was reported already (in ``reported_aliases``) is not
    reported again."""
    if resolution.status == "unknown-alias":
        head = resolution.path.split(".", 1)[0]
        if head in reported_aliases:
            return
    status = resolution.status if resolution.status in POLICY_CODES else code
    notes = []
    if status == code:
        suggestion = _suggest(resolution.path, resolver)
        if suggestion:
            notes.append(f"did you mean `{suggestion}`?")
    reporter.error(span, status, resolution.message, notes=notes)


@dataclass(frozen=True, slots=True)
class Targets:
    """Checks the names one rule uses, under the file's aliases at that rule."""

    reporter: Reporter
    resolver: Resolver
    aliases: Aliases
    torch: bool  # whether torch is importable: methods and module types are checked against it

    def resolve(self, path: str) -> Resolution:
        """The name's status and, when ``ok``, its ``facts`` (:meth:`Resolver.look_up`: no torch import where
        the index answers)."""
        return self.resolver.look_up(path)

    def report(self, span: A.Span, resolution: Resolution, code: str) -> None:
        report_resolution(self.reporter, self.resolver, span, resolution, code, self.aliases.reported)

    def refused(self, span: A.Span, refusal: Optional[str]) -> bool:
        """Report an allow-list refusal (:mod:`fxrules.lang.allowlist`) as ``not-allowed``; whether there was one."""
        if refusal is None:
            return False
        self.reporter.error(span, "not-allowed", refusal,
                            notes=["see SECURITY.md: rule files name only what the allow-list permits"])
        return True

    def constant(self, dotted: A.Dotted) -> None:
        """A dotted constant (``torch.float32``) must resolve, and be on the allow-list."""
        if self.aliases.is_reported(dotted):
            return
        path = self.aliases.full_path(dotted)
        resolution = self.resolve(path)
        if resolution.is_error:
            self.report(dotted.span, resolution, "unknown-target")
        else:
            self.refused(dotted.span, allowlist.refuse_constant(path, self.resolver.packages))

    def function_target(self, target: A.Dotted, position: Position) -> None:
        """A call_function target: a safe builtin by bare name, else a dotted path to a callable;
        on the allow-list for ``position``."""
        if self.aliases.is_reported(target):
            return
        head = target.parts[0]
        if len(target.parts) == 1 and head not in self.aliases.paths and head not in BUILTIN_ALIASES:
            path = builtin_path(head)
            if path is None:
                self.unknown_bare_function(target)
                return
        else:
            path = self.aliases.full_path(target)
        resolution = self.resolve(path)
        if resolution.is_error:
            self.report(target.span, resolution, "unknown-target")
        elif self.refused(target.span, allowlist.refuse_function(path, position, self.resolver.packages)):
            return
        elif resolution.ok and not resolution.facts.is_callable:
            self.reporter.error(target.span, "unknown-target", f"`{path}` is not callable")

    def literal_call(self, call: A.Call, position: Position) -> None:
        """A builtins/operator/math call on literals only (:func:`fxrules.lang.allowlist.refuse_literal_call`);
        once per target: a function the allow-list refuses is reported by :meth:`function_target`."""
        target = call.target
        head = target.parts[0]
        if len(target.parts) == 1 and head not in self.aliases.paths and head not in BUILTIN_ALIASES:
            path = builtin_path(head) or target.text
        else:
            path = self.aliases.full_path(target)
        if allowlist.function_allowed(path, position, self.resolver.packages):
            self.refused(target.span, allowlist.refuse_literal_call(path, call))

    def unknown_bare_function(self, target: A.Dotted) -> None:
        notes = []
        if self.torch:
            import torch

            if hasattr(torch, target.parts[0]):
                notes.append(f"did you mean `torch.{target.parts[0]}`?")
        self.reporter.error(target.span, "unknown-target",
                            f"`{target.text}` is not a known function; name it by its dotted path",
                            notes=notes or ["for example `torch.relu`, `F.gelu`, `operator.add` or `aten.mm.default`"])

    def method_target(self, target: A.Dotted, position: Position) -> None:
        """A call_method name must be on the allow-list for ``position``, and a method of
        ``torch.Tensor`` (checked only with torch, first, so a typo gets its suggestion)."""
        name = target.parts[0]
        if not self.torch:
            self.refused(target.span, allowlist.refuse_method(name, position))
            return
        if torch_index.tensor_has(name):
            self.refused(target.span, allowlist.refuse_method(name, position))
            return
        import torch  # a miss of the index: a name it does not hold, or another torch

        if not hasattr(torch.Tensor, name):
            self.reporter.error(target.span, "unknown-method", f"`torch.Tensor` has no method `{name}`",
                                notes=did_you_mean(name, [n for n in dir(torch.Tensor) if not n.startswith("_")]))
            return
        self.refused(target.span, allowlist.refuse_method(name, position))

    def module_type(self, target: A.Dotted) -> Optional[Facts]:
        """The module class's facts, or None when it cannot be resolved (reported) or torch is missing."""
        if self.aliases.is_reported(target):
            return None
        if len(target.parts) == 1 and target.parts[0] not in self.aliases.paths:
            path = "torch.nn." + target.parts[0]
        else:
            path = self.aliases.full_path(target)
        resolution = self.resolve(path)
        if resolution.is_error:
            self.report(target.span, resolution, "unknown-module-type")
            return None
        if resolution.ok and resolution.facts.kind is not Kind.MODULE_CLASS:
            self.reporter.error(target.span, "unknown-module-type", f"`{path}` is not an nn.Module subclass")
            return None
        if self.refused(target.span, allowlist.refuse_module_type(path, self.resolver.packages)) or not resolution.ok:
            return None
        return resolution.facts

    def module_attribute(self, keyword: A.Keyword, module_class: Optional[Facts], *, matched: bool) -> None:
        """An attribute (``matched``: of a matched module, which also has ``training``) or a constructor
        argument must be a parameter of the module class's constructor."""
        constructor = None if module_class is None else module_class.constructor
        if constructor is None:
            return
        allowed = set(constructor.parameters)
        if matched:
            allowed.add("training")
        if keyword.name not in allowed:
            self.reporter.error(keyword.span, "unknown-attribute",
                                f"`{module_class.name}` has no constructor argument `{keyword.name}`",
                                notes=[f"it takes: {', '.join(sorted(allowed))}"]
                                + did_you_mean(keyword.name, sorted(allowed)))

    def constructor_arguments(self, call: A.Call, module_class: Optional[Facts], code: str) -> None:
        """Constructing ``TYPE{...}`` must supply every required constructor argument."""
        constructor = None if module_class is None else module_class.constructor
        if constructor is None:
            return
        given = {k.name for k in call.attrs or ()}
        missing = [name for name in constructor.required if name not in given]
        if missing:
            self.reporter.error(
                call.span, code,
                f"constructing `{module_class.name}` needs {', '.join('`' + m + '`' for m in missing)}",
                notes=[f"write `call_module {call.target.text}{{{', '.join(m + '=...' for m in missing)}}}(...)`"])

    def builder(self, target: A.Dotted) -> None:
        """A module builder must resolve to a function (not a class)."""
        path = self.aliases.full_path(target)
        resolution = self.resolve(path)
        if resolution.is_error:
            self.report(target.span, resolution, "unknown-builder")
        elif resolution.ok and (resolution.facts.kind in (Kind.CLASS, Kind.MODULE_CLASS)
                                or not resolution.facts.is_callable):
            self.reporter.error(target.span, "unknown-builder", f"`{path}` is not a builder function",
                                notes=["a builder is a function taking matched modules and returning a new nn.Module"])
        else:
            self.refused(target.span, allowlist.refuse_builder(path, self.resolver.packages))


def _suggest(path: str, resolver: Resolver) -> Optional[str]:
    owner, _, last = path.rpartition(".")
    if not owner:
        return None
    resolution = resolver.resolve(owner)
    if not resolution.ok:
        return None
    try:
        candidates = [n for n in dir(resolution.value) if not n.startswith("_")]
    except Exception:
        return None
    close = closest(last, candidates)
    return f"{owner}.{close}" if close else None
