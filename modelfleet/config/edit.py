"""Small, comment-preserving edits of the config YAML (for ``modelfleet keys add``).

The YAML is the reviewed desired state, so an edit touches only the lines it must: it appends a
hash to one team's ``key_hashes`` in whichever of the three shapes the file uses (flow list,
block list, or absent), then reloads the config to prove the result is what was meant.
"""

from __future__ import annotations

import re
from pathlib import Path

from modelfleet.config.load import ConfigError, load_config


class EditError(Exception):
    """The config could not be edited as asked; the files are unchanged."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def add_key_hash(config_dir: Path, team: str, key_hash: str) -> Path:
    """Append ``key_hash`` to ``team``'s ``key_hashes``; returns the file edited.

    Raises :class:`EditError` (with the files unchanged) if the team is unknown, the config does
    not load, or the edit would not load back with the hash in place.
    """
    try:
        loaded = load_config(config_dir)
    except ConfigError as exc:
        raise EditError(f"the config has errors; fix them first:\n{exc}") from None
    index = next((i for i, t in enumerate(loaded.config.teams) if t.name == team), None)
    if index is None:
        known = ", ".join(t.name for t in loaded.config.teams)
        raise EditError(f"no team {team!r} in {config_dir} (teams: {known})")
    origin = loaded.origins.of("teams", index)
    path = Path(origin.file)
    original = path.read_text(encoding="utf-8")
    lines = original.splitlines(keepends=True)
    n_hashes = len(loaded.config.teams[index].key_hashes)
    keys_line = origin.lines.get("key_hashes")
    last_item = origin.lines.get(f"key_hashes[{n_hashes - 1}]") if n_hashes else None
    if last_item is not None and lines[last_item - 1].lstrip().startswith("-"):
        last = last_item - 1  # block list: a new "- item" below the last
        item = lines[last]
        prefix = item[: item.index("-") + 1]
        lines.insert(last + 1, f"{prefix} {key_hash}\n")
    elif keys_line is not None:  # flow list on one line: [a, b] -> [a, b, new]
        i = keys_line - 1
        match = re.search(r"\[(.*)\]", lines[i])
        if match is None:
            raise EditError(f"{path}:{keys_line}: cannot read key_hashes")
        inner = match.group(1).strip()
        new = f"{inner}, {key_hash}" if inner else key_hash
        lines[i] = lines[i][: match.start()] + f"[{new}]" + lines[i][match.end():]
    else:  # no key_hashes yet: add it under the team's name
        name_line = origin.lines["name"] - 1
        text = lines[name_line]
        col = text.index("name:")
        lines.insert(name_line + 1, " " * col + f"key_hashes: [{key_hash}]\n")
    path.write_text("".join(lines), encoding="utf-8")
    try:
        after = load_config(config_dir).config
        ok = any(t.name == team and key_hash in t.key_hashes for t in after.teams)
    except ConfigError as exc:
        ok, detail = False, str(exc)
    else:
        detail = "the hash did not land in the team's key_hashes"
    if not ok:
        path.write_text(original, encoding="utf-8")
        raise EditError(f"{path}: edit refused and undone: {detail}")
    return path
