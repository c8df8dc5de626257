"""`trainbox jobs`, `status JOB`, `logs JOB [-f]`, `cancel JOB`: one lifecycle for docker, Slurm and Kubernetes jobs
(stdlib at import; trainbox.launch.lifecycle inside the handlers)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from ._args import EXIT_PROBLEMS, add_json, exits
from ._output import emit_json, print_table

K8S_HELP = ("Kubernetes: JOB is the name a render gave the job (its objects and pods carry trainbox.io/job=JOB); the "
            "kubectl commands run when a kube context exists, else they are printed")


def register(sub) -> None:
    j = sub.add_parser("jobs", help="the jobs trainbox started here (docker, Slurm), newest last, with their state")
    j.add_argument("--namespace", help="also list the Kubernetes jobs trainbox rendered that run in this namespace "
                   "(with a kube context; else the kubectl command is printed)")
    j.add_argument("--k8s", action="store_true", help="also list trainbox's Kubernetes jobs (all namespaces unless "
                   "--namespace)")
    add_json(j, "the jobs")
    exits(j)
    j.set_defaults(func=cmd_jobs)

    st = sub.add_parser("status", help="a job's state: pending, running, succeeded, failed, cancelled, lost")
    _job_args(st)
    add_json(st, "the job's record and state")
    exits(st, "the job failed, was cancelled or lost (its state says which)")
    st.set_defaults(func=cmd_status)

    lg = sub.add_parser("logs", help="a job's output (docker: kept in a host file, it outlives the container; "
                        "Slurm: its output file)")
    lg.add_argument("job", nargs="?", metavar="JOB", help="a job name (`trainbox jobs`), or a recipe: the newest "
                    "kept `trainbox run` log of it (default: the newest of any)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing as the log grows, until the job ends")
    lg.add_argument("--namespace", help="Kubernetes: the job's namespace")
    lg.add_argument("--dry-run", action="store_true", help="Kubernetes: print the kubectl command, run nothing")
    lg.add_argument("--list", action="store_true", help="list the kept `trainbox run` logs (path per line, oldest "
                    "first)")
    exits(lg, "no such job or kept log")
    lg.set_defaults(func=cmd_logs)

    c = sub.add_parser("cancel", help="stop a job: docker stop (SIGTERM to the job's processes, SIGKILL after 20 s), "
                       "scancel, or kubectl delete")
    _job_args(c)
    c.add_argument("--dry-run", action="store_true", help="print the command that would stop it, run nothing")
    exits(c, "the stop command failed")
    c.set_defaults(func=cmd_cancel)


def _job_args(p) -> None:
    p.add_argument("job", metavar="JOB", help=f"the job's name, as `trainbox run` printed it and `trainbox jobs` "
                   f"lists it. {K8S_HELP}")
    p.add_argument("--namespace", help="Kubernetes: the job's namespace")


def _row(r: dict) -> list[str]:
    where = {"docker": r.get("container", ""), "slurm": f"job {r.get('job_id', '')}"}.get(r["target"], "")
    code = "" if r.get("exit_code") is None else str(r["exit_code"])
    return [r["name"], r["target"], r["state"], code, r.get("recipe", ""), where, r.get("submitted", "")]


def cmd_jobs(args) -> int:
    from ..launch import lifecycle

    rows = [lifecycle.refresh(r) for r in lifecycle.records()]
    k8s = None
    if args.k8s or args.namespace:
        (cmd,) = lifecycle.k8s_commands("jobs", "", args.namespace)
        k8s = {"command": cmd}
        if lifecycle.k8s_context():
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            k8s.update(exit_code=p.returncode, output=p.stdout, error=p.stderr.strip())
    if args.json:
        emit_json({"jobs": rows, **({"kubernetes": k8s} if k8s else {})})
        return 0
    print_table(["JOB", "TARGET", "STATE", "EXIT", "RECIPE", "WHERE", "SUBMITTED"], [_row(r) for r in rows])
    if k8s:
        if "output" in k8s:
            print(f"\nKubernetes ({shlex.join(k8s['command'])}):\n{k8s['output'] or k8s['error']}")
        else:
            print(f"\nKubernetes (no kube context here; run): {shlex.join(k8s['command'])}")
    return 0


def _record(args):
    from ..launch import lifecycle

    record = lifecycle.load(args.job, missing_ok=True)
    return lifecycle.refresh(record) if record else None


def _k8s(action: str, args, follow: bool = False) -> int:
    """JOB is not one started here: the Kubernetes commands for it, run where a kube context exists."""
    from ..launch import lifecycle
    from ..runtime.errors import TrainboxError

    cmds = lifecycle.k8s_commands(action, args.job, args.namespace, follow)
    if getattr(args, "dry_run", False):
        for cmd in cmds:
            print(shlex.join(cmd))
        return 0
    if not lifecycle.k8s_context():
        for cmd in cmds:
            print(shlex.join(cmd))
        raise TrainboxError(f"no job {args.job!r} was started here (`trainbox jobs`), and there is no kube context to "
                            "ask: on a Kubernetes job, run the command above where kubectl reaches the cluster")
    rc = 0
    for cmd in cmds:
        print(f"+ {shlex.join(cmd)}", file=sys.stderr)
        rc = subprocess.run(cmd).returncode or rc
    return rc


def cmd_status(args) -> int:
    record = _record(args)
    if record is None:
        return _k8s("status", args)
    if args.json:
        from ..launch.lifecycle import log_path

        emit_json({"job": record | {"log_path": str(log_path(record) or "")}})
    else:
        code = f", exit {record['exit_code']}" if record.get("exit_code") is not None else ""
        where = f"container {record['container']}" if record["target"] == "docker" else \
            f"Slurm job {record.get('job_id')} ({record.get('slurm_state', 'state from the record')})"
        print(f"{record['name']}: {record['state']}{code} ({record['target']}, {where}; recipe {record['recipe']}, "
              f"submitted {record['submitted']})")
    return EXIT_PROBLEMS if record["state"] in ("failed", "cancelled", "lost") else 0


def cmd_logs(args) -> int:
    from ..launch import lifecycle
    from ..launch.docker import kept_logs, logs_dir
    from ..runtime.errors import TrainboxError

    if args.list:
        for path in kept_logs():
            print(path)
        return 0
    record = _record(args) if args.job else None
    if record is not None:
        path = lifecycle.log_path(record)
        if args.follow:
            lifecycle.follow(record, sys.stdout)
            return 0
        if path is None or not path.exists():
            raise TrainboxError(f"job {args.job}: no output yet at {path} ({record['state']})")
        sys.stdout.write(path.read_text(errors="replace"))
        print(f"trainbox logs: {path}", file=sys.stderr)
        return 0
    logs = kept_logs(args.job)
    if logs and not args.follow:
        sys.stdout.write(logs[-1].read_text(errors="replace"))
        print(f"trainbox logs: {logs[-1]}", file=sys.stderr)
        return 0
    if args.job and (args.namespace or args.dry_run or lifecycle.k8s_context()):
        return _k8s("logs", args, follow=args.follow)
    raise TrainboxError(f"no kept log{' of ' + args.job if args.job else ''}"
                        f"{' and no job ' + args.job if args.job else ''} here ({lifecycle.runs_dir()}, {logs_dir()}; "
                        "`trainbox jobs` lists the jobs; a Kubernetes job: --namespace NS, or run where a kube "
                        "context exists)")


def cmd_cancel(args) -> int:
    from ..launch import lifecycle

    record = _record(args)
    if record is None:
        return _k8s("cancel", args)
    if args.dry_run:
        print(shlex.join(lifecycle.cancel_argv(record)))
        return 0
    if record["state"] in lifecycle.TERMINAL:
        print(f"{record['name']}: already {record['state']}; nothing to cancel")
        return 0
    record = lifecycle.cancel(record)
    print(f"{record['name']}: {record['state']} ({shlex.join(lifecycle.cancel_argv(record))})")
    return 0


def detach(args, name: str) -> int:
    """`trainbox run --detach`: the same command, followed by a process of its own (its output goes to the job's
    log as always); returns once the job is recorded."""
    import time

    from ..launch import lifecycle

    argv = [a for a in args._argv if a != "--detach"]
    if "--name" not in argv and not any(a.startswith("--name=") for a in argv):
        argv += ["--name", name]
    d = lifecycle.runs_dir()
    d.mkdir(parents=True, exist_ok=True)
    errors = d / f"{name}.stderr"
    with open(errors, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trainbox.cli", *argv], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, env=dict(os.environ))
    deadline = time.monotonic() + 600  # an image pull, a Slurm submission
    while time.monotonic() < deadline:
        if lifecycle.load(name, missing_ok=True) is not None:
            print(f"trainbox run: job {name} started (`trainbox status|logs -f|cancel {name}`)", file=sys.stderr)
            print(name)  # NAME=$(trainbox run --detach ...)
            return 0
        if proc.poll() is not None:  # it ended before the job started: say why, leave nothing behind
            sys.stderr.write(errors.read_text(errors="replace"))
            errors.unlink(missing_ok=True)
            return proc.returncode or 1
        time.sleep(0.2)
    return 1
