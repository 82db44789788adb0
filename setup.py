"""The optional C extension (cirron._hot); everything else is in pyproject.toml.

Built where a compiler is present; where the build fails, the package installs without it
and runs its pure-Python twin (``optional=True``, as wrapt does). See src/cirron/hot.py.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cirron._hot", ["src/cirron/_hot.c"], optional=True)])
