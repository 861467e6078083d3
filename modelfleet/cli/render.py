"""``modelfleet render --stack NAME [--out DIR] [--diff DIR]``: every resource a stack declares,
as files, without a cloud, so a config pull request can be reviewed.

Runs the stack's Pulumi program (``components.program``, the functions ``infra/__main__.py``
calls) under ``pulumi.runtime.Mocks`` with the stack's settings from
``stacks/Pulumi.<NAME>.yaml``, writes Kubernetes objects as YAML and cloud resources as JSON
(layout in ``components.render_files``), checks every Kubernetes object against the schemas
(``components.validation``), and with ``--diff`` compares against an earlier render.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from modelfleet.config import ConfigError


def register(sub: Any) -> None:
    """Add the ``render`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "render",
        help="write every resource a stack declares (Kubernetes YAML, cloud JSON), optionally diffed",
        description="Run the stack's Pulumi program under mocks (no cloud, no Pulumi CLI) and write "
        "every resource it declares: Kubernetes objects as YAML, cloud resources as JSON. Every "
        "Kubernetes object is checked against the Kubernetes and KEDA schemas (exit 1 if one fails). "
        "--diff DIR compares with an earlier render and prints what changed.",
    )
    p.add_argument("--stack", required=True, help="stack name: us-east-1, eu-west-1, global, ...")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: build/render/STACK; a temporary one with --diff alone)")
    p.add_argument("--diff", type=Path, default=None, metavar="DIR", help="an earlier render to compare with")
    p.add_argument("--config", type=Path, default=None, help="config folder (default: the stack's modelfleet:configDir)")
    p.add_argument("--stacks-dir", type=Path, default=Path("stacks"), help="folder of Pulumi.<stack>.yaml files")
    p.add_argument("--no-validate", action="store_true", help="skip the schema check of Kubernetes objects")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(run=run)


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"ok": False, "error": message}, indent=2))
    else:
        print(f"modelfleet render: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    """Render ``args.stack``; 0 on success (changes or not), 1 on an error or invalid object."""
    # Pulumi, the providers and the schema packages take seconds to import: only when rendering.
    from components.capacity import CapacityError
    from components.mocking import run_program
    from components.program import stack_program
    from components.render_files import diff_renders, write_render
    from components.settings import StackSettingsError, settings_from_file
    from components.validation import invalid_objects
    try:
        settings = settings_from_file(args.stacks_dir, args.stack, args.config)
        if not args.json:
            print(f"rendering stack {args.stack} ({settings.kind}) from {settings.config_dir} ...", file=sys.stderr)
        mocks = run_program(stack_program(settings), stack=args.stack)
    except ConfigError as exc:
        return _fail(args, f"config error, nothing rendered:\n{exc}")
    except (CapacityError, StackSettingsError, ValueError) as exc:
        return _fail(args, str(exc))
    invalid = {} if args.no_validate else invalid_objects(mocks.kubernetes_objects())
    with tempfile.TemporaryDirectory(prefix="modelfleet-render-") as tmp:
        out = args.out or (Path(tmp) / args.stack if args.diff else Path("build/render") / args.stack)
        try:
            written = write_render(mocks.resources, out)
            diff = diff_renders(args.diff, out) if args.diff else None
        except ValueError as exc:
            return _fail(args, str(exc))
        result: dict[str, Any] = {
            "ok": not invalid, "stack": args.stack, "out": str(out) if args.out or not args.diff else None,
            "files": len(written), "kubernetes_objects": len(mocks.kubernetes_objects()), "invalid": invalid,
            "diff": diff.as_dict() if diff else None}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        where = f" to {result['out']}" if result["out"] else ""
        print(f"{args.stack}: {len(written)} files ({result['kubernetes_objects']} Kubernetes objects){where}")
        if diff is not None:
            print(f"compared with {args.diff}: " + ("no changes" if diff.empty else diff.render()))
        for name, found in invalid.items():
            print(f"invalid {name}: " + "; ".join(found), file=sys.stderr)
    return 1 if invalid else 0
