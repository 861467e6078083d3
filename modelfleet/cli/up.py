"""``modelfleet up``: start the local stack in the foreground; Ctrl-C or SIGTERM stops it all."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from modelfleet.config import ConfigError
from modelfleet.local.autoscaler import LocalAutoscaler
from modelfleet.local.autoscaler_env import prepare_options
from modelfleet.local.launch import StackOptions, redact_password
from modelfleet.local.processes import pid_alive
from modelfleet.local.stack import LocalStack
from modelfleet.local.state import read_state, state_path, write_state

PACKAGED_CONFIG = Path(__file__).resolve().parents[2] / "config"
"""The example config of the checkout this package was installed from."""


class _Stop(BaseException):
    """Raised by the SIGTERM handler to unwind into the clean stop."""


def register(sub: Any) -> None:
    """Add the ``up`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="start the local stack: control plane, gateway, simulated replicas, a real Envoy",
        description="Start on 127.0.0.1 the xDS control plane, gateway_ext (team keys, token "
        "buckets, admission, metering), one simulated vLLM replica per entry of the config's "
        "`local.replicas`, and a real Envoy fed by the control plane that checks every request "
        "with the gateway. Prints the config's dev keys, writes the connection facts to "
        ".modelfleet/local.json and runs until Ctrl-C or SIGTERM, which stops every child.",
    )
    p.add_argument("--config", type=Path, default=None,
                   help="config directory (default: ./config, else the example config)")
    p.add_argument("--port", type=int, default=8080, help="public API port (default 8080)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="run the simulated replicas this many times faster than real time")
    p.add_argument("--seed", type=int, default=0, help="seed of the replicas' generated text")
    p.add_argument("--debug", action="store_true",
                   help="enable the control plane's and the gateway's debug endpoints")
    p.add_argument("--usage-db-url", default=None,
                   help="the gateway's usage database (default: SQLite .modelfleet/usage.db)")
    p.add_argument("--redis-url", default=None,
                   help="token buckets in Redis (default: in the gateway's memory)")
    p.add_argument("--control-plane-restart-delay", type=float, default=1.0, metavar="S",
                   help="restart a control plane that died after S seconds (Envoy and the gateway "
                   "keep serving meanwhile from their last state); negative: stop everything "
                   "instead")
    p.add_argument("--json", action="store_true", help="print the connection facts as JSON when ready")
    p.add_argument("--autoscale", action="store_true",
                   help="run the autoscaling rule on every pool: start replicas after a (scaled) "
                   "cold start, drain them before stopping; `modelfleet status` shows why")
    p.add_argument("--cold-start", type=float, default=None, metavar="S",
                   help="with --autoscale: cold start of a new replica in model seconds (default: "
                   "the config's autoscaling.cold_start, 312 s), divided by the time scale")
    p.set_defaults(run=run)


def default_config_dir() -> Path:
    """./config when it exists, else the example config shipped with the checkout."""
    here = Path("config")
    return here if here.is_dir() else PACKAGED_CONFIG


def snippets(base_url: str, key: str) -> str:
    """Ready-to-paste curl and Python (openai) examples against ``base_url``."""
    return f"""\
  curl -sN {base_url}/chat/completions \\
    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\
    -H 'x-conversation-id: demo-1' \\
    -d '{{"model": "chat-7b", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{base_url}", api_key="{key}")
  stream = client.chat.completions.create(
      model="chat-7b", messages=[{{"role": "user", "content": "Hello!"}}], stream=True,
      stream_options={{"include_usage": True}}, extra_headers={{"x-conversation-id": "demo-1"}})
  for chunk in stream:
      if chunk.choices:
          print(chunk.choices[0].delta.content or "", end="", flush=True)
      elif chunk.usage:
          print("\\n", chunk.usage)
  PY"""


def run(args: argparse.Namespace) -> int:
    """Start the stack, print how to use it, wait for a stop signal, stop every child."""
    facts_path = state_path(".")
    previous = read_state(facts_path)
    if previous and pid_alive(int(previous.get("pid", 0))):
        print(f"modelfleet up: a local stack started from here is already running (pid {previous['pid']}); "
              "stop it first", file=sys.stderr)
        return 1
    options = StackOptions(
        config_dir=args.config or default_config_dir(),
        port=args.port,
        state_dir=facts_path.parent,
        time_scale=args.time_scale,
        seed=args.seed,
        debug=args.debug,
        usage_db_url=args.usage_db_url,
        redis_url=args.redis_url,
    )
    stack = LocalStack(options)
    stop_requested = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    # Also when started from a shell that ignores SIGINT for background jobs: Ctrl-C must stop it.
    signal.signal(signal.SIGINT, on_term)
    code = 0
    scaler = None
    try:
        if args.autoscale:
            cfg, time_scale = prepare_options(options)
        facts = stack.start(progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
        write_state(facts_path, facts)
        if args.autoscale:
            scaler = LocalAutoscaler(
                stack, cfg, time_scale, cold_start_s=args.cold_start,
                say=lambda msg: print(f"autoscale: {msg}", file=sys.stderr, flush=True),
                on_change=lambda: write_state(facts_path, stack.facts))
        if args.json:
            print(json.dumps(facts, indent=2), flush=True)
        else:
            print(_banner(facts, facts_path), flush=True)
        code = _watch(stack, stop_requested, args.control_plane_restart_delay, facts_path, scaler)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        code = 1
    except (KeyboardInterrupt, _Stop):
        code = 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"modelfleet up: {exc}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("modelfleet up: stopping", file=sys.stderr, flush=True)
        stack.stop()
        facts_path.unlink(missing_ok=True)
        if scaler is not None:
            scaler.path.unlink(missing_ok=True)
    return code


def _watch(stack: LocalStack, stop_requested: threading.Event, restart_delay_s: float,
           facts_path: Path, scaler: LocalAutoscaler | None = None) -> int:
    """Wait for a stop; report children that die; give up if Envoy or the gateway does (no
    request can be served without them). A control plane that dies is restarted after
    ``restart_delay_s`` seconds (as Kubernetes would): it is not in the request path.
    ``scaler`` (``--autoscale``) is ticked on every pass; the replicas it drains are its own."""
    reported: set[int] = set()
    restart_at: float | None = None
    while not stop_requested.wait(0.2):
        if scaler is not None:
            scaler.tick()
        for child in stack.dead_children():
            if child.pid in reported or (scaler is not None and scaler.stopping(child)):
                continue
            reported.add(child.pid)
            print(f"modelfleet up: {child.name} (pid {child.pid}) exited with {child.popen.returncode}; "
                  f"log: {child.log}", file=sys.stderr, flush=True)
            if child.role in ("envoy", "gateway") or (child.role == "control-plane"
                                                      and restart_delay_s < 0):
                return 1
            if child.role == "control-plane":
                restart_at = time.monotonic() + restart_delay_s
        if restart_at is not None and time.monotonic() >= restart_at:
            restart_at = None
            cp = stack.restart_control_plane()
            write_state(facts_path, stack.facts)
            print(f"modelfleet up: control plane restarted (pid {cp.pid})", file=sys.stderr,
                  flush=True)
    return 0


def _banner(facts: dict[str, Any], facts_path: Path) -> str:
    replicas = [p for p in facts["processes"] if p["role"] == "replica"]
    versions = sorted({p["model_version"] for p in replicas})
    cp = facts["control_plane"]
    keys: dict[str, str] = facts.get("keys", {})
    key_lines = "\n".join(f"  {team:<15} {key}" for team, key in keys.items()) or "  (none in local.yaml)"
    first = next(iter(keys.values()), "<team key>")
    return f"""
modelfleet is up: {len(replicas)} simulated replicas of {', '.join(versions)} behind Envoy and the gateway

  API base URL    {facts['base_url']}
  Envoy admin     {facts['envoy_admin_url']}
  gateway         {facts['gateway']['url']}  (metrics {facts['gateway']['metrics_url']})
  control plane   {cp['http_url']}  (xDS {cp['xds_address']})
  usage database  {redact_password(facts['usage_db_url'])}  (`modelfleet usage`)
  batch API       {facts['base_url']}/batches and /files  (service {facts.get('batch', {}).get('url', 'off')})
  facts           {facts_path}

Dev keys (local use only; also in the facts file under "keys"):
{key_lines}

Try it:
{snippets(facts['base_url'], first)}

`modelfleet status` shows replicas, versions and Envoy's view. Ctrl-C stops everything.
"""
