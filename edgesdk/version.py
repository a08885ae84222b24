"""The edgesdk release (a leaf module: read by the package, the monitor and bench without importing the package)."""

__version__ = "0.1.0"  # as pyproject.toml says
