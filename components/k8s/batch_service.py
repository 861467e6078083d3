"""The batch service's Kubernetes objects (``python -m batch``): the
``/v1/batches`` and ``/v1/files`` API and the worker that sends batch lines back through the
region's Envoy at tier ``batch``.

One pod (``Recreate``): ``/v1/files`` uploads live on a PersistentVolumeClaim, and the worker's
durable state (batches, lines, leases) lives in the metering database, so a restarted pod resumes
where the last one stopped. The worker sends each line with its team's key; the keys come from the
Secret ``modelfleet-batch-keys`` (``keys.json``: ``{team: key}``), which operators create out of
band (keys never enter the config or the Pulumi state). ``s3://`` inputs and outputs must lie
under one of ``buckets`` (``bucket/prefix/{team}/`` gives each team its own prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.k8s import service_manifests as sm

BATCH = "batch"
BATCH_PORT = 8091
KEYS_SECRET = "modelfleet-batch-keys"
FILES_CLAIM = "batch-files"


def batch_host(namespace: str) -> str:
    """The batch Service's cluster DNS name (Envoy's static ``modelfleet_batch`` cluster)."""
    return f"{BATCH}.{namespace}.svc.cluster.local"


def batch_objects(namespace: str, image: str, buckets: Sequence[str] = (),
                  files_storage: str = "50Gi") -> list[dict[str, Any]]:
    """PersistentVolumeClaim, Deployment and Service of the batch service. ``files_storage`` is
    the uploads volume's size (Kubernetes quantity)."""
    api = f"http://envoy.{namespace}.svc.cluster.local:{sm.LISTENER_PORT}/v1"
    args = ["--config", sm.CONFIG_MOUNT, "--host", "0.0.0.0", "--port", str(BATCH_PORT),
            "--api-base-url", api, "--team-keys", "/etc/modelfleet/batch-keys/keys.json",
            "--files-dir", "/var/lib/batch/files"]
    for bucket in buckets:
        args += ["--s3-bucket", bucket]
    c = sm.container(
        BATCH, image, command=["python", "-m", "batch"], args=args,
        ports={"http": BATCH_PORT}, health=("/health", "http"), cpu="500m", memory="1Gi",
        mounts=[{"name": "config", "mountPath": sm.CONFIG_MOUNT, "readOnly": True},
                {"name": "keys", "mountPath": "/etc/modelfleet/batch-keys", "readOnly": True},
                {"name": "files", "mountPath": "/var/lib/batch"}],
        extra={"envFrom": [{"secretRef": {"name": sm.DB_SECRET}}]})
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": sm.meta(FILES_CLAIM, namespace),
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": files_storage}}}}
    volumes = [{"name": "config", "configMap": {"name": sm.CONFIG_MAP}},
               {"name": "keys", "secret": {"secretName": KEYS_SECRET}},
               {"name": "files", "persistentVolumeClaim": {"claimName": FILES_CLAIM}}]
    return [claim,
            sm.deployment(BATCH, namespace, replicas=1, containers=[c], volumes=volumes,
                          strategy="Recreate"),
            sm.service(BATCH, namespace, {"http": BATCH_PORT})]
