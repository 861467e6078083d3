"""Run as a script by test_gw_bucket_stores: one process hammering one team x model bucket in Redis.

Usage: gw_hammer.py REDIS_URL PREFIX TPM COST ATTEMPTS NOW_S WORKER
Waits for the key ``PREFIX:go``, then reserves COST tokens at the frozen time NOW_S until the first
denial (at most ATTEMPTS times) and prints ``{"admitted_tokens": N, "attempts": M}``. With the clock
frozen nothing refills, so a denial is final for this COST.
"""

from __future__ import annotations

import json
import sys
import time

import redis

from gateway_ext.limits.bucket_store import BucketKey
from gateway_ext.limits.buckets import Verdict
from gateway_ext.limits.redis_buckets import RedisBucketStore


def main(argv: list[str]) -> None:
    url, prefix, tpm, cost, attempts, now, worker = argv
    client = redis.Redis.from_url(url)
    store = RedisBucketStore(client, prefix=prefix)
    deadline = time.monotonic() + 20
    while not client.exists(f"{prefix}:go"):
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.002)
    admitted = tries = 0
    while tries < int(attempts):
        tries += 1
        res = store.reserve(BucketKey("team", "model"), int(tpm), int(cost), f"{worker}-{tries}",
                            float(now), 300.0)
        if res.verdict is not Verdict.RESERVED:
            break
        admitted += int(cost)
    print(json.dumps({"admitted_tokens": admitted, "attempts": tries}))


if __name__ == "__main__":
    main(sys.argv[1:])
