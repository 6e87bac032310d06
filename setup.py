"""Build hook for the optional C accelerator ``dsh._speedups``; all metadata is in pyproject.toml.

``optional=True``: when the compiler or Python headers are missing the build prints a warning
and the package still installs, running the pure-Python paths of :mod:`dsh.json`.

The module records the SHA-256 of the source it was built from (``SOURCE_SHA256``): in a source
checkout, where ``_speedups.c`` sits beside the built module, :mod:`dsh.json` does not use a
build whose source has changed since (docs/architecture.md#the-c-accelerator).
"""

import hashlib
import sys
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/dsh/_speedups.c"
source_sha256 = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(ext_modules=[Extension("dsh._speedups", [SOURCE], optional=True,
                             define_macros=[("DSH_SOURCE_SHA256", f'"{source_sha256}"')],
                             libraries=["dl"] if sys.platform.startswith("linux") else [])])
