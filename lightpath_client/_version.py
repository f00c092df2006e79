"""The installed distribution's version (one source: pyproject.toml)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version


def version() -> str:
    try:
        return _dist_version("lightpath")
    except PackageNotFoundError:
        return "0+unknown"
