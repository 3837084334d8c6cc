"""The import itself: signature -> schema -> probe -> lock -> preflight -> verify -> load under
staging tags -> check -> tag -> receipt, for schema 3, schemas 1/2 and a registry; plus the
inventory and ``--have`` files deltas are made from."""
