"""The command lines: ``bundle-import`` (main.py), ``bundle-import copy``, ``sneakernet-gpu-check``,
and what both CLIs print (output.py: JSON documents, errors)."""
