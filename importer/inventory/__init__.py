"""Inventories: what an engine or registry holds (`bundle-import --inventory`) and the `--have`
files the exporter reads."""
