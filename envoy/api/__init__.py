"""The control plane's HTTP API (FastAPI): replicas, heartbeats, pool and router state, the admin
API of the seed (``/admin/...``) and its dependencies.
"""
