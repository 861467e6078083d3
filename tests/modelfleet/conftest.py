"""Fixtures of the modelfleet tests: the repository's config and dev keys."""

from modelfleet.testing import dev_keys, platform_config  # noqa: F401  (fixtures)
