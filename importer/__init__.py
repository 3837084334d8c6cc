"""sneakernet importer: the bundle format, its verification and the engine sinks.

This package is the *format*: it is stdlib-only at import time (Python 3.8+) because it runs
as ``bundle-import.pyz`` on offline hosts. The exporter (``bundle``) imports it; it never
imports the exporter.
"""

__version__ = "0.1.0"

#: The newest bundle-manifest major version this importer reads.
SCHEMA_MAJOR = 3
