"""The port plan (host module, imports nothing): every port a job listens on, for `trainbox run` and for Slurm,
so that no job's port falls inside any job's HCCL block (tests/test_port_plan.py checks every slot).

A port moves by STRIDE per slot. `trainbox run` takes the slot from the job's first card (0-15), Slurm from the
job id (id % SLURM_SLOTS). Resulting ranges (a Ray head listens on RAY_PORT .. RAY_PORT+7):
  Slurm:  RAY_PORT 3400-6397, dashboard 10300-13290, MASTER_PORT 13400-16390
  run:    RAY_PORT 9500-9657, dashboard 9800-9950,   MASTER_PORT 16400-16550
All lie below HCCL's default NPU ports (16666..) and every per-job HCCL block (20480-32767: the socket ranges and,
on A2, the HCCL_IF_BASE_PORT blocks that trainbox.runtime derives from MASTER_PORT), and apart from each other.
torchrun's customary 29500 and Ray's 6379/8265/10001 are not used: 29500 lies in the A2 HCCL_IF_BASE_PORT region.
Nor are Slurm's own daemons' (SLURM_DAEMON_PORTS: slurmctld 6817, slurmd 6818, slurmdbd 6819, and slurmrestd's
customary 6820; the Slurm RAY_PORT range started at 6400 and crossed them) or the test cluster's (ci/slurm/up.sh:
16817-16819).
Ray's workers (one gRPC port each) take ports from RAY_WORKER_PORTS, 17000-20479: clear of all of the above, of
HCCL's default NPU ports and of every HCCL block. Ray's own default (10002-19999) covered the Slurm dashboards and
MASTER_PORTs, `trainbox run`'s MASTER_PORTs and HCCL's 16666... Every Ray job on a host shares the range: Ray
test-binds each port before it hands it to a worker, so two jobs only ever share its width.
"""

from __future__ import annotations

STRIDE = 10
NAMES = ("MASTER_PORT", "RAY_PORT", "RAY_DASHBOARD_PORT")
RUN_BASES = {"MASTER_PORT": 16400, "RAY_PORT": 9500, "RAY_DASHBOARD_PORT": 9800}
RUN_SLOTS = 16  # first cards 0..15
SLURM_BASES = {"MASTER_PORT": 13400, "RAY_PORT": 3400, "RAY_DASHBOARD_PORT": 10300}
SLURM_SLOTS = 300
RAY_WORKER_PORTS = (17000, 20479)
# Ports a Slurm node's own daemons listen on (slurm.conf defaults: SlurmctldPort 6817, SlurmdPort 6818,
# DbdPort 6819; slurmrestd is customarily run on 6820), those of ci/slurm/up.sh's test cluster, and Ray's
# defaults (GCS 6379, dashboard 8265, client server 10001): no planned port may be one of them.
SLURM_DAEMON_PORTS = (6817, 6818, 6819, 6820, 16817, 16818, 16819)
RAY_DEFAULT_PORTS = (6379, 8265, 10001)


def run_ports(slot: int, names=NAMES) -> dict[str, int]:
    """`trainbox run`'s ports for slot `slot` (a job's first card; a CPU trial's free slot): base + STRIDE * slot."""
    return {n: RUN_BASES[n] + STRIDE * slot for n in names}
