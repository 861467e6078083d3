"""The settings base every service shares (pydantic-settings): flags, then environment variables
with the service's prefix, then secret files, then defaults.

A service subclasses :class:`ServiceSettings` with its own ``env_prefix`` (``MODELFLEET_GATEWAY_``,
``MODELFLEET_BATCH_``, ``MODELFLEET_CONTROL_PLANE_``; the replica middleware ``MODELFLEET_``)
and reads it with :meth:`ServiceSettings.from_env`. Each field ``name`` comes from, first to last:
the command-line flag (an init keyword; ``None`` means not given), the variable
``<PREFIX><NAME>`` (lists and mappings as JSON), a secret file of that same name in the secrets
directory (``$MODELFLEET_SECRETS_DIR``, default ``/run/secrets/modelfleet``: e.g. a Kubernetes
Secret mounted there; names match without regard to case, surrounding whitespace is dropped, a
missing directory is ignored), then the default. No ``.env`` file is read.

Imported by every service and by the middleware inside ``vllm serve``, so it needs nothing but
pydantic-settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NestedSecretsSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

SECRETS_DIR_ENV = "MODELFLEET_SECRETS_DIR"
"""Names the directory of secret files (one file per setting, named like its variable)."""
DEFAULT_SECRETS_DIR = Path("/run/secrets/modelfleet")

_environ: ContextVar[Mapping[str, str] | None] = ContextVar("modelfleet_environ", default=None)
"""The environment :meth:`ServiceSettings.from_env` was given, in place of ``os.environ``."""


def service_config(env_prefix: str, **more: Any) -> SettingsConfigDict:
    """The ``model_config`` of a service's settings: ``env_prefix``, the secrets directory
    (missing is fine), unknown keywords refused, frozen; ``more`` adds or overrides keys."""
    config = SettingsConfigDict(env_prefix=env_prefix, secrets_dir=DEFAULT_SECRETS_DIR,
                                secrets_dir_missing="ok", extra="forbid", frozen=True)
    config.update(more)  # type: ignore[typeddict-item]
    return config


class ServiceSettings(BaseSettings):
    """A service's settings: subclass with ``model_config = service_config(PREFIX)``."""

    variables_only: ClassVar[bool] = False
    """True: the environment and the secret files match fields by their variable (alias) only,
    never by the bare field name (for fields whose names are generic, such as ``host``)."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Init keywords (flags), then the environment (:meth:`from_env`'s ``environ`` if
        given), then the secret files; no ``.env`` file."""
        environ = _environ.get()
        if environ is not None and isinstance(env_settings, EnvSettingsSource):
            env_settings.env_vars = parse_env_vars(environ, env_settings.case_sensitive,
                                                   env_settings.env_ignore_empty,
                                                   env_settings.env_parse_none_str)
        secrets_dir = getattr(file_secret_settings, "secrets_dir", None)
        if secrets_dir == cls.model_config.get("secrets_dir"):  # not given as _secrets_dir=
            secrets_dir = (os.environ if environ is None else environ).get(SECRETS_DIR_ENV) \
                or secrets_dir
        secrets = NestedSecretsSettingsSource(file_secret_settings, secrets_dir=secrets_dir)
        if cls.variables_only:
            for source in (env_settings, secrets):
                source.config = cls.model_config | {"validate_by_name": False}
        return init_settings, env_settings, secrets

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **flags: Any) -> Self:
        """Settings from ``flags`` (None values are ignored: flags not given), then ``environ``
        (default: ``os.environ``), secret files and defaults. Raises ``ValidationError`` on a
        bad value, ``SettingsError`` on a variable or file that is not valid JSON."""
        token = _environ.set(environ)
        try:
            return cls(**{k: v for k, v in flags.items() if v is not None})
        finally:
            _environ.reset(token)


def settings_error(exc: Exception) -> str:
    """The message of a settings error, with its cause (what was wrong with the JSON)."""
    return f"{exc}: {exc.__cause__}" if exc.__cause__ is not None else str(exc)
