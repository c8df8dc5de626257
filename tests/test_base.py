"""trainbox.image.base: `trainbox base bootstrap` and base availability."""

from __future__ import annotations

import pytest

from trainbox.image import base, engine
from trainbox.runtime.errors import TrainboxError


class StubClient(engine.Client):
    """A stand-in client: an engine that answers, with a fixed set of local images."""

    def __init__(self, images: dict[str, str] | None = None, labels: dict[str, dict[str, str]] | None = None):
        super().__init__("/nonexistent/docker", "20.10.24", "buildkit")
        self.images = images or {}
        self.image_labels = labels or {}

    def require_engine(self) -> str:
        return "20.10.24"

    def image_id(self, ref: str):
        return self.images.get(ref)

    def image_exists(self, ref: str) -> bool:
        return ref in self.images

    def image_info(self, ref: str) -> dict | None:
        if ref not in self.images:
            return None
        return {"Id": self.images[ref], "Config": {"Labels": self.image_labels.get(ref, {})}}


CURRENT = {"org.trainbox.base.suite": "bookworm", base.INCLUDE_LABEL: ",".join(base.DEFAULT_INCLUDE)}
OLD = {"org.trainbox.base.suite": "bookworm"}  # made by a trainbox whose bases held no packages beyond minbase


def test_bootstrap_is_a_noop_when_the_tag_exists(monkeypatch):
    monkeypatch.setattr(base.subprocess, "Popen", lambda *a, **k: pytest.fail("must not run anything"))
    said = []
    got = base.bootstrap(client=StubClient({base.DEFAULT_TAG: "sha256:" + "a" * 64}), say=said.append)
    assert got == "sha256:" + "a" * 64
    assert "exists" in said[0] and "--force" in said[0]


def test_bootstrap_is_a_noop_for_a_current_base_and_remakes_an_outdated_one(monkeypatch):
    """A base trainbox made with fewer packages than builds now expect is made again (its image id, which every
    build hash covers, changes with it); a current one, or an image trainbox did not make, is left alone."""
    monkeypatch.setattr(base.shutil, "which", lambda name: None)  # reaching debootstrap fails at once
    for labels in (CURRENT, {**CURRENT, base.INCLUDE_LABEL: CURRENT[base.INCLUDE_LABEL] + ",git"}, {}):
        client = StubClient({base.DEFAULT_TAG: "sha256:" + "a" * 64}, {base.DEFAULT_TAG: labels})
        said = []
        assert base.bootstrap(client=client, say=said.append) == "sha256:" + "a" * 64
        assert "nothing to do" in said[0]
        assert base.outdated(base.DEFAULT_TAG, client) is None
    client = StubClient({base.DEFAULT_TAG: "sha256:" + "a" * 64}, {base.DEFAULT_TAG: OLD})
    assert "python3" in base.outdated(base.DEFAULT_TAG, client)
    said = []
    with pytest.raises(TrainboxError, match="apt-get install debootstrap"):
        base.bootstrap(client=client, say=said.append)
    assert "making it again" in said[0] and "python3-pip-whl" in said[0]


