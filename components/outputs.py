"""Small helpers for components' typed outputs."""

from __future__ import annotations

import pulumi


def known_after(resource: pulumi.Resource, value: str) -> pulumi.Output[str]:
    """``value`` as an output that depends on ``resource``: a consumer waits for the resource
    although the value (a name we chose) is known up front."""
    return resource.urn.apply(lambda _: value)
