"""Build hook for the optional C accelerator ``dsh._speedups``; all metadata is in pyproject.toml.

``optional=True``: when the compiler or Python headers are missing the build prints a warning
and the package still installs, running the pure-Python paths of :mod:`dsh.json`.
"""

import sys

from setuptools import Extension, setup

setup(ext_modules=[Extension("dsh._speedups", ["src/dsh/_speedups.c"], optional=True,
                                libraries=["dl"] if sys.platform.startswith("linux") else [])])
