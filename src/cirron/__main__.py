"""``python -m cirron``: the ``cirron`` command (see :mod:`cirron.offline.cli`)."""

import sys

from .offline.cli import main

sys.exit(main())
