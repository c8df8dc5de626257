"""Wheels and indexes found as pip finds them (issue 41, item 2): pip's configuration read with pip's precedence,
its find-links directories and file:// indexes searched for a pinned file, and `image build` taking its
wheelhouse and index from there when the command line names none, saying so in one line."""

from __future__ import annotations

import hashlib
import subprocess
import types

import pytest

from trainbox.image import build as image_build
from trainbox.supply import pipconfig, sources
from trainbox.supply.pins import Pin
from trainbox.runtime.errors import TrainboxError


def _wheel(d, name="demo_pkg-1.0-py3-none-any.whl", body=b"demo wheel bytes"):
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_bytes(body)
    return p, hashlib.sha256(body).hexdigest()


def test_precedence_is_pips_env_over_install_over_global(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/env")
    cfg = pipconfig.parse("\n".join([
        "global.find-links='/from/global'",
        "global.index-url='https://global.example/simple'",
        "install.index-url='https://install.example/simple'",
        ":env:.find-links='/from/env'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "freeze.find-links='/not/for/install'",
        "garbage line",
    ]))
    assert cfg.get("find-links").value == "/from/env" and cfg.get("find-links").origin == "PIP_FIND_LINKS"
    assert cfg.get("index-url").value == "https://install.example/simple"
    assert cfg.get("index-url").origin == "pip config install.index-url"
    assert cfg.get("extra-index-url").words() == ["file:///a/simple", "file:///b/simple"]


def test_wheelhouse_is_the_first_find_links_directory_with_wheels(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _wheel(tmp_path / "wheels")
    cfg = pipconfig.parse(f"global.find-links='{empty} https://example.org/links file://{tmp_path / 'wheels'}'")
    assert cfg.wheelhouse() == (tmp_path / "wheels", "pip config global.find-links")
    assert pipconfig.parse("global.find-links='https://example.org/links'").wheelhouse() is None
    assert pipconfig.PipConfig().wheelhouse() is None


def test_a_pinned_file_is_found_in_find_links_and_in_a_local_index(tmp_path):
    links, sha = _wheel(tmp_path / "links")
    cfg = pipconfig.parse(f"global.find-links='{tmp_path / 'links'}'")
    assert pipconfig.find_local("demo-pkg", "1.0", (sha,), cfg)[0] == links
    assert pipconfig.find_local("demo-pkg", "1.0", ("0" * 64,), cfg) is None  # the bytes must be the pinned ones
    assert pipconfig.find_local("demo-pkg", "2.0", (sha,), cfg) is None
    # a PEP 503 directory named by a file:// extra-index-url: <root>/<project>/<file>, as pip reads it
    idx, sha2 = _wheel(tmp_path / "simple" / "other-pkg", "other_pkg-3.1-py3-none-any.whl", b"other")
    cfg = pipconfig.parse(f"global.extra-index-url='file://{tmp_path / 'simple'} https://pypi.org/simple'")
    path, where = pipconfig.find_local("Other_Pkg", "3.1", (sha2,), cfg)
    assert path == idx and "extra-index-url" in where


def test_fetch_takes_a_pinned_wheel_from_pips_find_links_into_the_cache(tmp_path, monkeypatch):
    _, sha = _wheel(tmp_path / "links")
    monkeypatch.setattr(pipconfig, "pip_config", lambda: pipconfig.parse(f"global.find-links='{tmp_path / 'links'}'"))
    pin = Pin(key="demo", source="pypi", name="demo-pkg", version="1.0", sha256=(sha,),
              index_url="https://unreachable.invalid/simple")
    got = sources.fetch_pypi(pin, (), offline=True, cache_dir=tmp_path / "cache")
    assert got.sha256 == sha and got.path.is_relative_to(tmp_path / "cache")
    # without it, offline and an empty cache: the one-line refusal
    monkeypatch.setattr(pipconfig, "pip_config", lambda: pipconfig.PipConfig())
    with pytest.raises(TrainboxError, match="not in the cache"):
        sources.fetch_pypi(pin, (), offline=True, cache_dir=tmp_path / "cache2")


def test_build_options_take_pips_wheelhouse_and_index_and_say_so(tmp_path, monkeypatch, capsys):
    _wheel(tmp_path / "links")
    monkeypatch.setattr(pipconfig, "pip_config", lambda: pipconfig.parse("\n".join([
        f"global.find-links='{tmp_path / 'links'}'",
        "global.index-url='https://user:s3cret@mirror.example/simple'"])))
    opts = image_build.BuildOptions(stack="cpu")
    assert image_build._from_pip_config(opts) is True
    assert opts.wheelhouse == str(tmp_path / "links")
    assert opts.pip_index_url == "https://user:s3cret@mirror.example/simple"
    err = capsys.readouterr().err
    assert f"wheelhouse {tmp_path / 'links'}: pip's find-links (pip config global.find-links)" in err
    assert "user:***@mirror.example" in err and "s3cret" not in err
    # the command line wins
    opts = image_build.BuildOptions(stack="cpu", wheelhouse="/given", pip_index_url="https://given.example/simple")
    assert image_build._from_pip_config(opts) is False
    assert (opts.wheelhouse, opts.pip_index_url) == ("/given", "https://given.example/simple")


def test_pypi_index_follows_pips_index_url(monkeypatch):
    monkeypatch.delenv("TRAINBOX_PYPI_URL", raising=False)
    monkeypatch.setattr(pipconfig, "pip_config",
                        lambda: pipconfig.parse("global.index-url='https://mirror.example/simple'"))
    assert sources.index_url("pypi", {}) == "https://mirror.example/simple"
    monkeypatch.setenv("TRAINBOX_PYPI_URL", "https://override.example/simple")
    assert sources.index_url("pypi", {}) == "https://override.example/simple"


def test_pips_answer_is_kept_until_a_file_it_reads_changes(tmp_path, monkeypatch):
    """`pip config list` once; the next process takes the kept answer without starting pip, and asks pip again
    when a configuration file pip reads changes (here the XDG_CONFIG_HOME one) or one is added."""
    monkeypatch.setenv("TRAINBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    conf = tmp_path / "xdg" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[install]\nindex-url = https://first.example/simple\n")
    ran = []
    counting = types.SimpleNamespace(run=lambda argv, **kw: ran.append(argv) or subprocess.run(argv, **kw),
                                     TimeoutExpired=subprocess.TimeoutExpired)
    monkeypatch.setattr(pipconfig, "subprocess", counting)  # pipconfig's own name: no other caller is counted

    def index_url():
        pipconfig.pip_config.cache_clear()  # a new process
        s = pipconfig.pip_config().get("index-url")
        return s.value if s else None

    try:
        assert index_url() == "https://first.example/simple" and len(ran) == 1
        assert index_url() == "https://first.example/simple" and len(ran) == 1  # the kept answer
        conf.write_text("[install]\nindex-url = https://second.example/simple\n")
        assert index_url() == "https://second.example/simple" and len(ran) == 2
        monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")  # the environment is in the key too
        assert index_url() == "https://env.example/simple" and len(ran) == 3
        (tmp_path / "cache" / "pip-config.json").write_text("{not json")  # a broken memo: pip is asked
        assert index_url() == "https://env.example/simple" and len(ran) == 4
    finally:
        pipconfig.pip_config.cache_clear()
