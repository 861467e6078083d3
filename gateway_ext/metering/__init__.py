"""Usage metering: rows per team, model, version, region, tier and minute, spooled locally and
written to the metering database exactly once.
"""
