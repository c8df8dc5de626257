"""The Docker engine as trainbox uses it: a BuildKit-capable client, builds with parsed progress, and
image inspection (labels, size, layers, history). (Scanning an image's files for caches, duplicates and
secrets is a test and benchmark tool: tests/imagescan.py.)

Host module. Everything goes through the docker CLI rather than the API so that contexts, DOCKER_HOST
and credential helpers behave exactly as they do for the user's own `docker` commands, and so that
BuildKit is reached the same way on every engine (`docker buildx build`, or the 18.09-22.x clients'
built-in BuildKit with DOCKER_BUILDKIT=1).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator

from ..runtime.errors import TrainboxError
from ..runtime.redact import redact

ENSURE_HINT = "start one with `bash ci/ensure-docker.sh` (root), or point DOCKER_HOST at a running engine"

#: The client refuses DOCKER_BUILDKIT=1 without the buildx plugin from this version on.
LEGACY_BUILDKIT_MAX = (23, 0)
#: The first client with built-in BuildKit.
LEGACY_BUILDKIT_MIN = (18, 9)


class EngineError(TrainboxError):
    """The engine or client is missing, or an engine command failed."""


def _version_tuple(text: str) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return None
    return tuple(int(x) for x in m.groups(default="0"))


def _candidate_clients() -> list[str]:
    """Every `docker` executable worth trying, in the order a user would expect."""
    forced = os.environ.get("TRAINBOX_DOCKER")
    if forced:
        return [forced]
    found: list[str] = []
    seen: set[str] = set()
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/local/bin"]
    for d in dirs:
        p = os.path.join(d, "docker") if d else ""
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            if real not in seen:
                seen.add(real)
                found.append(p)
    return found


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped an attached `docker run`: the container was asked to stop and has; `returncode` is its."""

    def __init__(self, returncode: int):
        super().__init__(returncode)
        self.returncode = returncode


class _Attached:
    """A foreground child in a process group of its own, so that Ctrl-C reaches trainbox alone, which then
    forwards one SIGINT per Ctrl-C (docker's sig-proxy passes it to the container) and waits for the child; from
    the first Ctrl-C on, the child's output (its tracebacks of the interrupt) goes to the log only."""

    def __init__(self, argv: list[str], piped: bool):
        import signal
        import threading

        self.interrupted = False
        self._signal = signal
        # only the main thread gets signals (and may set a handler); elsewhere the child shares our group
        self._main = threading.current_thread() is threading.main_thread()
        self._old = signal.getsignal(signal.SIGINT) if self._main else None
        out = subprocess.PIPE if piped else None
        # no tty is handed over: `docker run` is not -t and reads no stdin, so a background group is fine
        self.proc = subprocess.Popen(argv, stdout=out, stderr=out, process_group=0 if self._main else None)
        if self._main:
            signal.signal(signal.SIGINT, self._forward)

    def _forward(self, _signum, _frame) -> None:
        self.interrupted = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(self._signal.SIGINT)

    def wait(self) -> int:
        try:
            return self.proc.wait()
        finally:
            if self._main:
                self._signal.signal(self._signal.SIGINT, self._old)


def _tee(src, dst, sink, lock, attached: _Attached | None = None) -> None:
    """Copy a child's stream to our own and to a log file, chunk by chunk, as it comes (after a Ctrl-C: to the
    log only)."""
    out = getattr(dst, "buffer", dst)
    logging = True
    for chunk in iter(lambda: src.read1(65536), b""):
        if logging:
            try:
                with lock:
                    sink.write(chunk)
                    sink.flush()
            except (OSError, ValueError):  # the log's disk filled up: the job goes on, streaming only
                logging = False
        if attached is not None and attached.interrupted:
            continue
        with contextlib.suppress(OSError, ValueError):  # the terminal went away: the log still gets it all
            out.write(chunk)
            out.flush()


