"""The megatron-core 0.15.3 series against the real wheel from PyPI, on CPU.

For every patch there is a check that imports the patched tree in a subprocess and exercises the functions the
patch changed. Each check must pass on the tree with the series applied up to and including its patch, and fail,
with the error the patch exists to remove, on the tree just before it. The wheel is fetched once into the
trainbox cache (hash-checked against the npu-910b pin); later runs are offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainbox.supply import patches
from trainbox.paths import REPO_ROOT
from trainbox.supply.fetch import fetch, pin_from_component
from trainbox.supply.sources import unpack
from trainbox.specs.stack import load_stack

pytestmark = [pytest.mark.network, pytest.mark.slow]

AP = patches.applier()
SERIES = REPO_ROOT / "patches" / "megatron-core"
NO_CUDA = "Torch not compiled with CUDA enabled"
# megatron-core 0.16.0's x86_64 cp311 wheel: a pin the series was not made for
MCORE_016_SHA = "7891ab8207a91ea75e80347bd5014ba4f1a85265b1e203643d3449a4e3826bd3"

# One process per tree runs every check; setup that works on the pristine tree comes first.
HARNESS = textwrap.dedent(
    r'''
    import json, math, sys, traceback, warnings
    from datetime import timedelta
    import torch, torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(1, 1)
    results = {}

    def check(fn):
        try:
            fn()
            results[fn.__name__] = "ok"
        except BaseException as exc:  # noqa: BLE001 - report every failure by name
            results[fn.__name__] = f"{type(exc).__name__}: {exc}"

    @check
    def p0001_global_memory_buffer():
        from megatron.core.utils import GlobalMemoryBuffer
        buf = GlobalMemoryBuffer()
        t = buf.get_tensor((2, 3), torch.float32, "x")
        assert t.shape == (2, 3) and t.device.type == "cpu"
        assert buf.get_tensor((3,), torch.float32, "x").data_ptr() == t.data_ptr()  # reused, not reallocated
        assert ps.get_global_memory_buffer().get_tensor((4,), torch.float16, "y").device.type == "cpu"

    @check
    def p0002_rng_tracker_and_checkpoint():
        from megatron.core.tensor_parallel import random as r
        r.model_parallel_cuda_manual_seed(1234, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
        tracker = r.get_cuda_rng_tracker()
        torch.manual_seed(0)
        outside = torch.get_rng_state()
        with tracker.fork():
            a = torch.rand(4)
        assert torch.equal(torch.get_rng_state(), outside), "fork did not restore the outer state"
        with tracker.fork():
            b = torch.rand(4)
        assert not torch.equal(a, b), "the tracked state did not advance"
        r.model_parallel_cuda_manual_seed(1234, tp_rank=0, ep_rank=0, etp_rank=0)
        with r.get_cuda_rng_tracker().fork():
            assert torch.equal(torch.rand(4), a), "same seed, different stream"
        r.model_parallel_cuda_manual_seed(1234, tp_rank=1, ep_rank=0, etp_rank=0)
        with r.get_cuda_rng_tracker().fork():
            assert not torch.equal(torch.rand(4), a), "tp ranks must get different streams"
        # activation checkpointing recomputes dropout with the saved RNG states
        x = torch.randn(16, 8, requires_grad=True)
        def f(t):
            with r.get_cuda_rng_tracker().fork():
                return torch.nn.functional.dropout(t * 2, 0.5, training=True)
        y = r.checkpoint(f, False, x)
        y.sum().backward()
        assert torch.equal(x.grad != 0, y.detach() != 0), "recomputed dropout mask differs"

    @check
    def p0003_tensor_parallel_layers_on_current_device():
        from megatron.core import tensor_parallel as tp
        from megatron.core.model_parallel_config import ModelParallelConfig
        tp.model_parallel_cuda_manual_seed(123, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
        cfg = ModelParallelConfig(use_cpu_initialization=False, perform_initialization=True,
                                  params_dtype=torch.float32)
        init = torch.nn.init.normal_
        emb = tp.VocabParallelEmbedding(16, 8, init_method=init, config=cfg)
        col = tp.ColumnParallelLinear(8, 6, config=cfg, init_method=init, bias=True, gather_output=True)
        row = tp.RowParallelLinear(6, 4, config=cfg, init_method=init, bias=True, input_is_parallel=True,
                                   skip_bias_add=False)
        assert {p.device.type for p in (emb.weight, col.weight, row.weight)} == {"cpu"}
        h, _ = col(emb(torch.tensor([[1, 2, 3]])))
        y, _ = row(h)
        y.sum().backward()
        assert y.shape == (1, 3, 4) and col.weight.grad is not None
        chunk = tp.split_tensor_into_1d_equal_chunks(torch.arange(12.0), new_buffer=True)
        assert tp.gather_split_1d_tensor(chunk).tolist() == list(range(12))
        out = tp.broadcast_data(["tokens"], {"tokens": torch.arange(6).view(2, 3)}, torch.int64)
        assert out["tokens"].tolist() == [[0, 1, 2], [3, 4, 5]]

    @check
    def p0004_grad_clipping():
        from megatron.core.optimizer.clip_grads import (
            clip_grad_by_total_norm_fp32, count_zeros_fp32, get_grad_norm_fp32)
        from megatron.core.utils import local_multi_tensor_l2_norm
        g1, g2 = torch.tensor([3.0, 0.0]), torch.tensor([[4.0, 0.0], [0.0, 12.0]])
        assert abs(get_grad_norm_fp32([g1, g2]) - 13.0) < 1e-5
        assert abs(get_grad_norm_fp32([g1, g2], norm_type=math.inf) - 12.0) < 1e-6
        norm, _ = local_multi_tensor_l2_norm(2048, None, [[g1, g2]], False)
        assert abs(norm.item() - 13.0) < 1e-5
        p1, p2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, 2))
        p1.grad, p2.grad = g1.clone(), g2.clone()
        clip_grad_by_total_norm_fp32([p1, p2], max_norm=1.0, total_norm=13.0)
        assert abs(get_grad_norm_fp32([p1.grad, p2.grad]) - 1.0) < 1e-4
        assert count_zeros_fp32([p1, p2], grad_stats_parallel_group=ps.get_model_parallel_group()) == 3

    @check
    def p0005a_update_pg_timeout():
        ps.update_pg_timeout(timedelta(minutes=3))

    @check
    def p0005b_nccl_options_without_nccl():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert ps.get_nccl_options("dp", {"dp": {"is_high_priority_stream": True}}) is None

    @check
    def p0005c_gloo_group_under_a_bound_default_group():
        # Stand-in for an HCCL default group made with init_process_group(device_id=npu:0): torch_npu
        # registers the npu device type as PrivateUse1.
        pg = dist.distributed_c10d._get_default_group()
        pg.bound_device_id = torch.device("privateuseone", 0)
        try:
            g = ps.create_group([0], backend="gloo", group_desc="TEST_GLOO")
            t = torch.ones(2)
            dist.all_reduce(t, group=g)
            assert t.tolist() == [1.0, 1.0]
            assert pg.bound_device_id == torch.device("privateuseone", 0), "binding not restored"
        finally:
            pg.bound_device_id = None

    print("RESULTS " + json.dumps(results))
    '''
)

# check name -> (patch number it belongs to, text its failure shows on the tree before that patch)
CHECKS = {
    "p0001_global_memory_buffer": (1, NO_CUDA),
    "p0002_rng_tracker_and_checkpoint": (2, NO_CUDA),
    "p0003_tensor_parallel_layers_on_current_device": (3, NO_CUDA),
    "p0004_grad_clipping": (4, NO_CUDA),
    "p0005a_update_pg_timeout": (5, NO_CUDA),
    "p0005b_nccl_options_without_nccl": (5, "ProcessGroupNCCL"),
    "p0005c_gloo_group_under_a_bound_default_group": (5, "No backend type associated with device type privateuseone"),
}


def _subprocess_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), CUDA_VISIBLE_DEVICES="")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # an installed torch_npu must not decide the device here
    return env


@pytest.fixture(scope="module")
def mcore_pin():
    comp = load_stack("npu-910b").components["megatron-core"]
    stack = load_stack("npu-910b")
    assert comp.version == "0.15.3" and comp.patches == "megatron-core"
    return pin_from_component(comp, stack)


@pytest.fixture(scope="module")
def trees(mcore_pin, tmp_path_factory):
    """tree k = the pinned wheel's contents with the first k patches of the series applied."""
    series = AP.load_series(SERIES)
    fetched = fetch(mcore_pin)
    root = tmp_path_factory.mktemp("mcore")
    out = []
    for k in range(len(series) + 1):
        tree = unpack(fetched, root / f"tree{k}")
        if k:
            results = AP.apply_series(series[:k], tree)
            assert all(r.status == "clean" for r in results), [r.describe() for r in results]
        out.append(tree)
    return out


