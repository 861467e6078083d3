"""Staged rollouts: the controller (a pure state machine), its driver (I/O), resumption after a
restart, the guard rule and the Prometheus reader of guard metrics.
"""
