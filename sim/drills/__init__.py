"""The seed's drills (routing A/B, capacity, isolation, autoscaling, canary, failover) and their plots.
"""
