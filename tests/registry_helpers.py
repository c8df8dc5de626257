"""A real container registry on 127.0.0.1 for the push tests: Debian's `docker-registry` (distribution's registry
binary), on a free port, its storage in a temporary directory, stopped after.

The engine talks plain HTTP to it without configuration: dockerd treats 127.0.0.0/8 as an insecure registry by
default (`docker info` lists it under Insecure Registries). `make registry` runs one in the foreground.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

BINARY = "docker-registry"
CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)  # not a wait: per-try, in a poll bounded by wait_s
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@contextlib.contextmanager
def local_registry(wait_s: float = 120):
    """Yield "127.0.0.1:PORT" of a registry that lives as long as the block."""
    binary = shutil.which(BINARY)
    if not binary:
        raise FileNotFoundError(f"{BINARY} not found: apt-get install -y docker-registry")
    with tempfile.TemporaryDirectory(prefix="trainbox-registry-") as tmp:
        port = free_port()
        config = Path(tmp) / "config.yml"
        config.write_text(CONFIG.format(root=Path(tmp) / "storage", port=port))
        log = open(Path(tmp) / "registry.log", "wb")
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + wait_s
            while not _answers(f"http://127.0.0.1:{port}/v2/"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{BINARY} did not answer on 127.0.0.1:{port}: "
                                       + (Path(tmp) / "registry.log").read_text(errors="replace")[-2000:])
                time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def docker_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    import docker_helpers as dh

    return subprocess.run([dh.docker_client().docker, *args], capture_output=True, text=True, timeout=timeout)


def remove_all_names(image_id: str) -> None:
    """Untag every tag of the image, then drop any digest reference left (a push to another registry leaves one),
    so that only a registry has it. Fails when the image stays (a container of another session still uses it)."""
    import json

    for key in ("RepoTags", "RepoDigests"):
        proc = docker_cli("image", "inspect", "--format", "{{json ." + key + "}}", image_id)
        refs = json.loads(proc.stdout) if proc.returncode == 0 else []
        if refs:
            rm = docker_cli("image", "rm", *refs)
            assert rm.returncode == 0, rm.stderr
    assert docker_cli("image", "inspect", image_id).returncode != 0, "the image is still here"


@contextlib.contextmanager
def names_restored(pushed):
    """What a test removes of a pushed image comes back afterwards (from the registry, which still runs), with
    its local names; no name of the registry stays on it (renders elsewhere would pin that registry)."""
    import json

    names = json.loads(docker_cli("image", "inspect", "--format", "{{json .RepoTags}}", pushed.image_id).stdout)
    try:
        yield names
    finally:
        if docker_cli("image", "inspect", pushed.image_id).returncode != 0:
            docker_cli("pull", pushed.ref)
        for name in names:
            docker_cli("tag", pushed.image_id, name)
        docker_cli("image", "rm", pushed.tag, pushed.ref)


if __name__ == "__main__":  # make registry: serve until interrupted
    with local_registry() as where:
        print(f"registry at {where} (trainbox image push STACK --registry {where}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped", file=sys.stderr)
