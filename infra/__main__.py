"""The Pulumi program (``Pulumi.yaml``: ``main: infra/``): one region, or the global layer.

Reads the stack's ``modelfleet:`` settings (``kind`` region|global, ``region``, ``configDir``,
``domain``, ...; see ``components/settings.py`` and docs/deploy.md) and calls the same program
functions ``modelfleet render`` runs under mocks (``components/program.py``). The platform config
is loaded and checked, and the pools' maxima checked against the capacity plan, before any
resource is declared: a config error stops ``pulumi preview`` with every problem listed.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from components.program import stack_program
from components.settings import settings_from

config = pulumi.Config("modelfleet")
settings = settings_from(pulumi.get_stack(), config.get, Path(__file__).resolve().parent)
stack_program(settings, lambda: config.require_secret("dbPassword"))()
