"""``python -m cirron``: the ``cirron`` command (see :mod:`cirron.cli`)."""

import sys

from .cli import main

sys.exit(main())
