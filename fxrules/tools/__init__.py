"""What people run: the ``fxrules`` command, the formatter, graph drawing, code diffs,
progress lines, saving rewritten modules, and the library index. May import every other
subpackage; nothing below imports it.
"""
