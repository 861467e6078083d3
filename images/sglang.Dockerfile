# syntax=docker/dockerfile:1.7
# SGLang for versions whose engine is sglang. The IaC sets the command
# (components/k8s/engine_args.py: sglang_command):
#   python3 -m sglang.launch_server --model-path /weights/<model>/<version> ...
# which runs nothing of modelfleet: SGLang has no --middleware (see docs/deploy.md for what this
# variant lacks), so this image adds no project package and no dependency; it pins SGLang's
# image under the platform's registry and tag. A launcher that wraps SGLang's app with the
# middleware would install the `middleware` extra as images/vllm.Dockerfile does.
# Build from the repository root:
#   docker build -f images/sglang.Dockerfile -t <registry>/sglang:<tag> .
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.4
FROM ${SGLANG_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1

ENTRYPOINT []
CMD ["python3", "-m", "sglang.launch_server", "--help"]
