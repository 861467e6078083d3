"""The control plane's state: the desired config with the admin override layer, heartbeats and pool
state, the replica set, router-state publication, and the timers that watch config and beats.
"""
