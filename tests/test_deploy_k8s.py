"""The Kubernetes manifests in deploy/k8s hold together as Kubernetes reads them: every pod's
process can read the secrets mounted for it, and a process that keeps a data folder has it
on a volume it may write, not in the image's root-owned working directory."""

from __future__ import annotations

import re

import yaml

from doc_blocks import REPO

K8S = REPO / "deploy" / "k8s"
# The image runs as this user unless a pod says otherwise (deploy/Dockerfile's USER).
IMAGE_UID = int(re.search(r"^USER (\d+)$", (REPO / "deploy" / "Dockerfile").read_text(), re.M).group(1))


def pod_specs():
    """(file, name, pod spec) of every workload in deploy/k8s."""
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc["kind"] not in ("Deployment", "DaemonSet", "CronJob", "Job", "StatefulSet"):
                continue
            spec = doc["spec"]
            if doc["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            yield path.name, doc["metadata"]["name"], spec["template"]["spec"]


def test_there_are_workloads_to_check():
    names = {name for _, name, _ in pod_specs()}
    assert {"xirang-scheduler", "xirang-agent", "xirang-tune"} <= names


def test_every_pod_can_read_its_secrets():
    for where, name, pod in pod_specs():
        for container in pod["containers"]:
            uid = (container.get("securityContext") or {}).get(
                "runAsUser", (pod.get("securityContext") or {}).get("runAsUser", IMAGE_UID)
            )
            if uid == 0:
                continue
            group = (pod.get("securityContext") or {}).get("fsGroup")
            for volume in pod.get("volumes", []):
                if "secret" not in volume:
                    continue
                mode = volume["secret"].get("defaultMode", 0o644)
                readable = mode & 0o004 or (group is not None and mode & 0o040)
                assert readable, (
                    f"{where} {name}: {volume['name']} (mode {mode:o}) is unreadable by uid {uid}"
                )


def test_a_non_root_process_keeps_its_data_on_a_volume():
    for where, name, pod in pod_specs():
        for container in pod["containers"]:
            args = container.get("args", [])
            if args[:1] not in (["scheduler"], ["agent"]):
                continue  # the others keep nothing on disk
            assert "--data-dir" in args, f"{where} {name}: the data folder would be the image's WORKDIR"
            data = args[args.index("--data-dir") + 1]
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            assert data in mounts and not mounts[data].get("readOnly"), (
                f"{where} {name}: {data} is not a volume"
            )
