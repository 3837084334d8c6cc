"""The smoke suite as it runs inside the image: stdlib only at module level, torch imported
lazily by name. Mounted read-only at ``/sneakernet-smoke`` and run as
``python3 -m importer.smoke.worker run ...`` with that folder as the working directory."""

#: Every module of this package; the host copies exactly these into the mounted folder.
MODULES = ("__init__", "__main__", "protocol", "compat", "suite", "gates", "collective")
