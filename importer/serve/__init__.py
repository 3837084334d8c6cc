"""``bundle-import serve``, the server half: a read-only OCI distribution API straight from a
verified bundle, its limits, TLS and Basic auth, the self-signed CA and the nodes' mirror config.
It stands beside importer/registry/ (the client half) and imports nothing from it."""
