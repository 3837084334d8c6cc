"""``python -m importer`` and the zipapp entry point (the pyz's top-level ``__main__.py`` is this
file): importer/launch.py, which any python3 parses, so an older one gets a sentence, not a traceback."""

import sys

from importer.launch import run

sys.exit(run())
