"""Checking a bundle before anything touches an engine: schema 3 (folder and archive),
schemas 1/2, the signature and trust policy, the ``--deep`` re-export check, and ``inspect``."""
