"""Reading a bundle: ``open_bundle()`` (a folder, one tar or its parts, opened once), the safe
tar reader, layer readers and the hashing of tar streams."""
