"""``python -m cumatrix`` is the ``cumatrix`` command."""

import sys

from cumatrix.front.cli import main

sys.exit(main())
