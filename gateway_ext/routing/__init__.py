"""Routing decisions of the gateway: version resolution (alias, canary split, pins), replica
picking on the ring bounded by tokens in flight, and the router state fed from the control plane.
"""
