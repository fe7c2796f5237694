"""``python -m compensator``: the same as the ``compensator`` command."""

import sys

from compensator.cli import main

sys.exit(main())
