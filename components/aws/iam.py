"""IAM trust and permission documents (pure functions returning JSON strings)."""

from __future__ import annotations

import json
from typing import Any


def trust(service: str, *, tag_session: bool = False) -> str:
    """A role trust policy letting ``service`` (``eks.amazonaws.com``, ...) assume the role."""
    actions = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}]})


def policy(*statements: dict[str, Any]) -> str:
    """A permission policy of ``statements``."""
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def allow(actions: list[str], resources: list[str] | str = "*", **extra: Any) -> dict[str, Any]:
    """One ``Allow`` statement."""
    return {"Effect": "Allow", "Action": actions, "Resource": resources, **extra}


MANAGED = "arn:aws:iam::aws:policy/"
"""Prefix of AWS-managed policy ARNs."""
