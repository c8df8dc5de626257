"""A fresh machine tests with what CI had (issue 37): every package of pyproject's [build] and [dev] extras is pinned
in ci/constraints.txt to a version its extra allows, and `make install` and the CI jobs that run the tests install
with those pins. (Without them a fresh venv took PyYAML 6.0.4, whose parser words a nesting error its own way, and
a test failed there that passed here.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "ci" / "constraints.txt"


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"ci/constraints.txt: {line!r}: expected NAME==VERSION (a pin, nothing looser)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"ci/constraints.txt: {name} pinned twice"
        pins[name] = m.group(2)
    return pins


def test_every_build_and_dev_requirement_is_pinned_within_its_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = _pins()
    for extra in ("build", "dev"):
        for spec in extras[extra]:
            req = Requirement(spec)
            name = canonicalize_name(req.name)
            assert name in pins, f"pyproject [{extra}] {spec}: not pinned in ci/constraints.txt (pip list's version)"
            assert req.specifier.contains(pins[name], prereleases=True), (
                f"ci/constraints.txt pins {name}=={pins[name]}, which pyproject [{extra}] {spec!r} does not allow")
    assert pins["pyyaml"] == "6.0.3"  # the version the YAML refusals' wording was written against


def test_the_installs_that_run_the_tests_use_the_pins():
    make_install = re.search(r"^install:\n\t(.+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert "-c ci/constraints.txt" in make_install, make_install
    for ci in ("github/trainbox-smoke.yml", "gitlab/trainbox-smoke.gitlab-ci.yml"):
        lines = [ln for ln in (REPO / "ci" / ci).read_text().splitlines() if "[build,dev]" in ln]
        assert lines and all("-c ci/constraints.txt" in ln for ln in lines), (ci, lines)
