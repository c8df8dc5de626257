"""NPU manifests as MindCluster schedules them. Each rule names its source: the Ascend mind-cluster repository
(gitcode.com/Ascend/mind-cluster, mirrored on GitHub), read at the v26.1.0 line the vendored CRDs come from."""

from __future__ import annotations

import pytest

from k8s_schema import load_docs
from trainbox.launch.k8s import ACCELERATOR_TYPES, NPU_RESOURCE
from trainbox.launch.targets import RenderOptions, render_target, resolve_for
from trainbox.launch.recipe import all_inputs, load_recipe
from trainbox.runtime.errors import TrainboxError

A3 = "specforge-domino-qwen35-4b-npu"  # torchrun, 8 cards a node, an A3 stack whose data parallelism scales
# torchrun, 8 cards a node, scaling, on a 910B (A2) stack (the 910B Twinkle recipes fix their mesh to one node)
A2, A2_STACK = "specforge-domino-qwen35-4b-npu", {"stack_name": "npu-910b"}
A2_SMALL = "swift-megatron-qwen35-8npu"  # a 910B recipe that also runs on 2 cards (card-910b-2 servers)


def _inputs(name: str) -> dict[str, str]:
    return {n: f"/data/{n.lower()}" if spec.kind == "path" else "x" for n, spec in all_inputs(load_recipe(name)).items()
            if spec.required and n not in ("MASTER_ADDR", "NODE_RANK")}


def _render(name: str, target: str, accelerator: str | None = None, **kw) -> dict:
    job = resolve_for(target, name, sets=_inputs(name), image="registry.example/trainbox/x@sha256:" + "0" * 64, **kw)
    _cm, obj = load_docs(render_target(job, target, RenderOptions(accelerator)))
    return obj


def _templates(obj: dict) -> list[dict]:
    from k8s_schema import pod_templates

    return pod_templates(obj)


# --- sp-block: ascend-for-volcano internal/npu/ascend910/ascend910a3/superpod/frame.go ------------------------------
def test_multi_node_super_pod_job_with_fewer_than_16_cards_a_pod_is_refused():
    # CheckTaskNPU: "distributed super-pod job require npu(..) should be equal to node npu(16)"
    for target in ("ascendjob", "volcano"):
        with pytest.raises(TrainboxError, match="requests all 16 cards of its node.*--nproc-per-node 16"):
            _render(A3, target, nodes=2)


@pytest.mark.parametrize("target", ["ascendjob", "volcano"])
def test_multi_node_super_pod_job_requests_16_a_pod_and_the_total_is_a_multiple_of_sp_block(target):
    obj = _render(A3, target, nodes=2, nproc_per_node=16)
    block = int(obj["metadata"]["annotations"]["sp-block"])
    requests = [c["resources"]["requests"][NPU_RESOURCE] for t in _templates(obj) for c in t["spec"]["containers"]]
    assert set(requests) == {16}  # CheckTaskNPU: each task asks for the node's 16 cards
    assert block % 16 == 0  # checkSpBlock: sp-block a multiple of the node's cards
    assert (2 * 16) % block == 0  # checkRequireNPU: the job's cards a multiple of sp-block


def test_one_node_super_pod_job_has_sp_block_equal_to_its_cards():
    # checkRequireNPU, NPUTaskNum == 1: "the sp-block in annotations of standalone super-pod job should equal
    # to required npu num"
    obj = _render(A3, "ascendjob")
    assert obj["metadata"]["annotations"]["sp-block"] == "8"


def test_sp_block_only_on_super_pod_nodes():
    # full-NPU scheduling guide, the sp-block row: "only on Atlas 900 A3 SuperPoD"
    for obj in (_render(A3, "ascendjob", "module-a3-16", nodes=2), _render(A2, "ascendjob", nodes=2, **A2_STACK)):
        assert "sp-block" not in obj["metadata"]["annotations"]


# --- accelerator-type: ascend-for-volcano common/util/constants.go (Module910bx8AcceleratorType, ...) -------------
@pytest.mark.parametrize("accelerator", sorted(ACCELERATOR_TYPES))
def test_every_documented_node_type_can_be_chosen(accelerator):
    chip, cards = ACCELERATOR_TYPES[accelerator]
    name = A3 if chip == "a3" else A2 if cards >= 8 else A2_SMALL
    kw = {"nproc_per_node": cards} if cards < 8 else A2_STACK if chip == "910b" else {}
    obj = _render(name, "ascendjob", accelerator, **kw)
    for t in _templates(obj):
        assert t["spec"]["nodeSelector"] == {"accelerator-type": accelerator}


def test_the_documented_values_are_the_ones_offered():
    assert set(ACCELERATOR_TYPES) == {"module-910b-8", "module-910b-16", "card-910b-2", "module-a3-16",
                                      "module-a3-16-super-pod", "module-a3-8-super-pod"}


def test_a_node_type_of_another_chip_or_too_few_cards_is_refused():
    with pytest.raises(TrainboxError, match="a3 stack runs on nodes labelled"):
        _render(A3, "ascendjob", "module-910b-8")
    with pytest.raises(TrainboxError, match="its nodes have 2 cards"):
        _render(A2, "ascendjob", "card-910b-2", **A2_STACK)
    with pytest.raises(TrainboxError, match="only for Ascend"):
        _render("cpu-ddp", "volcano", "module-910b-8")


# --- Volcano Job and PyTorchJob on NPU: ring-controller label, visible devices from Volcano's annotation ----------
@pytest.mark.parametrize("target", ["volcano", "pytorchjob", "ascendjob"])
def test_npu_pods_carry_ring_controller_and_the_annotation_env(target):
    obj = _render(A2, target, nodes=2, **A2_STACK)
    # ascend-common api/consts.go AtlasTaskLabel = "ring-controller.atlas"; JobKind910BValue = "ascend-910b"
    assert obj["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    for t in _templates(obj):
        assert t["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
        for c in t["spec"]["containers"]:
            # ascend-device-plugin pkg/server/plugin.go GetRealAllocateDevicesFromEnv: the env's fieldPath must be
            # exactly metadata.annotations['huawei.com/Ascend910']
            env = [e for e in c["env"] if e["name"] == "ASCEND_VISIBLE_DEVICES"]
            assert env == [{"name": "ASCEND_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['huawei.com/Ascend910']"}}}]
        if target == "pytorchjob":  # Volcano writes that annotation: the pods must be scheduled by it
            assert t["spec"]["schedulerName"] == "volcano"


def test_cpu_pods_get_none_of_it():
    obj = _render("cpu-ddp", "pytorchjob", nodes=2)
    assert "ring-controller.atlas" not in obj["metadata"]["labels"]
    assert all(e["name"] != "ASCEND_VISIBLE_DEVICES" for t in _templates(obj) for c in t["spec"]["containers"]
               for e in c["env"])
