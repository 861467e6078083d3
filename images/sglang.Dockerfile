# syntax=docker/dockerfile:1.7
# SGLang for versions whose engine is sglang, with the modelfleet package installed.
# SGLang has no --middleware option: see docs/deploy.md for what this variant lacks.
# Build from the repository root:
#   docker build -f images/sglang.Dockerfile -t <registry>/sglang:<tag> .
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.4
FROM ${SGLANG_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
WORKDIR /opt/modelfleet
COPY pyproject.toml README.md ./
COPY modelfleet/ modelfleet/
COPY envoy/ envoy/
COPY gateway_ext/ gateway_ext/
COPY autoscale/ autoscale/
COPY replica/ replica/
COPY sim/ sim/
COPY components/ components/
RUN pip install --no-deps . && python3 -c "import replica"

ENTRYPOINT []
CMD ["python3", "-m", "sglang.launch_server", "--help"]
