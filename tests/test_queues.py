"""How `make test` hands out its queues (tests/conftest.py): the longest first, on the xdist workers, whose collection
order is the one the groups go out in. Those workers see `dist` "no" and `loadgroup` True (xdist's setup_config):
the order was once applied only where dist was "loadgroup", that is nowhere, and the queues went out by file name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import conftest


class _Item:
    def __init__(self, module: str, *keywords: str):
        self.module = SimpleNamespace(__name__=f"tests.{module}")
        self.keywords = dict.fromkeys(keywords, True)
        self.markers = []

    def add_marker(self, marker):
        self.markers.append(marker)


@pytest.mark.parametrize("option", [SimpleNamespace(dist="no", loadgroup=True),  # an xdist worker of make test
                                    SimpleNamespace(dist="loadgroup")])
def test_the_longest_queues_go_out_first_on_the_workers(option, monkeypatch):
    monkeypatch.setattr(conftest, "_skip_docker_without_engine", lambda items: None)
    items = [_Item("test_argcheck", "slow"), _Item("test_zz_fast"), _Item("test_run_docker", "docker"),
             _Item("test_arm64_docker", "docker"), _Item("test_relax_image", "docker")]
    conftest.pytest_collection_modifyitems(SimpleNamespace(option=option), items)
    order = [conftest._queue(it) for it in items]
    assert order == ["engine", "test_arm64_docker", "relax-image", "test_argcheck", None]
    assert [m.args for it in items for m in it.markers] == [("engine",), ("test_arm64_docker",), ("relax-image",),
                                                            ("test_argcheck",)]


def test_without_loadgroup_the_collection_keeps_its_order(monkeypatch):
    monkeypatch.setattr(conftest, "_skip_docker_without_engine", lambda items: None)
    items = [_Item("test_argcheck", "slow"), _Item("test_run_docker", "docker")]
    conftest.pytest_collection_modifyitems(SimpleNamespace(option=SimpleNamespace(dist="no")), items)
    assert [conftest._queue(it) for it in items] == ["test_argcheck", "engine"]
