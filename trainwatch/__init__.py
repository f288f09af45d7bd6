"""trainwatch: catch silent errors in PyTorch training while the job runs."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Resolved on use: reading package metadata is not free, and most imports of this
    # package (every `trainwatch` command) never ask for the version.
    if name == "__version__":
        from trainwatch_version import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