@dataclass
class Client:
    """A docker CLI that can run BuildKit builds."""

    docker: str  # path of the docker executable
    version: str  # client version, e.g. "20.10.24+dfsg1"
    mode: str  # "buildx" or "buildkit" (DOCKER_BUILDKIT=1 docker build)

    @property
    def build_argv(self) -> list[str]:
        if self.mode == "buildx":
            # --load: a non-default (docker-container) builder would otherwise keep the image to itself.
            return [self.docker, "buildx", "build", "--load"]
        return [self.docker, "build"]

    @property
    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.mode == "buildkit":
            env["DOCKER_BUILDKIT"] = "1"
        return env

    def describe(self) -> str:
        how = "docker buildx build" if self.mode == "buildx" else "DOCKER_BUILDKIT=1 docker build"
        return f"{how} ({self.docker}, client {self.version})"

    # -- plain CLI helpers -------------------------------------------------------------------------

    def run(self, *args: str, timeout: float | None = 120, check: bool = True,
            input: bytes | None = None) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run([self.docker, *args], capture_output=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"`docker {' '.join(args)}` did not finish within {timeout:.0f}s") from exc
        if check and proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip() or proc.stdout.decode(errors="replace").strip()
            raise EngineError(f"`docker {' '.join(args)}` failed (exit {proc.returncode}): {err}")
        return proc

    def attached(self, *args: str, log=None) -> int:
        """`docker ARGS` in the foreground, its output streaming through; the exit code. Ctrl-C is forwarded to
        the container (see `_Attached`), which is waited for; then `Interrupted` is raised with its exit code.
        `log`: a file path that also gets both streams (a `--rm` container's own logs go with it)."""
        if log is None:
            job = _Attached([self.docker, *args], piped=False)
            rc = job.wait()
        else:
            import threading

            lock = threading.Lock()
            # unbuffered: a write the full disk refuses is dropped in _tee, not kept in a buffer that closing the
            # file would try to write again (and fail the run after the job itself finished)
            with open(log, "ab", buffering=0) as sink:
                job = _Attached([self.docker, *args], piped=True)
                copies = [threading.Thread(target=_tee, args=(src, dst, sink, lock, job), daemon=True)
                          for src, dst in ((job.proc.stdout, sys.stdout), (job.proc.stderr, sys.stderr))]
                for c in copies:
                    c.start()
                rc = job.wait()
                for c in copies:
                    c.join(timeout=30)
        if job.interrupted:
            raise Interrupted(rc)
        return rc

    def engine_answers(self, timeout: float = 15) -> tuple[bool, str]:
        try:
            proc = subprocess.run([self.docker, "info", "--format", "{{.ServerVersion}}"],
                                  capture_output=True, timeout=timeout, text=True)
        except subprocess.TimeoutExpired:
            return False, f"`docker info` did not answer within {timeout:.0f}s"
        if proc.returncode != 0 or not proc.stdout.strip():
            return False, (proc.stderr.strip().splitlines() or ["`docker info` failed"])[-1]
        return True, proc.stdout.strip()

    def require_engine(self) -> str:
        ok, detail = self.engine_answers()
        if not ok:
            raise EngineError(f"no Docker engine answers ({detail}); {ENSURE_HINT}")
        return detail

    def image_exists(self, ref: str) -> bool:
        return self.run("image", "inspect", "--format", "{{.Id}}", ref, check=False, timeout=60).returncode == 0

    def inspect(self, ref: str) -> dict:
        out = self.run("image", "inspect", ref).stdout
        data = json.loads(out)
        if not data:
            raise EngineError(f"image {ref} not found")
        return data[0]

    def image_info(self, ref: str) -> dict | None:
        """`docker image inspect ref` as a dict, or None when there is no such image: presence, id and labels in
        one engine call."""
        proc = self.run("image", "inspect", ref, check=False, timeout=60)
        data = json.loads(proc.stdout or b"[]") if proc.returncode == 0 else []
        return data[0] if data else None

    def image_id(self, ref: str) -> str | None:
        proc = self.run("image", "inspect", "--format", "{{.Id}}", ref, check=False, timeout=60)
        return proc.stdout.decode().strip() or None if proc.returncode == 0 else None

    def labels(self, ref: str) -> dict[str, str]:
        return (self.inspect(ref).get("Config") or {}).get("Labels") or {}

    def history(self, ref: str) -> list[dict]:
        """`docker history`, newest layer first: id, created_by, size (bytes), comment."""
        out = self.run("history", "--no-trunc", "--human=false", "--format", "{{json .}}", ref).stdout
        rows = []
        for line in out.decode().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            rows.append({
                "id": r.get("ID"),
                "created_by": r.get("CreatedBy", ""),
                "size": int(r.get("Size") or 0),
                "comment": r.get("Comment", ""),
            })
        return rows

    def layers(self, ref: str) -> list[dict]:
        """The steps that made the image, oldest first, with the bytes each added (0 for metadata)."""
        return [{"created_by": h["created_by"], "size": h["size"]} for h in reversed(self.history(ref))]

    def tag(self, src: str, dst: str) -> None:
        self.run("tag", src, dst)

    def remove_image(self, ref: str, force: bool = False) -> None:
        args = ["rmi"] + (["-f"] if force else []) + [ref]
        self.run(*args, check=False)

    @contextlib.contextmanager
    def save_stream(self, ref: str) -> Iterator[IO[bytes]]:
        """Yield a file object streaming `docker save ref` (no temporary archive on disk)."""
        proc = subprocess.Popen([self.docker, "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            yield proc.stdout
        finally:
            if proc.stdout:
                proc.stdout.close()
            rc = proc.wait()
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            if proc.stderr:
                proc.stderr.close()
            if rc not in (0, -13, 141) and err:  # -13/141: we stopped reading early (SIGPIPE)
                raise EngineError(f"`docker save {ref}` failed: {err}")

    # -- a directory tree as an image (`trainbox base bootstrap`'s root filesystem) ---------------------------

    def import_tree(self, root: Path, tag: str, changes: list[str], exclude: tuple[str, ...] = (),
                    timeout: float = 1800) -> str:
        """`root` packed by tar and streamed into `docker import` (no archive on disk) as the one-layer image `tag`
        with the Dockerfile `changes`; the new image's id. The image records the engine's own architecture."""
        tar = subprocess.Popen(tar_argv(root, exclude), stdout=subprocess.PIPE)  # its warnings go to the terminal
        try:
            imp = subprocess.run([self.docker, "import", *(w for c in changes for w in ("--change", c)), "-", tag],
                                 stdin=tar.stdout, capture_output=True, text=True, timeout=timeout)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar_rc = tar.wait()
        if tar_rc != 0 or imp.returncode != 0:
            raise EngineError(f"importing {root} as {tag} failed (tar exit {tar_rc}, docker import exit "
                              f"{imp.returncode}): {imp.stderr.strip()}")
        return imp.stdout.strip().splitlines()[-1].strip()

    def import_tree_for(self, root: Path, tag: str, changes: list[str], platform: str, context: Path,
                        exclude: tuple[str, ...] = (), timeout: float = 1800) -> str:
        """`root` as a one-layer image whose config records `platform` (`docker import` cannot say another
        architecture): packed into `context` and built by BuildKit `FROM scratch` with --platform (no RUN, so
        nothing runs under emulation). The new image's id; the caller checks the platform it records."""
        context.mkdir(parents=True)
        with open(context / "rootfs.tar", "wb") as out:
            tar = subprocess.run(tar_argv(root, exclude), stdout=out, stderr=subprocess.PIPE, timeout=timeout)
        if tar.returncode != 0:
            raise EngineError(f"packing {root} failed (tar exit {tar.returncode}): {tar.stderr.decode()[-400:]}")
        # ADD unpacks a local tar, owners and modes as recorded
        (context / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\n" + "\n".join(changes) + "\n")
        argv = [*self.build_argv, "--progress", "plain", "--platform", platform, "--network", "none", "-t", tag,
                "-f", str(context / "Dockerfile"), str(context)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=self.build_env,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"importing {root} as {tag} with BuildKit: no answer within {timeout:.0f}s") from exc
        if proc.returncode != 0:
            tail = "\n  ".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
            raise EngineError(f"importing {root} as {tag} with BuildKit failed (exit {proc.returncode}):\n  {tail}")
        image_id = self.image_id(tag)
        if not image_id:
            raise EngineError(f"BuildKit reported success but there is no image {tag}")
        return image_id


def tar_argv(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """tar of the tree `root` to stdout as an image layer wants it: numeric owners, extended attributes (file
    capabilities), `exclude` patterns left out."""
    return ["tar", "--numeric-owner", "--xattrs", "-C", str(root), *(f"--exclude={e}" for e in exclude), "-c", "."]


def _probe_client(path: str) -> tuple[Client | None, str]:
    """Return (client, "") when `path` can build with BuildKit, else (None, why not)."""
    try:
        v = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path}: cannot run it ({exc})"
    version_text = v.stdout.strip()
    m = re.search(r"version\s+([^\s,]+)", version_text)
    version = m.group(1) if m else (version_text or "unknown")
    try:
        bx = subprocess.run([path, "buildx", "version"], capture_output=True, text=True, timeout=15)
        if bx.returncode == 0:
            return Client(path, version, "buildx"), ""
    except subprocess.TimeoutExpired:
        pass
    vt = _version_tuple(version)
    if vt is None:
        return None, f"{path}: unknown client version {version_text!r} and no buildx plugin"
    if vt < LEGACY_BUILDKIT_MIN:
        return None, f"{path}: client {version} predates BuildKit (18.09) and has no buildx plugin"
    if vt >= LEGACY_BUILDKIT_MAX:
        return None, (f"{path}: client {version} builds with BuildKit only through the buildx plugin, "
                      "which is missing (`docker buildx version` fails)")
    return Client(path, version, "buildkit"), ""


_CLIENT: Client | None = None


def find_client(refresh: bool = False) -> Client:
    """The BuildKit-capable docker client: `docker buildx` anywhere first, else a client that builds
    with DOCKER_BUILDKIT=1 (18.09-22.x). Raises EngineError that says exactly what is missing."""
    global _CLIENT
    if _CLIENT is not None and not refresh:
        return _CLIENT
    candidates = _candidate_clients()
    if not candidates:
        raise EngineError("no `docker` client on PATH (nor /usr/bin/docker); install docker.io "
                          "(`apt-get install docker.io`, or run `bash ci/ensure-docker.sh` as root)")
    probed = [_probe_client(p) for p in candidates]
    ok = [c for c, _ in probed if c]
    best = next((c for c in ok if c.mode == "buildx"), None) or (ok[0] if ok else None)
    if best is None:
        why = "; ".join(reason for _, reason in probed)
        raise EngineError(
            "no docker client here can build with BuildKit: " + why + ". Install the buildx plugin "
            "(Debian: `apt-get install docker-buildx`; or put a docker-buildx binary in "
            "~/.docker/cli-plugins/), or install a 18.09-22.x client such as Debian bookworm's docker.io "
            "and set TRAINBOX_DOCKER to it")
    _CLIENT = best
    return best


# -- BuildKit progress (`--progress plain`) ---------------------------------------------------------

_VERTEX = re.compile(r"^#(\d+) (.*)$")
_STEP = re.compile(r"^\[(?:(?P<stage>[^\]]*?) )?(?P<idx>\d+)/(?P<total>\d+)\] (?P<cmd>.*)$")
_DONE = re.compile(r"^DONE (\d+(?:\.\d+)?)s$")
_LOG = re.compile(r"^(\d+\.\d+) (.*)$")
_IMAGE_ID = re.compile(r"writing image (sha256:[0-9a-f]{64})")


@dataclass
class Step:
    vertex: int
    name: str
    stage: str | None = None
    index: int | None = None
    total: int | None = None
    status: str = "running"  # running | cached | done | error | canceled
    seconds: float | None = None
    error: str | None = None
    log: deque = field(default_factory=lambda: deque(maxlen=40))

    @property
    def internal(self) -> bool:
        return self.index is None

    def as_dict(self) -> dict:
        return {
            "name": self.name, "stage": self.stage, "index": self.index, "total": self.total,
            "status": self.status, "seconds": self.seconds,
        }


class ProgressParser:
    """Turns BuildKit's plain progress into steps (name, cached or not, time, last log lines)."""

    def __init__(self, on_event: Callable[[str, Step, str], None] | None = None):
        self.steps: dict[int, Step] = {}
        self.order: list[int] = []
        self.image_id: str | None = None
        self.trailer: list[str] = []  # lines outside any vertex: the error summary at the end
        self.on_event = on_event or (lambda kind, step, text: None)

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        m = _VERTEX.match(line)
        if not m:
            if line.strip():
                self.trailer.append(line)
            return
        vid, rest = int(m.group(1)), m.group(2)
        step = self.steps.get(vid)
        if step is None:
            # The first line of a vertex is its name (buildx may print a CACHED line first for
            # a vertex it already announced under another id; treat an unnamed one as internal).
            name = rest if not _is_status(rest) else f"#{vid}"
            step = Step(vid, name)
            sm = _STEP.match(name)
            if sm:
                step.stage = sm.group("stage")
                step.index, step.total = int(sm.group("idx")), int(sm.group("total"))
            self.steps[vid] = step
            self.order.append(vid)
            self.on_event("start", step, "")
            if not _is_status(rest):
                return
        if rest == step.name or rest.startswith("sha256:"):
            return
        if rest == "CACHED":
            step.status = "cached"
            self.on_event("cached", step, "")
            return
        dm = _DONE.match(rest)
        if dm:
            if step.status != "cached":
                step.status = "done"
            step.seconds = float(dm.group(1))
            self.on_event("done", step, "")
            return
        if rest.startswith("ERROR"):
            step.status = "error"
            step.error = rest.partition(":")[2].strip() or rest
            self.on_event("error", step, step.error)
            return
        if rest.startswith("CANCELED"):
            step.status = "canceled"
            self.on_event("canceled", step, "")
            return
        im = _IMAGE_ID.search(rest)
        if im:
            self.image_id = im.group(1)
        lm = _LOG.match(rest)
        text = lm.group(2) if lm else rest
        step.log.append(text)
        self.on_event("log", step, text)

    @property
    def build_steps(self) -> list[Step]:
        """Dockerfile instructions (not BuildKit's internal vertices), in the order they appeared."""
        return [self.steps[v] for v in self.order if not self.steps[v].internal]

    @property
    def failed_step(self) -> Step | None:
        errs = [self.steps[v] for v in self.order if self.steps[v].status == "error"]
        # The instruction that failed, not the "exporting" or internal vertex that errored with it.
        return next((s for s in errs if not s.internal), errs[0] if errs else None)

    @property
    def error_message(self) -> str:
        for line in reversed(self.trailer):
            s = line.strip()
            if s.lower().startswith(("error:", "failed to solve", "error ")):
                return s
        fs = self.failed_step
        return fs.error if fs and fs.error else (self.trailer[-1] if self.trailer else "")


def _is_status(rest: str) -> bool:
    return (rest in ("CACHED",) or rest.startswith(("DONE ", "ERROR", "CANCELED", "sha256:"))
            or bool(_LOG.match(rest)))


@dataclass
class BuildResult:
    ok: bool
    returncode: int
    wall_s: float
    image_id: str | None
    steps: list[Step]
    failed: Step | None
    error: str
    output_tail: list[str]


class ConsoleProgress:
    """One line per Dockerfile step as it starts and ends, and a heartbeat from long steps."""

    def __init__(self, stream: IO[str] | None = None, verbose: bool = False, heartbeat_s: float = 20.0,
                 secrets: list[str] | tuple[str, ...] = ()):
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self.secrets = list(secrets)  # masked in every line (and every URL's credentials), as pip masks them
        self.heartbeat_s = heartbeat_s
        self._last_beat: dict[int, float] = {}
        self._started: dict[int, float] = {}

    def _p(self, text: str) -> None:
        print(redact(text, self.secrets), file=self.stream, flush=True)

    def __call__(self, kind: str, step: Step, text: str) -> None:
        if step.internal and not self.verbose:
            if kind == "error":
                self._p(f"  failed  {_short(step.name)}: {text}")
            return
        now = time.monotonic()
        if kind == "start":
            self._started[step.vertex] = now
            self._last_beat[step.vertex] = now
        elif kind == "cached":
            self._p(f"  cached  {_short(step.name)}")
        elif kind == "done" and step.status == "done":
            self._p(f"  {step.seconds or 0:6.1f}s {_short(step.name)}")
        elif kind == "error":
            self._p(f"  failed  {_short(step.name)}")
        elif kind == "log":
            if self.verbose:
                self._p(f"    | {text}")
            elif now - self._last_beat.get(step.vertex, now) >= self.heartbeat_s:
                self._last_beat[step.vertex] = now
                took = now - self._started.get(step.vertex, now)
                self._p(f"  {took:6.0f}s {_short(step.name, 60)} ... {_short(text, 70)}")


def _short(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def run_build(client: Client, args: list[str], context: Path | str,
              on_event: Callable[[str, Step, str], None] | None = None,
              raw_log: IO[str] | None = None) -> BuildResult:
    """Run `build args... context` with plain progress; parse it as it streams."""
    argv = client.build_argv + ["--progress", "plain", *args, str(context)]
    parser = ProgressParser(on_event)
    tail: deque[str] = deque(maxlen=60)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=client.build_env,
                            text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if raw_log is not None:
                raw_log.write(line)
            parser.feed(line)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wall = time.monotonic() - t0
    return BuildResult(
        ok=rc == 0, returncode=rc, wall_s=wall, image_id=parser.image_id, steps=parser.build_steps,
        failed=parser.failed_step if rc != 0 else None,
        error=parser.error_message if rc != 0 else "", output_tail=list(tail),
    )


# -- base image availability ------------------------------------------------------------------------

def registry_of(ref: str) -> str:
    """The registry host an image reference pulls from (docker.io's API host for short names)."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "registry-1.docker.io"


def registry_reachable(ref: str, timeout: float = 8.0) -> tuple[bool, str]:
    """Whether the registry serving `ref` answers at all (any HTTP status counts: 401 is normal).

    A probe of /v2/ rather than a pull: a pull of a 10 GB CANN base may rightly take many minutes,
    while an unreachable registry must be reported in seconds."""
    import ssl
    import urllib.error
    import urllib.request

    host = registry_of(ref)
    url = f"https://{host}/v2/"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout)
        return True, url
    except urllib.error.HTTPError:
        return True, url
    except (urllib.error.URLError, ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url}: {reason}"
