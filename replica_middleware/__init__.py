"""The ASGI middleware every replica runs, inside real ``vllm serve`` (``--middleware
replica_middleware.middleware.ModelfleetMiddleware``) or the simulated engine: tokens in flight,
heartbeats, held headers, the final usage event, settles. It imports only
:mod:`modelfleet.contract`, the settings base :mod:`modelfleet.settings`, the standard library and
what vLLM already brings."""
