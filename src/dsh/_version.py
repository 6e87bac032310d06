"""The package version, in a module of its own so any layer can read it without ``import dsh``."""

__version__ = "0.1.0"
