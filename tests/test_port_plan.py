"""The port plan: no port a job listens on falls inside any job's HCCL block (each job's own, and every other
job's on the same host). The HCCL blocks are what the runtime derives from MASTER_PORT (runtime.dist
hccl_socket_port_env): the host and NPU socket ranges on A3, the HCCL_IF_BASE_PORT block on A2 (910b), 32 ports
each. Slurm jobs take their ports from the job id (all residues are checked); `trainbox run` jobs on one host
from their first card (all 16 card slots)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from trainbox.launch.targets import render_target, resolve_for
from trainbox.runtime.dist import hccl_socket_port_env
from trainbox.runtime.npu import HCCL_IF_BASE_WIDTH, HCCL_WIDTH

RUN_RECIPE = "relax-qwen3-4b-4npu-colocate"  # NPU, Ray + torch: MASTER_PORT, RAY_PORT and the dashboard
RAY_HEAD_PORTS = 8  # a Ray head listens on RAY_PORT .. RAY_PORT+7 (GCS and its workers' fixed ports)


# The renders and resolves below are the same for every test here: made once per worker (they were 4 of this
# file's 5 s of CPU); each test still reads the product's values, and fails with them.
@functools.lru_cache(maxsize=None)
def _slurm_formulas() -> dict[str, tuple[int, int, int]]:
    """name -> (base, stride, slots) as the rendered sbatch scripts compute them."""
    text = render_target(resolve_for("slurm", "cpu-ddp", nodes=2), "slurm") + \
        render_target(resolve_for("slurm", "ray-cpu", nodes=2), "slurm")
    slots = int(re.search(r"port_slot=\$\(\( SLURM_JOB_ID % (\d+) \)\)", text).group(1))
    found = re.findall(r"export (\w+)=\$\{\1:-\$\(\( (\d+) \+ port_slot \* (\d+) \)\)\}", text)
    return {name: (int(base), int(stride), slots) for name, base, stride in found}


def _ports(values: dict[str, int]) -> set[int]:
    out = set()
    for name, port in values.items():
        out |= set(range(port, port + RAY_HEAD_PORTS)) if name == "RAY_PORT" else {port}
    return out


def _hccl_blocks(master: int) -> set[int]:
    blocks = set()
    for chip in ("910b", "a3"):
        for value in hccl_socket_port_env(master, environ={}, chip=chip).values():
            lo, _, hi = value.partition("-")
            width = HCCL_WIDTH if hi else HCCL_IF_BASE_WIDTH
            blocks |= set(range(int(lo), int(hi) + 1 if hi else int(lo) + width))
    return blocks


def _slurm_jobs() -> list[dict[str, int]]:
    formulas = dict(_slurm_formulas())
    assert set(formulas) == {"MASTER_PORT", "RAY_PORT", "RAY_DASHBOARD_PORT"}, formulas
    (slots,) = {f[2] for f in formulas.values()}
    return [{n: base + stride * s for n, (base, stride, _) in formulas.items()} for s in range(slots)]


def _docker_jobs() -> list[dict[str, int]]:
    """`trainbox run` jobs of a 4-card Ray recipe with every first card: the ports move with it (a job on cards
    4-7 against one on 0-3), as job.resolve derives them."""
    return [dict(j) for j in _docker_jobs_once()]


@functools.lru_cache(maxsize=None)
def _docker_jobs_once() -> tuple[dict[str, int], ...]:
    from trainbox.launch.recipe import all_inputs, load_recipe

    inputs = all_inputs(load_recipe(RUN_RECIPE))
    names = ("MASTER_PORT", "RAY_PORT", "RAY_DASHBOARD_PORT")
    out = []
    for first in range(16 - 3):
        job = resolve_for("docker", RUN_RECIPE, devices=f"{first}-{first + 3}")
        out.append({n: int(job.sets.get(n) or inputs[n].default) for n in names})
    assert len({j["MASTER_PORT"] for j in out}) == len(out)
    return tuple(out)


def _blocks_of(jobs) -> set[int]:
    return set().union(*(_hccl_blocks(j["MASTER_PORT"]) for j in jobs))


def test_no_slurm_job_port_is_inside_any_slurm_jobs_hccl_block():
    jobs = _slurm_jobs()
    blocks = _blocks_of(jobs)
    bad = sorted((j["MASTER_PORT"], p) for j in jobs for p in _ports(j) if p in blocks)
    assert not bad, f"{len(bad)} (job MASTER_PORT, port in an HCCL block), e.g. {bad[:5]}"


def test_slurm_jobs_ports_are_distinct_and_below_the_ephemeral_range():
    jobs = _slurm_jobs()
    seen: dict[int, int] = {}
    for i, j in enumerate(jobs):
        for p in _ports(j):
            assert p not in seen, f"port {p} of slot {i} is also slot {seen[p]}'s"
            assert 1024 <= p < 32768 and not 16666 <= p < 16666 + 16  # HCCL's default NPU ports
            seen[p] = i


def test_no_run_job_port_is_inside_any_run_or_slurm_jobs_hccl_block_and_slurm_ports_clear_run_blocks():
    run, slurm = _docker_jobs(), _slurm_jobs()
    run_blocks = _blocks_of(run)
    assert not [p for j in run for p in _ports(j) if p in run_blocks]
    assert not [p for j in slurm for p in _ports(j) if p in run_blocks]


def test_no_run_job_port_is_inside_a_slurm_jobs_hccl_block():
    # was red while `trainbox run` kept torchrun's 29500 (+10 per card slot): a Slurm job whose MASTER_PORT % 128
    # is 26 put its A2 HCCL_IF_BASE_PORT block over port 29510
    slurm_blocks = _blocks_of(_slurm_jobs())
    assert not [p for j in _docker_jobs() for p in _ports(j) if p in slurm_blocks]


def test_run_and_slurm_ports_never_meet():
    """A `trainbox run` job and a Slurm job on the same host: no port of one is a port of the other."""
    run = set().union(*(_ports(j) for j in _docker_jobs()))
    slurm = set().union(*(_ports(j) for j in _slurm_jobs()))
    assert not run & slurm, sorted(run & slurm)[:5]


def test_ray_workers_take_ports_clear_of_every_planned_port_and_hccl_block():
    """Ray's default worker range (10002-19999) covered the Slurm dashboards and MASTER_PORTs, `trainbox run`'s
    MASTER_PORTs and HCCL's default NPU ports: a worker could hold a port a job's rendezvous or HCCL then needed.
    The rendered Ray scripts name trainbox.launch.ports' range, which meets none of them."""
    from trainbox.launch.ports import RAY_WORKER_PORTS

    lo, hi = RAY_WORKER_PORTS
    workers = set(range(lo, hi + 1))
    run, slurm = _docker_jobs(), _slurm_jobs()
    planned = set().union(*(_ports(j) for j in run + slurm))
    assert not workers & planned, sorted(workers & planned)[:5]
    assert not workers & (_blocks_of(run) | _blocks_of(slurm))
    assert not workers & set(range(16666, 16666 + 16)) and 1024 <= lo and hi < 32768 and hi - lo >= 1000
    for target in ("docker", "slurm"):
        text = render_target(resolve_for(target, "ray-cpu", **({"nodes": 2} if target == "slurm" else {})), target)
        assert f"--min-worker-port {lo} --max-worker-port {hi}" in text, target


