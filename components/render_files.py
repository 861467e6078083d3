"""A render on disk: every recorded resource as a file, and the difference between two renders.

Layout under the output folder (names are stable, so two renders of the same stack compare file
by file):

- ``kubernetes/<namespace or _cluster>/<Kind>-<name>.yaml``: Kubernetes objects, as applied;
- ``helm/<release>.yaml``: Helm releases (chart, version, values);
- ``aws/<service>/<Type>-<name>.json``: cloud resources' inputs;
- ``pulumi/<Type>-<name>.json``: providers and stack references;
- ``index.json``: every resource, components included, with its type, name and file.

Secret text is ``<secret>`` (:func:`components.mocking.plain`).
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.mocking import Recorded, plain

INDEX = "index.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name).strip("_") or "_"


def resource_file(r: Recorded) -> str | None:
    """The relative path a resource is written to (None for components)."""
    if not r.custom and not r.type.startswith("pulumi:"):
        return None
    pkg, module, kind = ([*r.type.split(":"), "", ""])[:3]
    if pkg == "kubernetes" and "apiVersion" in r.inputs and "kind" in r.inputs:
        meta = r.inputs.get("metadata") or {}
        return f"kubernetes/{_safe(meta.get('namespace') or '_cluster')}/{r.inputs['kind']}-{_safe(meta.get('name', r.name))}.yaml"
    if r.type == "kubernetes:helm.sh/v3:Release":
        return f"helm/{_safe(r.name)}.yaml"
    if pkg == "aws":
        return f"aws/{_safe(module.split('/')[0])}/{kind}-{_safe(r.name)}.json"
    return f"pulumi/{_safe(module.split('/')[-1] or pkg)}-{_safe(r.name)}.json"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config files in a ConfigMap, scripts) as ``|`` blocks: diffs by line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and all(line == line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _text(path: str, data: Any) -> str:
    if path.endswith(".yaml"):
        return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=100)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_render(resources: list[Recorded], out: Path) -> list[str]:
    """Write ``resources`` under ``out`` (emptied first if it holds an earlier render; refused if
    it holds anything else); return the relative paths written."""
    if out.exists() and any(out.iterdir()):
        if not (out / INDEX).is_file():
            raise ValueError(f"{out} is not empty and holds no earlier render ({INDEX}); not overwriting it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    index, written = [], []
    for r in resources:
        rel = resource_file(r)
        index.append({"type": r.type, "name": r.name, "file": rel})
        if rel is None:
            continue
        if rel in written:
            raise ValueError(f"two resources render to {rel}")
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_text(rel, plain(r.inputs)), encoding="utf-8")
        written.append(rel)
    (out / INDEX).write_text(_text(INDEX, sorted(index, key=lambda i: (i["type"], i["name"]))), encoding="utf-8")
    return sorted(written)


@dataclass
class RenderDiff:
    """Files added, removed and changed (relative path -> unified diff lines) between renders."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {"added": self.added, "removed": self.removed, "changed": self.changed}

    def render(self) -> str:
        """Human-readable: a summary line, then each change."""
        lines = [f"{len(self.changed)} changed, {len(self.added)} added, {len(self.removed)} removed"]
        lines += [f"+ {p}" for p in self.added] + [f"- {p}" for p in self.removed]
        for path, diff in self.changed.items():
            lines += [f"~ {path}", *(f"    {line}" for line in diff)]
        return "\n".join(lines)


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*")
            if p.is_file() and p.name != INDEX}


def diff_renders(old: Path, new: Path) -> RenderDiff:
    """What changed from the render in ``old`` to the one in ``new``."""
    if not (old / INDEX).is_file():
        raise ValueError(f"{old} holds no render ({INDEX} missing)")
    before, after = _files(old), _files(new)
    out = RenderDiff(sorted(set(after) - set(before)), sorted(set(before) - set(after)))
    for rel in sorted(set(before) & set(after)):
        a = before[rel].read_text(encoding="utf-8").splitlines()
        b = after[rel].read_text(encoding="utf-8").splitlines()
        if a != b:
            out.changed[rel] = list(difflib.unified_diff(a, b, "before", "after", n=2, lineterm=""))[2:]
    return out
