"""A reusable xDS server (state of the world over ADS, like go-control-plane's cache and server):
immutable snapshots, their consistency check, the snapshot cache, the per-stream protocol, the
gRPC server and per-Envoy ACK/NACK status. Knows nothing of modelfleet.
"""
