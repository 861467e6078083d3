# syntax=docker/dockerfile:1.7
# The platform's own services, one image, two commands (set by the IaC):
#   control plane:  python -m envoy_control --config /etc/modelfleet/config ...
#   gateway_ext:    python -m gateway_ext --host 0.0.0.0 --port 8080 ...
# Build from the repository root:
#   docker build -f images/platform.Dockerfile -t <registry>/platform:<tag> .
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/modelfleet

# Every package folder pyproject lists must be present for the install.
COPY pyproject.toml README.md ./
COPY modelfleet/ modelfleet/
COPY envoy/ envoy/
COPY gateway_ext/ gateway_ext/
COPY autoscale/ autoscale/
COPY replica/ replica/
COPY sim/ sim/
COPY components/ components/
RUN pip install . \
 && python -c "import envoy_control.__main__, gateway_ext" \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin modelfleet

USER 10001
EXPOSE 8080 8081 18000
CMD ["python", "-m", "envoy_control", "--help"]
