"""Receipts: the import receipt (built, placed, written) and the fleet report read from many hosts' receipts."""