def test_bootstrap_includes_what_the_system_stage_installs(monkeypatch, tmp_path):
    """debootstrap gets DEFAULT_INCLUDE plus --include, and the image records the list it holds."""
    ran = {}
    monkeypatch.setattr(base.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    monkeypatch.setattr(base.os, "geteuid", lambda: 0)
    monkeypatch.setattr(base, "_tmp_parent", lambda: str(tmp_path))
    monkeypatch.setattr(base, "_run_debootstrap", lambda cmd, say, verbose: ran.setdefault("cmd", cmd))
    monkeypatch.setattr(base, "_finish_rootfs", lambda *a: None)
    monkeypatch.setattr(base, "host_platform", lambda: "linux/amd64")
    monkeypatch.setattr(base, "_import", lambda client, rootfs, tag, changes:
                        ran.setdefault("changes", changes) and "sha256:" + "b" * 64)
    assert base.bootstrap(client=StubClient(), include=["git"], say=lambda m: None) == "sha256:" + "b" * 64
    assert "--include=" + ",".join(sorted([*base.DEFAULT_INCLUDE, "git"])) in ran["cmd"]
    assert f"LABEL {base.INCLUDE_LABEL}={','.join(sorted([*base.DEFAULT_INCLUDE, 'git']))}" in ran["changes"]
    assert f"LABEL {base.PLATFORM_LABEL}=linux/amd64" in ran["changes"]
    assert "--arch=amd64" in ran["cmd"]


def test_bootstrap_for_arm64_goes_through_qemu_and_buildkit(monkeypatch, tmp_path):
    """--platform linux/arm64 on an x86_64 host: debootstrap --arch=arm64, the image named
    local/debian:bookworm-arm64 and imported with BuildKit (docker import would record amd64)."""
    ran = {}
    monkeypatch.setattr(base, "host_platform", lambda: "linux/amd64")
    monkeypatch.setattr(base, "emulation_problem", lambda plat: None)
    monkeypatch.setattr(base.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    monkeypatch.setattr(base.os, "geteuid", lambda: 0)
    monkeypatch.setattr(base, "_tmp_parent", lambda: str(tmp_path))
    monkeypatch.setattr(base, "_run_debootstrap", lambda cmd, say, verbose: ran.setdefault("cmd", cmd))
    monkeypatch.setattr(base, "_finish_rootfs", lambda *a: None)
    monkeypatch.setattr(base, "_import", lambda *a: pytest.fail("docker import records the engine's architecture"))
    monkeypatch.setattr(base, "_import_buildkit", lambda client, rootfs, ctx, tag, changes, plat:
                        ran.update(tag=tag, plat=plat, changes=changes) or "sha256:" + "c" * 64)
    assert base.bootstrap(client=StubClient(), platform="linux/arm64", say=lambda m: None) == "sha256:" + "c" * 64
    assert "--arch=arm64" in ran["cmd"] and ran["cmd"][-3:-1][0] == "bookworm"
    assert ran["tag"] == "local/debian:bookworm-arm64" and ran["plat"] == "linux/arm64"
    assert f"LABEL {base.PLATFORM_LABEL}=linux/arm64" in ran["changes"]


def test_bootstrap_for_arm64_without_emulation_says_how_in_one_line(monkeypatch):
    monkeypatch.setattr(base, "host_platform", lambda: "linux/amd64")
    monkeypatch.setattr(base, "emulation_problem", lambda plat: "no qemu-aarch64 emulator is registered")
    monkeypatch.setattr(base.subprocess, "Popen", lambda *a, **k: pytest.fail("must not run anything"))
    with pytest.raises(TrainboxError) as exc:
        base.bootstrap(client=StubClient(), platform="linux/arm64", say=lambda m: None)
    msg = str(exc.value)
    assert exc.value.exit_code == 2 and "\n" not in msg
    assert "no qemu-aarch64 emulator" in msg and "ci/ensure-docker.sh --emulate arm64" in msg


def test_an_amd64_image_under_the_arm64_name_is_made_again(monkeypatch):
    monkeypatch.setattr(base.shutil, "which", lambda name: None)  # reaching debootstrap fails at once
    monkeypatch.setattr(base, "emulation_problem", lambda plat: None)
    tag = "local/debian:bookworm-arm64"
    client = StubClient({tag: "sha256:" + "a" * 64}, {tag: CURRENT})
    client.image_info = lambda ref: {"Id": "sha256:" + "a" * 64, "Architecture": "amd64", "Os": "linux",
                                     "Config": {"Labels": CURRENT}}
    said = []
    with pytest.raises(TrainboxError, match="apt-get install debootstrap"):
        base.bootstrap(client=client, platform="linux/arm64", say=said.append)
    assert "it is for linux/amd64, not linux/arm64" in said[0]


def test_suite_of_a_platform_tag():
    assert base.suite_of("local/debian:bookworm-arm64") == "bookworm"
    assert base.suite_of("local/debian:bookworm") == "bookworm"
    assert base.suite_of("local/debian:trixie") == "trixie"


def test_bootstrap_without_debootstrap(monkeypatch):
    monkeypatch.setattr(base.shutil, "which", lambda name: None)
    with pytest.raises(TrainboxError, match="apt-get install debootstrap"):
        base.bootstrap(client=StubClient(), say=lambda m: None)


def test_progress_filter_keeps_phases_only():
    per_pkg = ["I: Retrieving libc6 2.36-9+deb12u10", "I: Validating libc6 2.36-9+deb12u10",
               "I: Extracting adduser...", "I: Unpacking base-files...", "I: Configuring tzdata..."]
    phases = ["I: Retrieving InRelease", "I: Checking Release signature", "I: Installing core packages...",
              "I: Unpacking required packages...", "I: Base system installed successfully."]
    assert all(base._PER_PACKAGE.match(x) for x in per_pkg[:2])
    assert not any(base._PER_PACKAGE.match(x) for x in phases[2:])


def test_finish_rootfs(tmp_path):
    root = tmp_path / "rootfs"
    for rel in ["var/lib/apt/lists/deb.debian.org_Packages", "var/cache/apt/archives/libc6.deb",
                "var/cache/apt/pkgcache.bin", "var/cache/debconf/templates.dat-old", "usr/share/man/man1/ls.1.gz", "usr/share/doc/bash/README",
                "usr/share/doc/bash/copyright", "usr/share/locale/de/LC_MESSAGES/x.mo",
                "usr/share/locale/locale.alias", "var/log/dpkg.log", "etc/apt/sources.list"]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    (root / "var/lib/apt/lists/partial").mkdir()
    base._finish_rootfs(root, "bookworm", "http://mirror.example/debian", "none")
    assert (root / "etc/apt/sources.list").read_text() == (
        "deb http://mirror.example/debian bookworm main\ndeb http://mirror.example/debian bookworm-updates main\n")
    assert not list((root / "var/lib/apt/lists").glob("*Packages"))
    assert (root / "var/lib/apt/lists/partial").is_dir()
    assert not (root / "var/cache/apt/archives/libc6.deb").exists()
    assert not (root / "var/cache/apt/pkgcache.bin").exists()
    assert not (root / "var/cache/debconf/templates.dat-old").exists()
    assert not (root / "usr/share/man/man1").exists()
    assert (root / "usr/share/doc/bash/copyright").exists() and not (root / "usr/share/doc/bash/README").exists()
    assert (root / "usr/share/locale/locale.alias").exists() and not (root / "usr/share/locale/de").exists()
    assert "path-exclude /usr/share/doc/*" in (root / "etc/dpkg/dpkg.cfg.d/docker-slim").read_text()
    assert (root / "usr/sbin/policy-rc.d").stat().st_mode & 0o111
    assert not (root / "var/log/dpkg.log").exists()


def test_finish_rootfs_security_line(tmp_path):
    root = tmp_path / "r"
    (root / "etc/apt").mkdir(parents=True)
    base._finish_rootfs(root, "bookworm", base.DEFAULT_MIRROR, base.DEFAULT_SECURITY_MIRROR)
    assert "deb http://deb.debian.org/debian-security bookworm-security main" in \
        (root / "etc/apt/sources.list").read_text()


def test_base_available_local_and_unreachable():
    ok, how = base.base_available("local/debian:bookworm", StubClient({"local/debian:bookworm": "sha256:1"}))
    assert ok and how == "present locally"
    from hangguard import finishes, silent_endpoint

    ok, why = finishes(base.base_available, "registry.invalid/ascend/cann:8.5.1", StubClient(), timeout=3)
    assert not ok and "registry.invalid" in why
    with silent_endpoint() as host:  # answers nothing: only the probe's timeout ends the wait
        ok, why = finishes(base.base_available, f"{host}/ascend/cann:8.5.1", StubClient(), timeout=3)
    assert not ok and "registry unreachable" in why and "timed out" in why, why


def test_npu_base_unreachable_fails_fast_with_hint(capsys, monkeypatch):
    """`trainbox image build --stack npu-910b` where quay.io cannot be reached: seconds, not minutes,
    and the message names the base and the --base / mirror options."""
    from trainbox.image import build as image_build
    from trainbox.cli import main

    monkeypatch.setattr(image_build, "find_client", lambda: StubClient())
    monkeypatch.setattr(base, "find_client", lambda: StubClient())
    monkeypatch.setattr(engine, "registry_reachable", lambda ref, timeout=8.0: (False, "stand-in: no route"))
    monkeypatch.setattr(base, "registry_reachable", lambda ref, timeout=8.0: (False, "stand-in: no route"))
    monkeypatch.setattr(image_build, "url_answers", lambda url, timeout, cafile=None: (True, ""))
    from trainbox.image import run as buildrun
    from hangguard import no_connection

    # the answer comes before any long step: no connection (a pull), no build; timing it would judge the machine
    with no_connection() as reached:
        monkeypatch.setattr(buildrun, "run", lambda *a, **k: pytest.fail("a build started"))
        rc = main(["image", "build", "npu-910b", "--platform", "linux/amd64"])
    err = capsys.readouterr().err
    assert rc == 2 and not reached, reached
    assert "quay.io/ascend/cann:" in err and "cannot be pulled" in err
    assert "--base IMAGE" in err and "docker load" in err


def test_explicit_local_debian_base_is_bootstrapped_not_pulled(monkeypatch):
    """`--base local/debian:bookworm` (what the unreachable-base hint suggests) on an engine that lacks it:
    bootstrap it first, whatever a registry would answer for that name."""
    from trainbox.specs.stack import load_stack

    asked = []
    monkeypatch.setattr(base, "base_available", lambda ref, client, **kw: asked.append(ref) or (True, "stand-in"))
    stack = load_stack("npu-910b", base="local/debian:bookworm")
    said = []
    assert base.resolve_base(stack, StubClient(), said.append) == ("local/debian:bookworm", None, True, None)
    assert asked == [] and "bootstrapping" in said[0]
    # present locally: used as it is
    present = StubClient({"local/debian:bookworm": "sha256:1"})
    monkeypatch.setattr(base, "base_available", lambda ref, client, **kw: (True, "present locally"))
    assert base.resolve_base(stack, present, said.append) == ("local/debian:bookworm", None, False, "sha256:1")
    # present but made by an older trainbox without the system stage's packages: made again first
    old = StubClient({"local/debian:bookworm": "sha256:1"}, {"local/debian:bookworm": OLD})
    assert base.resolve_base(stack, old, said.append) == ("local/debian:bookworm", None, True, None)


def test_outdated_substitute_is_made_again(monkeypatch):
    """The cpu stack's automatic substitute, when an older trainbox made it: bootstrapped again before the build
    (so the build's system stage runs no apt), while a current one is used as it is."""
    from trainbox.specs.stack import load_stack

    monkeypatch.setattr(base, "base_available", lambda ref, client, **kw: (False, "stand-in: no registry"))
    stack = load_stack("cpu")
    sub = stack.base.substitute
    old = StubClient({sub: "sha256:1"}, {sub: OLD})
    assert base.resolve_base(stack, old, lambda m: None) == (sub, sub, True, None)
    current = StubClient({sub: "sha256:1"}, {sub: CURRENT})
    assert base.resolve_base(stack, current, lambda m: None) == (sub, sub, False, "sha256:1")


# -- for real --------------------------------------------------------------------------------------

@pytest.mark.docker
def test_bootstrapped_base_for_real():
    import docker_helpers as dh

    client = dh.docker_client()
    tag = dh.ensure_base()
    # a second bootstrap answers from the existing tag at once
    said = []
    assert base.bootstrap(tag=tag, client=client, say=said.append) == client.image_id(tag)
    assert len(said) == 1 and "exists" in said[0], said  # and nothing else: no debootstrap, no import
    labels = client.labels(tag)
    assert labels["org.trainbox.base.suite"] == "bookworm"
    assert base.outdated(tag, client) is None
    # what the label says is really installed: a build's system stage finds it all and runs no apt
    pkgs = labels[base.INCLUDE_LABEL].split(",")
    proc = dh.run_in_image(tag, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", *pkgs, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ii " * len(pkgs), proc.stdout + proc.stderr
    proc = dh.run_in_image(tag, "sh", "-c", "cat /etc/debian_version; echo ==; cat /etc/apt/sources.list; echo ==; "
                           "ls -A /var/lib/apt/lists /var/cache/apt/archives; echo ==; ls -A /usr/share/man | wc -l",
                           timeout=60)
    assert proc.returncode == 0, proc.stderr
    version, sources, caches, man = proc.stdout.split("==\n")
    assert version.startswith("12.")
    assert "bookworm main" in sources and "bookworm-security main" in sources
    assert "Packages" not in caches and ".deb" not in caches  # no apt indexes or packages shipped
    assert man.strip() == "0"  # no manual pages


def test_profile_base_one_policy_for_smoke_and_image_build_profile(monkeypatch):
    """`trainbox smoke` and `image build --profile` take the base from base.profile_base: with no engine to ask
    (a dry run on a CPU host) auto plans on the substitute, as the build there would; never keeps the own base."""
    import trainbox.image.base as b

    def no_engine(image, client=None, timeout=8.0, **kw):  # not a wait: base_available's signature
        raise b.TrainboxError("no Docker engine answers")

    monkeypatch.setattr(b, "base_available", no_engine)
    c = b.profile_base("auto", "quay.io/ascend/cann:x", "local/debian:bookworm", auto_substitute=False)
    assert (c.decision, c.base, c.substituted) == ("substitute", "local/debian:bookworm", "local/debian:bookworm")
    assert "not probed" in c.reason
    c = b.profile_base("auto", "quay.io/ascend/cann:x", None, auto_substitute=False)
    assert (c.decision, c.base) == ("own", None)
    assert b.profile_base("never", "quay.io/ascend/cann:x", "local/debian:bookworm", False).base is None
    # a stack that substitutes by itself gets no --base (its image is the one everyone's build makes)
    monkeypatch.setattr(b, "base_available", lambda image, client=None, timeout=8.0, **kw: (False, "unreachable"))
    c = b.profile_base("auto", "debian:x", "local/debian:bookworm", auto_substitute=True)
    assert (c.decision, c.base, c.substituted) == ("substitute", None, "local/debian:bookworm")


@pytest.mark.docker
def test_a_tree_becomes_an_image_through_the_engine_client(tmp_path):
    """The bootstrap's import, both ways, through engine.Client (base.py runs no docker itself): numeric owners
    kept, dev/proc/sys left empty, the changes in the config, the BuildKit way recording the platform asked."""
    import io
    import os
    import tarfile
    import uuid

    import docker_helpers as dh

    client = dh.docker_client()
    root = tmp_path / "rootfs"
    for d in ("etc", "dev", "proc", "sys"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "marker").write_text("tree")
    (root / "dev" / "null-ish").write_text("left out")
    os.chown(root / "etc" / "marker", 1234, 5678)
    changes = ['CMD ["bash"]', "LABEL org.trainbox.test.tree=yes"]
    tags = [f"trainbox-test/tree:{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        ids = [base._import(client, root, tags[0], changes),
               base._import_buildkit(client, root, tmp_path / "context", tags[1], changes, "linux/amd64")]
        for tag, image_id in zip(tags, ids):
            assert client.image_id(tag) == image_id
            assert client.labels(tag)["org.trainbox.test.tree"] == "yes"
            members = {}
            with client.save_stream(tag) as stream, tarfile.open(fileobj=stream, mode="r|") as saved:
                for m in saved:
                    if m.name.endswith("layer.tar"):
                        with tarfile.open(fileobj=io.BytesIO(saved.extractfile(m).read())) as layer:
                            members.update({x.name.lstrip("./"): x for x in layer.getmembers()})
            assert (members["etc/marker"].uid, members["etc/marker"].gid) == (1234, 5678)
            assert "dev/null-ish" not in members and "dev" in {n.rstrip("/") for n in members}
    finally:
        for tag in tags:
            client.remove_image(tag, force=True)
