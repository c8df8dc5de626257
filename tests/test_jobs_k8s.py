"""The Kubernetes side of `trainbox status / logs / cancel / jobs`: trainbox renders, the cluster runs, so the
commands select the job's objects and pods by the label every one of them carries (trainbox.io/job=NAME) and
are printed (--dry-run, or no kube context here) or run (a kubectl with a current context: here a stand-in
kubectl that records its argv, the one thing this machine cannot have is a cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

KINDS = "ascendjobs.mindxdl.gitee.com,jobs.batch.volcano.sh,pytorchjobs.kubeflow.org,rayjobs.ray.io"


def tb(env, *args):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def env(tmp_path):
    bare = tmp_path / "bin"  # no kubectl on this PATH
    bare.mkdir()
    path = ":".join(p for p in os.environ["PATH"].split(":") if not os.path.exists(os.path.join(p, "kubectl")))
    return dict(os.environ, TRAINBOX_CACHE=str(tmp_path / "cache"), PATH=f"{bare}:{path}")


def test_the_exact_commands_for_a_rendered_job(env):
    render = tb(env, "launch", "render", "cpu-ddp", "--target", "pytorchjob", "--nodes", "2", "--image",
                "registry.example/trainbox/cpu:1", "--name", "ddp-run-7", "--namespace", "ml")
    assert render.returncode == 0, render.stderr
    assert "trainbox: job ddp-run-7 (`trainbox status|logs|cancel ddp-run-7 --namespace ml`)" in render.stderr
    assert "# job ddp-run-7: every object and pod is labelled trainbox.io/job=ddp-run-7" in render.stdout
    for doc in yaml.safe_load_all(render.stdout):  # what the commands select by is on every object and pod
        assert doc["metadata"]["labels"]["trainbox.io/job"] == "ddp-run-7"
        for role in doc.get("spec", {}).get("pytorchReplicaSpecs", {}).values():
            assert role["template"]["metadata"]["labels"]["trainbox.io/job"] == "ddp-run-7"
    ns = ["-n", "ml"]
    sel = ["-l", "trainbox.io/job=ddp-run-7"]
    expect = {
        "cancel": [["kubectl", "delete", f"{KINDS},configmaps", *sel, *ns, "--wait=false"]],
        "status": [["kubectl", "get", KINDS, *sel, *ns], ["kubectl", "get", "pods", *sel, *ns, "-o", "wide"]],
        "logs": [["kubectl", "logs", *sel, *ns, "--all-containers", "--prefix", "--tail=-1",
                  "--max-log-requests=64", "-f"]],
    }
    for action, cmds in expect.items():
        extra = ["-f", "--dry-run"] if action == "logs" else ["--dry-run"] if action == "cancel" else []
        out = tb(env, action, "ddp-run-7", "--namespace", "ml", *extra)
        if action == "status":  # status has no --dry-run: without a kube context it prints and refuses
            assert out.returncode == 2 and "no kube context" in out.stderr
        else:
            assert out.returncode == 0, out.stderr
        assert [line.split() for line in out.stdout.splitlines()] == cmds
    nothing = tb(env, "cancel", "ddp-run-7", "--namespace", "ml")
    assert nothing.returncode == 2 and "no kube context" in nothing.stderr  # printed, not pretended
    assert nothing.stdout.split() == expect["cancel"][0]


def test_with_a_kube_context_the_commands_run(env, tmp_path):
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "kubectl-calls"
    kubectl = bin_dir / "kubectl"  # stand-in: a context exists; every call is recorded
    kubectl.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                       f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                       "print('ctx' if sys.argv[1:3] == ['config', 'current-context'] else 'deleted')\n")
    kubectl.chmod(0o755)
    out = tb(env, "cancel", "ddp-run-7", "--namespace", "ml")
    assert out.returncode == 0 and "deleted" in out.stdout, out.stderr
    argv = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argv == [["config", "current-context"],
                    ["delete", f"{KINDS},configmaps", "-l", "trainbox.io/job=ddp-run-7", "-n", "ml", "--wait=false"]]
    listed = json.loads(tb(env, "jobs", "--k8s", "--json").stdout)
    assert listed["kubernetes"]["command"] == ["kubectl", "get", KINDS, "-l", "app.kubernetes.io/managed-by=trainbox",
                                               "-L", "trainbox.io/job", "--all-namespaces"]
    assert listed["kubernetes"]["exit_code"] == 0