@pytest.fixture(scope="module")
def results(trees, tmp_path_factory):
    if importlib.util.find_spec("numpy") is None:
        pytest.fail("megatron-core imports numpy, which is not installed: `pip install numpy` (the [dev] extra)")
    script = tmp_path_factory.mktemp("harness") / "harness.py"
    script.write_text(HARNESS)

    def run(tree: Path) -> dict:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                              env=_subprocess_env(tree), cwd=str(tree.parent))
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
        assert line, f"harness failed on {tree.name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return json.loads(line[len("RESULTS "):])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(run, trees))


def test_series_covers_every_patch():
    names = AP.read_series(SERIES)
    assert len(names) == 5
    assert {n for n, _ in CHECKS.values()} == set(range(1, len(names) + 1))


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_patch_check_passes_with_its_patch_and_fails_without(results, check):
    number, failure = CHECKS[check]
    before, with_patch, full = results[number - 1], results[number], results[-1]
    assert with_patch[check] == "ok", f"{check} on the tree with patches 1..{number}: {with_patch[check]}"
    assert full[check] == "ok", f"{check} on the fully patched tree: {full[check]}"
    assert before[check] != "ok", f"{check} passes without patch {number}: the check does not test it"
    assert failure in before[check], f"{check} fails for another reason without patch {number}: {before[check]}"


