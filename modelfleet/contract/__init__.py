"""The wire contract every part of the platform imports, and which imports nothing but the
standard library: request/response header names and paths (:mod:`.headers`), OpenAI-shaped
errors (:mod:`.errors`), the router-state schema the control plane publishes to gateways
(:mod:`.router_state`), the heartbeat replicas send it (:mod:`.heartbeat`), metric and label
names (:mod:`.metrics`) and the token estimate the gateway and the simulated replica agree on
(:mod:`.tokens`).
"""
