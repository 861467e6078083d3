"""Team limits and admission (pure policy and its stores): token buckets in memory or Redis, the
fail-open window, concurrency caps, admission by tier and share, the retry budget, team limits
from the router state and the pools admitted to.
"""
