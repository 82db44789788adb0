"""The reliability suite: the promises of the README's "What cirron promises", one file each.

Tests here run real training scripts as subprocesses, send real signals and
talk to real servers (a black hole, an erroring HTTP server, the ``rotel``
collector). What they measure (training speed with the backend down, what
SIGKILL lost, ...) goes into the ``figures`` fixture (tests/conftest.py) and is
printed at the end of the run ("cirron reliability figures"); with
``CIRRON_FIGURES=<file>`` it is also written there as JSON.
"""
