"""Validation findings and where in the YAML they point (file, line, field path)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Location:
    """A place in the config: a file, a field path such as ``versions[1].precision``, a line."""

    file: str
    path: str
    line: int | None = None

    def __str__(self) -> str:
        line = f":{self.line}" if self.line else ""
        return f"{self.file}{line}: {self.path}" if self.path else f"{self.file}{line}"


@dataclass(frozen=True)
class Problem:
    """One finding of ``modelfleet validate``."""

    location: Location
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.location}: {self.severity}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        """Plain-data form for ``--json``."""
        return {
            "file": self.location.file,
            "path": self.location.path,
            "line": self.location.line,
            "severity": self.severity,
            "message": self.message,
        }


@dataclass(frozen=True)
class ItemOrigin:
    """Where one list item of a section came from, with the line of each field below it."""

    file: str
    path: str
    lines: dict[str, int] = field(default_factory=dict)
    """Line numbers keyed by field path relative to the item (``""`` is the item itself)."""

    def at(self, *sub: str | int) -> Location:
        """The location of a field below this item, e.g. ``at("canary", "version")``."""
        rel = join_path(sub)
        path = f"{self.path}.{rel}" if rel and not rel.startswith("[") else f"{self.path}{rel}"
        probe = rel
        while probe not in self.lines and probe:
            probe = parent_path(probe)
        return Location(self.file, path, self.lines.get(probe))


def join_path(parts: tuple[str | int, ...] | list[str | int]) -> str:
    """``("limits", 0, "model")`` -> ``limits[0].model``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


def parent_path(path: str) -> str:
    """``limits[0].model`` -> ``limits[0]`` -> ``limits`` -> ``""``."""
    if path.endswith("]"):
        return path[: path.rindex("[")]
    return path[: path.rindex(".")] if "." in path else ""


@dataclass
class Origins:
    """Where each item of each section came from, in :class:`PlatformConfig` order."""

    items: dict[str, list[ItemOrigin]] = field(default_factory=dict)

    def of(self, section: str, index: int) -> ItemOrigin:
        """Origin of item ``index`` of ``section`` (as ordered in the loaded config)."""
        return self.items[section][index]
