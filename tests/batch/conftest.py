"""Fixtures of the batch tests: the repository's config and dev keys, real Postgres."""

from modelfleet.testing import dev_keys, platform_config, postgres_url, table_prefix  # noqa: F401  (fixtures)
