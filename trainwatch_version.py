"""The installed trainwatch version, read from the distribution's metadata.

pyproject.toml is the one place the version is written.  The CLI (``--version``), the
producers (``run_start`` metadata) and the checkers (the ``build_info`` metric) all
report it through this module.  It stands apart from the packages on purpose: the
invariants core does no I/O, and neither edge should import the other, or the CLI
package, only to learn the version.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version

DISTRIBUTION = "trainwatch"
#: Sources run without being installed have no metadata to read; say so rather than
#: report a version that may be stale.
UNKNOWN = "0+unknown"


@functools.cache
def version() -> str:
    try:
        return distribution_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN
