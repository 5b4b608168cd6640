"""The web console: static pages shipped in static/ (no build step, nothing
loaded from other hosts), served with JSON read through the cluster's gRPC
APIs by a node's metrics port or by `dledger console` (server.py, backend.py)."""
