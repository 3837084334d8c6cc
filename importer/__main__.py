"""``python -m importer`` and the zipapp entry point."""

import sys

from importer.cli.main import main

sys.exit(main())
