"""What an image installs, from pyproject.toml and the lock (stdlib only: runs in any base image).

    python3 requirements/extras.py requirements EXTRA [EXTRA ...]
        the third-party requirements of those extras, one a line, with the self-references
        (``modelfleet[gateway,...]``) expanded and the base dependencies included: what
        ``pip install ".[EXTRA]"`` would ask for, for an image that copies only some packages
        and so cannot build the project itself.

    python3 requirements/extras.py constraints requirements/constraints.txt
        the lock, with every distribution this interpreter already has pinned at its installed
        version instead: an engine's image (vLLM) keeps its own pins, and only what it lacks
        comes from the lock. ``pip install -c`` of this file then fails the build if an extra's
        ranges do not fit what the base image brings, rather than moving the engine's packages.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def canonical(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_and_extras(req: str) -> tuple[str, list[str]]:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", req)
    if not m:
        raise SystemExit(f"extras.py: cannot read requirement {req!r}")
    extras = [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
    return m.group(1), extras


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The base dependencies plus those of ``extras`` (self-references expanded), in order, once."""
    project = tomllib.loads(pyproject.read_text())["project"]
    own, optional = canonical(project["name"]), project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()

    def add(extra: str) -> None:
        if extra in seen:
            return
        if extra not in optional:
            raise SystemExit(f"extras.py: pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for req in optional[extra]:
            name, inner = _name_and_extras(req)
            if canonical(name) == own:
                for e in inner:
                    add(e)
            elif req not in out:
                out.append(req)

    for extra in extras:
        add(extra)
    return out


def constraints(lock: Path) -> list[str]:
    """The lock's pins, with what is installed here pinned at its installed version."""
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()
                 if d.metadata["Name"]}
    out = []
    for line in lock.read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if not pin:
            continue
        name = canonical(re.split(r"[=<>!~ ;@]", pin, maxsplit=1)[0])
        out.append(f"{name}=={installed[name]}" if name in installed else pin)
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "requirements":
        print("\n".join(requirements(argv[1:])))
        return 0
    if len(argv) == 2 and argv[0] == "constraints":
        print("\n".join(constraints(Path(argv[1]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
