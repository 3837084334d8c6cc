"""The bundle format: digests, media types, size limits, the bundle.json models, SHA256SUMS,
references, image identity, platforms, findings and terminal-safe text. Pure data and parsing:
imports nothing of the importer but importer/errors.py."""
