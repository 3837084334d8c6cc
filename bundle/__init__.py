"""sneakernet exporter: stream images out of an engine into a verified, content-addressed bundle."""

from importer import __version__

__all__ = ["__version__"]
