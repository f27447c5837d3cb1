"""``python -m fxrules``: the same as the ``fxrules`` command."""

import sys

from fxrules.tools.cli import main

if __name__ == "__main__":  # not when a spawned worker of `verify -j N` imports this as its main module
    sys.exit(main())
