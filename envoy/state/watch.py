"""The control plane's timer tasks: the config directory watch and the heartbeat timer.

Both run until cancelled, on the control plane's asyncio loop, and never stop on an error: the
last good snapshot keeps serving and the next tick tries again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from modelfleet.config import ConfigError

log = logging.getLogger("envoy_control.state.plane")

ConfigSignature = tuple[tuple[str, int, int], ...]


class _Versioned(Protocol):
    @property
    def version(self) -> str: ...


class _Published(Protocol):
    @property
    def snapshot(self) -> _Versioned: ...

    @property
    def changed(self) -> bool: ...


class _RouterFile(Protocol):
    async def save(self, path: Path) -> bool: ...


class Watched(Protocol):
    """What the timers use of the control plane (:class:`envoy_control.state.plane.ControlPlane`,
    which passes itself): its config directory, the signature it last read, reload/refresh."""

    config_dir: Path
    signature: ConfigSignature

    @property
    def snapshot(self) -> _Versioned: ...

    @property
    def router(self) -> _RouterFile: ...

    def reload(self) -> _Published: ...

    def refresh(self) -> _Published: ...


def config_signature(config_dir: Path) -> ConfigSignature:
    """Name, mtime (ns) and size of every ``*.yaml``/``*.yml`` file: changes when any file does."""
    out = []
    for path in sorted([*config_dir.glob("*.yaml"), *config_dir.glob("*.yml")]):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((path.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


async def watch_config(plane: Watched, interval_s: float = 0.2) -> None:
    """Reload whenever a config file changes, polling mtimes every ``interval_s`` seconds.

    An invalid config is logged with its problems and not retried until the files change again.
    """
    while True:
        await asyncio.sleep(interval_s)
        signature = config_signature(plane.config_dir)
        if signature == plane.signature:
            continue
        try:
            published = plane.reload()
        except ConfigError as exc:
            plane.signature = signature
            log.error(
                "config change refused, version %s keeps serving:\n%s",
                plane.snapshot.version,
                "\n".join(str(p) for p in exc.problems),
            )
            continue
        except Exception:
            plane.signature = signature
            log.exception("config change failed, version %s keeps serving", plane.snapshot.version)
            continue
        log.info(
            "config reloaded from %s: snapshot %s%s",
            plane.config_dir,
            published.snapshot.version,
            "" if published.changed else " (no resource changed)",
        )


async def watch_beats(
    plane: Watched, interval_s: float = 0.25, state_file: Path | None = None
) -> None:
    """Every ``interval_s`` seconds: apply the missed-beat rule (``plane.refresh()``: a replica
    more than 3 s past its last beat leaves EDS within ``interval_s``) and, with ``state_file``,
    save the router state when its version moved (atomic; at most 1 / ``interval_s`` a second).
    """
    while True:
        try:
            plane.refresh()
            if state_file is not None:
                await plane.router.save(state_file)
        except Exception:
            log.exception(
                "heartbeat check failed; snapshot %s keeps serving", plane.snapshot.version
            )
        await asyncio.sleep(interval_s)
