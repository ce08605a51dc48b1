"""The package's version: one declaration, read by the package, its build (pyproject) and every record it writes."""

__version__ = "0.1.0"
