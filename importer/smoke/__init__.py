"""GPU qualification smoke suite: run the same gates inside an imported image (or the current
Python) and write a qualification receipt (schemas/receipt/qualification-v1.schema.json).

Host side (this package): NVML facts, settings, the container/process runner, the receipt and
the ``bundle-import smoke`` command. Image side (``worker/``): the suite itself, copied into a
temporary folder and mounted read-only into the container; stdlib only, torch imported lazily.
"""
