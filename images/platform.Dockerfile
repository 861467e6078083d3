# syntax=docker/dockerfile:1.7
# The platform's own services, one image, three commands (set by the IaC, components/k8s/):
#   control plane:  python -m envoy_control --config /etc/modelfleet/config --xds-port 18000 ...
#                   (control_plane.py)
#   gateway_ext:    python -m gateway_ext --config /etc/modelfleet/config --port 8080 ...
#                   (gateway.py)
#   batch service:  python -m batch --config /etc/modelfleet/config --port 8091 ...
#                   (batch_service.py)
# It installs only the extras of those three, `.[gateway,control-plane,batch]`, pinned by the
# lock (requirements/constraints.txt): no Pulumi, no Envoy binary, no matplotlib, no test tools.
# Build from the repository root:
#   docker build -f images/platform.Dockerfile -t <registry>/platform:<tag> .
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/modelfleet

# The three extras' dependencies first, from the lock: this layer survives source changes.
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt requirements/extras.py requirements/
RUN python requirements/extras.py requirements gateway control-plane batch > /tmp/requirements.txt \
 && pip install -c requirements/constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the project. setuptools' package list names every package folder, so the build needs them
# all (sources only: the extras above decide what is installed besides).
COPY modelfleet/ modelfleet/
COPY envoy/ envoy/
COPY gateway_ext/ gateway_ext/
COPY batch/ batch/
COPY replica/ replica/
COPY replica_middleware/ replica_middleware/
COPY autoscale/ autoscale/
COPY sim/ sim/
COPY components/ components/
RUN pip install -c requirements/constraints.txt ".[gateway,control-plane,batch]" \
 && python -c "import envoy_control.__main__, envoy_control.api.http, gateway_ext.__main__, gateway_ext.service, batch.service" \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin modelfleet

USER 10001
EXPOSE 8080 8081 8091 18000
CMD ["python", "-m", "envoy_control", "--help"]
