"""``python -m replica``: a simulated ``vllm serve`` for one model version.

    python -m replica --port 8001 --served-model-name chat-7b chat-7b@v13 \\
        --model-version v13 --replica-id chat-7b-v13-0 --region local \\
        --preset chat-7b --engine-params '{"max_num_seqs": 128}' --time-scale 10 \\
        [--settle-url http://127.0.0.1:8090/v1/settle] \\
        [--control-plane-url http://127.0.0.1:8081 --advertise-host 127.0.0.1] [--debug]

The engine's app runs inside the modelfleet middleware (``replica_middleware.middleware``), as real vLLM does
with ``--middleware``: flags that are not given fall back to the same ``MODELFLEET_*`` variables
(and secret files: ``replica_middleware.settings``).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence

import uvicorn

from replica.chat import ReplicaConfig
from replica.params import PRESETS, params_from_json, preset
from replica.server import serve_app
from replica_middleware.settings import MiddlewareSettings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with vLLM's flag names where vLLM has one."""
    ap = argparse.ArgumentParser(prog="python -m replica", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    ap.add_argument("--served-model-name", nargs="+", metavar="NAME",
                    help="model names requests may use; the first labels the metrics (default: the preset)")
    ap.add_argument("--model-version", default="",
                    help="version served (v13 or chat-7b@v13): the models' root and a metrics label")
    ap.add_argument("--replica-id", default="", help="this replica's id (in logs and modelfleet_replica_info)")
    ap.add_argument("--region", default="", help="region this replica runs in")
    ap.add_argument("--seed", type=int, default=0, help="generation seed for requests that send none")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="model seconds per wall second: 10 runs ten times faster than real time")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="chat-7b", help="engine parameters to start from")
    ap.add_argument("--engine-params", default=None, metavar="JSON",
                    help="JSON object of EngineParams fields overriding the preset")
    ap.add_argument("--settle-url", default=None,
                    help="gateway_ext's settle endpoint: report the real usage of admitted requests")
    ap.add_argument("--control-plane-url", default=None,
                    help="the control plane's HTTP API: heartbeats every second")
    ap.add_argument("--advertise-host", default=None,
                    help="the address the control plane gives Envoy for this replica (default: --host)")
    ap.add_argument("--debug", action="store_true",
                    help="serve /v1/debug/engine (slow the engine down, make it fail)")
    ap.add_argument("--shutdown-timeout", type=float, default=None,
                    help="seconds open streams may take to finish after the drain grace, as "
                         "vLLM's --shutdown-timeout (default $MODELFLEET_SHUTDOWN_TIMEOUT_S or 10)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return ap.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ReplicaConfig:
    """The replica config the flags describe; raises ``ValueError`` on bad values."""
    params = preset(args.preset)
    if args.engine_params:
        params = params_from_json(args.engine_params, params)
    names = tuple(args.served_model_name or [args.preset])
    return ReplicaConfig(
        served_model_names=names,
        params=params,
        model_version=args.model_version,
        replica_id=args.replica_id,
        region=args.region,
        seed=args.seed,
        time_scale=args.time_scale,
        debug=args.debug,
    )


def middleware_settings(args: argparse.Namespace, config: ReplicaConfig) -> MiddlewareSettings:
    """The middleware's settings: flags, else ``MODELFLEET_*`` variables, else secret files.
    Raises ValueError (``pydantic.ValidationError``)."""
    model, _, version = config.model_version.rpartition("@")
    return MiddlewareSettings.from_env(
        replica_id=args.replica_id or None,
        host=args.advertise_host or (args.host if args.host not in ("0.0.0.0", "::") else None),
        port=args.port or None,
        region=args.region or None,
        model=model or (config.served_model_names[0].partition("@")[0]
                        if config.model_version else None),
        version=version or None,
        control_plane_url=args.control_plane_url,
        settle_url=args.settle_url,
        time_scale=args.time_scale,
        shutdown_timeout_s=args.shutdown_timeout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per beat and settle otherwise
    try:
        config = config_from_args(args)
        settings = middleware_settings(args, config)
    except (ValueError, OSError) as exc:  # OSError: an unreadable secrets directory
        print(f"replica: {exc}", file=sys.stderr)
        return 2
    app = serve_app(config, settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=False,
                timeout_graceful_shutdown=max(1, math.ceil(settings.shutdown_timeout_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
