"""An OCI registry as a source of truth and a target: the distribution-API client, credentials,
the push, deltas completed from a registry, its inventory and the registry sink."""
