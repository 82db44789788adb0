"""The optional C extension (cirron.recording._hot); everything else is in pyproject.toml.

Built where a compiler is present; where the build fails, the package installs without it
and runs its pure-Python twin (``optional=True``, as wrapt does). See
src/cirron/recording/hot.py.
"""

from setuptools import Extension, setup

HOT = Extension("cirron.recording._hot", ["src/cirron/recording/_hot.c"], optional=True)
setup(ext_modules=[HOT])