def test_pristine_tree_fails_every_check(results):
    assert all(v != "ok" for v in results[0].values()), results[0]


def test_sequence_parallel_mappings_at_tp2(trees, tmp_path):
    """0003's gather/scatter buffers at tensor-parallel size 2 (two gloo processes on this host)."""
    script = tmp_path / "tp2.py"
    script.write_text(textwrap.dedent(
        '''
        import sys, torch, torch.distributed as dist, torch.multiprocessing as mp

        def work(rank, path):
            dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
            from megatron.core import parallel_state as ps
            ps.initialize_model_parallel(2, 1)
            from megatron.core.tensor_parallel import mappings as m
            x = torch.full((2, 3), float(rank))
            g = m.gather_from_sequence_parallel_region(x)
            assert g.shape == (4, 3) and g[:2].eq(0).all() and g[2:].eq(1).all(), g
            r = m.reduce_scatter_to_sequence_parallel_region(torch.ones(4, 3))
            assert r.shape == (2, 3) and r.eq(2).all(), r
            assert m.all_gather_last_dim_from_tensor_parallel_region(x).shape == (2, 6)
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(work, args=(sys.argv[1],), nprocs=2)
            print("TP2-OK")
        '''
    ))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=600, env=_subprocess_env(trees[-1]))
    assert "TP2-OK" in proc.stdout, proc.stderr[-3000:]


def trainbox_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_verify_npu_910b_passes():
    proc = trainbox_cli("patches", "verify", "npu-910b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("npu-910b")]
    assert len(rows) == 5 and all(ln.endswith("  clean") for ln in rows), proc.stdout
    proc = trainbox_cli("patches", "verify", "npu-910b", "--offline", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True


def test_verify_fails_when_the_pin_moves():
    proc = trainbox_cli("patches", "verify", "npu-910b", "--set", "megatron-core.version=0.16.0",
                        "--set", f"megatron-core.sha256={MCORE_016_SHA}")
    assert proc.returncode == 1
    row = next(ln for ln in proc.stdout.splitlines() if "0002-tensor_parallel-random" in ln)
    assert "fails at megatron/core/tensor_parallel/random.py hunk 5 (@@ -217,8 +261,11 @@" in row, proc.stdout
    assert "made against megatron-core 0.15.3, but the pin is megatron-core==0.16.0" in row


def test_image_applier_fails_when_the_pin_moves(mcore_pin, tmp_path):
    """The in-image step on megatron-core 0.16.0 as installed (the wheel's contents are site-packages)."""
    from dataclasses import replace

    fetched = fetch(replace(mcore_pin, version="0.16.0", sha256=(MCORE_016_SHA,)))
    site = unpack(fetched, tmp_path / "site-packages")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "python" / "trainbox" / "runtime" / "apply_patches.py"),
                           "--series", str(SERIES / "series"), "--dist", "megatron-core"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(site)))
    assert proc.returncode == 1
    assert "0002-tensor_parallel-random-track-the-RNG-of-the-current-.patch does not apply" in proc.stderr
    assert "megatron/core/tensor_parallel/random.py hunk 5 (@@ -217,8 +261,11 @@" in proc.stderr
    assert "was made against megatron-core 0.15.3, but 0.16.0 is installed" in proc.stderr
    assert not list(site.rglob("*.rej")) and not list(site.rglob("*.orig"))
    assert "return torch.get_rng_state()" not in (site / "megatron/core/tensor_parallel/random.py").read_text()


def test_edit_export_round_trip_reproduces_the_series(mcore_pin, tmp_path):
    pdir = tmp_path / "patches"
    (pdir).mkdir()
    import shutil

    shutil.copytree(SERIES, pdir / "megatron-core")
    tree, applied, stopped = patches.edit(mcore_pin, "megatron-core", tmp_path / "edit", patches_dir=pdir,
                                          offline=True)
    assert stopped is None and len(applied) == 5
    patches.export(tree, patches_dir=pdir)
    for p in sorted(SERIES.iterdir()):
        assert (pdir / "megatron-core" / p.name).read_bytes() == p.read_bytes(), p.name
    assert sorted(x.name for x in (pdir / "megatron-core").iterdir()) == sorted(x.name for x in SERIES.iterdir())
