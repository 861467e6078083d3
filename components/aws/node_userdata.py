"""GPU node user data: stripe the NVMe instance store as RAID0 for the weights cache (pure).

EKS managed node groups on AL2023 take MIME multi-part user data in the launch template and add
their own ``nodeadm`` part; our shell part runs before the kubelet starts, so the cache exists
before any replica pod mounts it. The instance store is fast (several GB/s striped) and free, and
it is wiped when the instance stops: it is a cache, the bucket is the truth.
"""

from __future__ import annotations

import base64

from components.k8s.pool_manifests import WEIGHTS_HOST_PATH

MOUNT = "/mnt/nvme"
"""Where the RAID0 array is mounted; :data:`WEIGHTS_HOST_PATH` lies under it."""
BOUNDARY = "==MODELFLEET=="

RAID0_SCRIPT = f"""#!/bin/bash
# modelfleet: RAID0 over every NVMe instance-store disk, XFS, mounted at {MOUNT}.
set -euo pipefail
if mountpoint -q {MOUNT}; then mkdir -p {WEIGHTS_HOST_PATH}; exit 0; fi
mapfile -t disks < <(for d in /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do
  [[ -e "$d" && "$d" != *-part* ]] && readlink -f "$d"; done | sort -u)
mkdir -p {MOUNT}
if [ "${{#disks[@]}}" -eq 0 ]; then
  echo "modelfleet: no instance store; weights cache on the root volume" >&2
elif [ "${{#disks[@]}}" -eq 1 ]; then
  mkfs.xfs -f "${{disks[0]}}"
  mount -o noatime "${{disks[0]}}" {MOUNT}
else
  mdadm --create /dev/md/modelfleet --level=0 --raid-devices="${{#disks[@]}}" --force --run "${{disks[@]}}"
  mdadm --detail --scan >> /etc/mdadm.conf
  mkfs.xfs -f /dev/md/modelfleet
  mount -o noatime /dev/md/modelfleet {MOUNT}
  echo "/dev/md/modelfleet {MOUNT} xfs defaults,noatime,nofail 0 2" >> /etc/fstab
fi
mkdir -p {WEIGHTS_HOST_PATH}
"""


def user_data() -> str:
    """The MIME multi-part user data, as text."""
    return "\n".join([
        "MIME-Version: 1.0",
        f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"',
        "",
        f"--{BOUNDARY}",
        'Content-Type: text/x-shellscript; charset="us-ascii"',
        "",
        RAID0_SCRIPT,
        f"--{BOUNDARY}--",
        "",
    ])


def user_data_base64() -> str:
    """The user data base64-encoded, as a launch template takes it."""
    return base64.b64encode(user_data().encode()).decode()
