"""`python -m pgtarn`: the same as the `pgtarn` command."""

import sys

from .cli import main

sys.exit(main())