def test_no_planned_port_is_a_slurm_daemons_or_rays_default():
    """The Slurm Ray head range once ran 6400-9397: a job whose id % 300 was 41 put its Ray head's ports over
    slurmctld's 6817 and slurmd's 6818 (and slot 186 over Ray's own dashboard default, 8265). No port of any
    slot, nor any worker port, is a Slurm daemon's, the test cluster's, or Ray's default."""
    from trainbox.launch.ports import RAY_DEFAULT_PORTS, RAY_WORKER_PORTS, SLURM_DAEMON_PORTS

    reserved = set(SLURM_DAEMON_PORTS) | set(RAY_DEFAULT_PORTS)
    assert {6817, 6818, 6819} <= reserved  # slurm.conf's defaults: SlurmctldPort, SlurmdPort, DbdPort
    up = (Path(__file__).resolve().parents[1] / "ci/slurm/up.sh").read_text()
    test_cluster = {int(p) for p in re.findall(r"(?:ctld_port=\$\{TRAINBOX_SLURM_PORT:-|Port=)(\d+)", up)}
    assert test_cluster and test_cluster <= reserved, test_cluster
    planned = set().union(*(_ports(j) for j in _docker_jobs() + _slurm_jobs()))
    assert not planned & reserved, sorted(planned & reserved)
    lo, hi = RAY_WORKER_PORTS
    assert not set(range(lo, hi + 1)) & reserved
    assert not (_blocks_of(_docker_jobs()) | _blocks_of(_slurm_jobs())) & reserved
