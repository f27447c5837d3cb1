"""fxrules: declarative, checked, fast rewrite rules for torch.fx graphs.

Importing fxrules does not import torch: the front end (``load_rules``,
``parse_rules``, ``fxrules check``) works without it. The engine
(``apply_rules``, ``find_matches``, ``explain``, ``apply_and_compare``) imports torch when first used.
"""

from pathlib import Path as _Path

from fxrules.api import (
    ApplyComparison, Capture, ComparisonError, OutputDifference, Timings, analyze, apply_and_compare, apply_rules,
    capture,
    compare_outputs, explain, find_matches, load_rules, parse_rules,
)
from fxrules.errors import Diagnostic, FxrulesError, RuleFileError
from fxrules.lang.config import Config, ConfigError
from fxrules.lang.load import ConfigWarning
from fxrules.lang.ruleset import CheckedRule, RuleSet

__version__ = "0.1.0"

#: The bundled rule library (a directory of rule families: ``cleanup``, ``canonicalize``,
#: ``fold``, ``swap``, ``aten``), shipped inside the package:
#: ``fxrules.load_rules(fxrules.LIBRARY / "cleanup")``. See its README.md for every rule.
LIBRARY = _Path(__file__).resolve().parent / "library"

_LAZY = {
    "RewriteError": ("fxrules.engine.errors", "RewriteError"),
    "RewriteLoopError": ("fxrules.engine.errors", "RewriteLoopError"),
    "ModelError": ("fxrules.engine.errors", "ModelError"),
    "RewriteResult": ("fxrules.engine.report", "RewriteResult"),
    "Report": ("fxrules.engine.report", "Report"),
    "builders": ("fxrules.builders", None),
    "load_saved": ("fxrules.tools.saving", "load_saved"),
    "RulePass": ("fxrules.integration", "RulePass"),
    "compile_backend": ("fxrules.integration", "compile_backend"),
    "verify": ("fxrules.verifier.driver", "verify"),
    "VerifyReport": ("fxrules.verifier.driver", "VerifyReport"),
    "Grade": ("fxrules.verifier.driver", "Grade"),
    "RefusalCode": ("fxrules.engine.refusals", "RefusalCode"),
    "MissCode": ("fxrules.engine.refusals", "MissCode"),
    "AnalysisReport": ("fxrules.lang.analysis", "AnalysisReport"),
    "Against": ("fxrules.verifier.analysis", "Against"),
    "Finding": ("fxrules.lang.analysis", "Finding"),
    "FindingCode": ("fxrules.lang.analysis", "FindingCode"),
}


def __getattr__(name: str):
    """Engine names import torch, so they load on first use."""
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'fxrules' has no attribute {name!r}")


__all__ = [
    "LIBRARY", "CheckedRule", "Diagnostic", "FxrulesError", "ModelError", "Report", "RewriteError", "RewriteLoopError",
    "RewriteResult", "RuleFileError", "RuleSet", "apply_rules", "explain", "find_matches", "load_rules",
    "parse_rules", "RulePass", "compile_backend", "load_saved", "verify", "VerifyReport", "Grade", "RefusalCode", "MissCode",
    "ApplyComparison", "Capture", "ComparisonError", "OutputDifference", "Timings", "apply_and_compare", "capture",
    "compare_outputs", "Config", "ConfigError", "ConfigWarning", "analyze", "Against", "AnalysisReport", "Finding",
    "FindingCode",
]
