"""The release gate (``modelfleet gate``): a version's quality eval with task metrics and an LLM
judge, and its load test at rising arrival rates, measured through the platform.
"""
