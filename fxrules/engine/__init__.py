"""The rewrite engine: compiled rules matched against torch.fx graphs and rewritten safely.

``program`` compiles a :class:`fxrules.lang.ruleset.RuleSet` into matcher programs;
``matcher`` finds matches; ``conditions`` evaluates ``where`` clauses; ``planner`` decides
whether a match may be rewritten (refusals are data with stable codes); ``transaction``
applies plans all-or-nothing; ``driver`` runs to a fixpoint; ``report`` says what happened.
Imports only ``fxrules.lang`` among fxrules' subpackages.
"""
