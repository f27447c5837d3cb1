"""``python -m fxrules``: the same as the ``fxrules`` command."""

import sys

from fxrules.tools.cli import main

sys.exit(main())
