"""Validate Kubernetes manifests offline: custom resources against the vendored CRDs' openAPIV3Schema
(../shared/k8s-crds, converted to JSON Schema), core objects and pod templates against the Kubernetes core
schema (kubernetes-validate's bundled schemas, strict: unknown fields are errors).

What this cannot check: CEL rules (x-kubernetes-validations), list-map key uniqueness, operator webhooks and
admission (quota, device plugin resources that exist, node selectors that match a node).
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CRD_FILES = {("mindxdl.gitee.com", "AscendJob"): "ascend-operator.yaml",
             ("batch.volcano.sh", "Job"): "batch.volcano.sh_jobs.yaml",
             ("kubeflow.org", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
             ("ray.io", "RayJob"): "ray.io_rayjobs.yaml"}
K8S_VERSION = "1.31.0"


def crd_dir() -> Path | None:
    """TRAINBOX_K8S_CRDS, else shared/k8s-crds beside the repository (CI: repo and shared/ side by side), else
    the nearest shared/k8s-crds above it (a git worktree nested deeper)."""
    env = os.environ.get("TRAINBOX_K8S_CRDS")
    if env:
        return Path(env)
    for parent in REPO_ROOT.parents:
        d = parent / "shared" / "k8s-crds"
        if d.is_dir():
            return d
    return None


def to_json_schema(node, strict: bool = True):
    """The OpenAPI v3 subset CRDs use -> JSON Schema (draft 2020-12). int-or-string becomes integer|string,
    nullable adds null; objects with properties reject unknown keys (the API server would prune them
    silently), unless x-kubernetes-preserve-unknown-fields says keep them."""
    if isinstance(node, list):
        return [to_json_schema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("format", "example", "externalDocs"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: to_json_schema(v, strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = to_json_schema(value, strict)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}] + out.get("anyOf", [])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if strict and "properties" in out and "additionalProperties" not in out \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    out.pop("nullable", None)
    return out


@functools.lru_cache(maxsize=None)
def crd_schema(group: str, kind: str, version: str) -> dict:
    d = crd_dir()
    assert d is not None, "no shared/k8s-crds found (set TRAINBOX_K8S_CRDS)"
    # libyaml's loader where PyYAML has it: the CRDs are megabytes, 5 s each through the pure-Python one
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for doc in yaml.load_all((d / CRD_FILES[(group, kind)]).read_text(), Loader=loader):
        if doc and doc.get("kind") == "CustomResourceDefinition" and doc["spec"]["names"]["kind"] == kind:
            for v in doc["spec"]["versions"]:
                if v["name"] == version:
                    return to_json_schema(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    raise KeyError(f"{group}/{version} {kind}")


def crd_errors(obj: dict) -> list[str]:
    import jsonschema

    group, version = obj["apiVersion"].split("/")
    schema = crd_schema(group, obj["kind"], version)
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def core_errors(obj: dict) -> list[str]:
    """A core object (ConfigMap, PodTemplate) against Kubernetes' own schema, strict."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def pod_templates(obj: dict) -> list[dict]:
    """Every pod template inside a job manifest, wherever its kind keeps them."""
    spec = obj["spec"]
    if obj["kind"] == "AscendJob":
        return [r["template"] for r in spec["replicaSpecs"].values()]
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Job":
        return [t["template"] for t in spec["tasks"]]
    if obj["kind"] == "RayJob":
        c = spec["rayClusterSpec"]
        return [c["headGroupSpec"]["template"]] + [g["template"] for g in c.get("workerGroupSpecs", [])]
    raise KeyError(obj["kind"])


def load_docs(text: str) -> list:
    """yaml.safe_load_all with libyaml's loader where PyYAML has it: the same documents, a tenth of the CPU (the
    k8s tests parse a few hundred manifests)."""
    return list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def manifest_errors(text: str) -> list[str]:
    errors = []
    for doc in load_docs(text):
        if doc["apiVersion"] == "v1":
            errors += [f"{doc['kind']}: {e}" for e in core_errors(doc)]
            continue
        errors += [f"{doc['kind']}: {e}" for e in crd_errors(doc)]
        for i, tmpl in enumerate(pod_templates(doc)):
            pt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"}, "template": tmpl}
            errors += [f"{doc['kind']} pod template {i}: {e}" for e in core_errors(pt)]
    return errors
