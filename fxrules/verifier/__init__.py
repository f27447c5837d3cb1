"""Rule verification: random host graphs around each rule's pattern, run before and after.

``samplers`` draw arguments per op; ``hosts`` build host graphs from a compiled pattern;
``examples`` build a rule's own ``example:`` models; ``driver`` grades each rule.
(Named ``verifier``, not ``verify``, because ``fxrules.verify`` is the public function.)
Imports ``fxrules.engine`` and ``fxrules.lang``.
"""
