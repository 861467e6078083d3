# syntax=docker/dockerfile:1.7
# vLLM with the modelfleet middleware. The IaC sets the command (components/k8s/engine_args.py):
#   vllm serve /weights/<model>/<version> ... --middleware replica_middleware.middleware.ModelfleetMiddleware
# The tag is pinned: v0.30.0 has --shutdown-timeout (draining) and --middleware.
# Only the middleware is added: the `middleware` extra's dependencies and the two packages it
# imports (replica_middleware, modelfleet.contract); nothing else of the project.
# Build from the repository root:
#   docker build -f images/vllm.Dockerfile -t <registry>/vllm:<tag> .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.30.0
FROM ${VLLM_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    PYTHONPATH=/opt/modelfleet/python
WORKDIR /opt/modelfleet

# The `middleware` extra from the lock, except that whatever vLLM's image already has keeps
# vLLM's version (extras.py constraints): vLLM brings starlette, httpx, prometheus-client and
# pydantic; only what it lacks (pydantic-settings) comes from the lock. An extra's range that
# vLLM's pins do not meet fails the build here instead of moving vLLM's packages.
COPY pyproject.toml ./
COPY requirements/constraints.txt requirements/extras.py requirements/
RUN python3 requirements/extras.py requirements middleware > /tmp/requirements.txt \
 && python3 requirements/extras.py constraints requirements/constraints.txt > /tmp/constraints.txt \
 && python3 -m pip install -c /tmp/constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt /tmp/constraints.txt

# The middleware and what it imports of modelfleet (the contract, the settings base), on PYTHONPATH. The project itself is not built
# here: its package list names every package, and the middleware needs none of the others.
COPY modelfleet/__init__.py modelfleet/py.typed modelfleet/settings.py python/modelfleet/
COPY modelfleet/contract/ python/modelfleet/contract/
COPY replica_middleware/ python/replica_middleware/
RUN python3 -c "from replica_middleware.middleware import ModelfleetMiddleware"

ENTRYPOINT []
CMD ["vllm", "serve", "--help"]
