# syntax=docker/dockerfile:1.7
# vLLM with the modelfleet middleware (`vllm serve --middleware replica_middleware.middleware.ModelfleetMiddleware`).
# The tag is pinned: v0.30.0 has --shutdown-timeout (draining) and --middleware.
# Build from the repository root:
#   docker build -f images/vllm.Dockerfile -t <registry>/vllm:<tag> .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.30.0
FROM ${VLLM_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
WORKDIR /opt/modelfleet
COPY pyproject.toml README.md ./
COPY modelfleet/ modelfleet/
COPY envoy/ envoy/
COPY gateway_ext/ gateway_ext/
COPY autoscale/ autoscale/
COPY replica/ replica/
COPY sim/ sim/
COPY components/ components/
# --no-deps: vLLM's image pins torch, fastapi, pydantic, prometheus-client and httpx, which the
# middleware uses; the project's other dependencies (Pulumi, Envoy, ...) have no place here and
# must not move vLLM's pins. The import check fails the build if the middleware is missing.
RUN pip install --no-deps . \
 && python3 -c "from replica_middleware.middleware import ModelfleetMiddleware"

# The IaC sets the command: vllm serve /weights/<model>/<version> ... (components/k8s/engine_args.py)
ENTRYPOINT []
CMD ["vllm", "serve", "--help"]
