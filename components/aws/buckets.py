"""Names of the weights buckets and keys (pure functions).

A version's ``weights_uri`` names the *primary* bucket, where a version's weights are registered
(``s3://modelfleet-weights/chat-7b/v13/``). The primary region reads that bucket; every other
region reads its replica ``<primary>-<region>`` (``modelfleet-weights-eu-west-1``), filled by S3
replication. Keys are the same in every bucket, so a pool in any region finds its weights under
the path of the ``weights_uri``.
"""

from __future__ import annotations

from urllib.parse import urlparse

from modelfleet.config.schema import PlatformConfig, Version

MANIFEST = "MANIFEST.sha256"
"""The weights manifest at the root of a version's prefix: one ``<sha256 hex>  <relative path>``
line per file (``sha256sum`` format). A version's ``weights_hash`` is the sha256 of this file."""


def _s3(version: Version) -> tuple[str, str]:
    parsed = urlparse(version.weights_uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{version.key}: weights_uri {version.weights_uri!r} must be s3://bucket/prefix/ "
                         "to be deployed (the clusters read weights from S3)")
    return parsed.netloc, parsed.path.lstrip("/")


def weights_prefix(version: Version) -> str:
    """The key prefix of the version's weights, ending in ``/`` (``chat-7b/v13/``)."""
    prefix = _s3(version)[1]
    return prefix if prefix.endswith("/") else prefix + "/"


def primary_bucket(config: PlatformConfig) -> str:
    """The one bucket every version's ``weights_uri`` names; ``ValueError`` if they differ."""
    buckets = {_s3(v)[0] for v in config.versions}
    if len(buckets) != 1:
        raise ValueError(f"every weights_uri must name one primary bucket, found {sorted(buckets)}")
    return buckets.pop()


def region_bucket(primary: str, region: str, primary_region: str) -> str:
    """The bucket a region's pools read: the primary itself, or its replica in ``region``."""
    return primary if region == primary_region else f"{primary}-{region}"
