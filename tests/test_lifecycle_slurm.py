"""A Slurm job's record at its end: `sbatch --wait` returns while Slurm may still say COMPLETING, and the record
must carry Slurm's last word, not the RUNNING it saw before (test_slurm.py once read CANCELLED's job as RUNNING).
squeue and scontrol here are stand-ins (a script answering from a file); the real Slurm runs in test_slurm.py."""

from __future__ import annotations

import os
import stat

from trainbox.launch import lifecycle


def _stand_in_squeue(tmp_path, monkeypatch, answers: list[str]):
    """squeue prints the next of `answers` each call (the last one again once they run out); scontrol fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answers").write_text("\n".join(answers) + "\n")
    squeue = bin_dir / "squeue"
    squeue.write_text(f"""#!/bin/sh
f={tmp_path}/answers
head -n1 "$f"
[ "$(wc -l < "$f")" -gt 1 ] && sed -i 1d "$f"
exit 0
""")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    for p in bin_dir.iterdir():
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))


def _running_job_cancelled():
    lifecycle.start("j-1", "slurm", "cpu-ddp", "img", job_id="42", output="/dev/null", pid=os.getpid())
    record = lifecycle.refresh(lifecycle.load("j-1"))
    assert (record["state"], record["slurm_state"]) == ("running", "RUNNING")
    record["cancel_requested"] = lifecycle.now()
    return lifecycle.save(record)  # as cancel() saves it: with the RUNNING it saw


def test_the_end_waits_for_slurm_to_leave_completing(tmp_path, monkeypatch):
    _stand_in_squeue(tmp_path, monkeypatch, ["RUNNING", "COMPLETING", "COMPLETING", "CANCELLED"])
    _running_job_cancelled()
    record = lifecycle.finish("j-1", 0)
    assert (record["state"], record["slurm_state"]) == ("cancelled", "CANCELLED")
    assert lifecycle.load("j-1")["slurm_state"] == "CANCELLED"


def test_a_record_ended_in_completing_takes_slurm_s_last_word_later(tmp_path, monkeypatch):
    _stand_in_squeue(tmp_path, monkeypatch, ["RUNNING", "COMPLETING", "COMPLETED"])
    _running_job_cancelled()
    monkeypatch.setattr(lifecycle, "SLURM_SETTLE_SECONDS", 0)
    record = lifecycle.finish("j-1", 0)
    assert (record["state"], record["slurm_state"]) == ("cancelled", "COMPLETING")  # ours, Slurm not done yet
    record = lifecycle.refresh(lifecycle.load("j-1"))
    assert (record["state"], record["slurm_state"]) == ("succeeded", "COMPLETED")  # Slurm's own, saved
    assert lifecycle.load("j-1")["slurm_state"] == "COMPLETED"
