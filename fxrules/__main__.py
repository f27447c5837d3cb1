"""``python -m fxrules``: the same as the ``fxrules`` command."""

import sys

from .cli import main

sys.exit(main())
