"""``python -m cumatrix`` is the ``cumatrix`` command."""

import sys

from .cli import main

sys.exit(main())
