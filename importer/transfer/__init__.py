"""Moving a bundle between disks: the resumable, verified copy."""
