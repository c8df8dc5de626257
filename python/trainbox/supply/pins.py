"""A component's pin as fetching sees it, and the one place that picks how a pin is fetched (host module).

The stack model (trainbox.specs) says what is pinned; this module turns a component into a `Pin` (its version,
hashes and index URL as they stand) and fetches it the way its `source:` says: an index (PyPI and friends), a git
repository or a URL (trainbox.supply.sources does the fetching). The `Upstream-Ref:` a patch series records, and
whether a recorded one still names the pin, are here too: they are facts about a fetched source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime.apply_patches import GIT_REF_RE, PYPI_REF_RE, URL_REF_RE
from ..specs.dists import canon
from ..specs.kinds import Kind, kind_of


DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Pin:
    """What a component pins, reduced to what fetching needs (built from a stack Component)."""

    key: str
    source: str  # pypi | git | url
    name: str  # distribution name (pypi) or the component key
    version: str | None = None
    index_name: str = "pypi"
    index_url: str = DEFAULT_INDEX
    sha256: tuple[str, ...] = ()
    git: str | None = None
    commit: str | None = None
    url: str | None = None

    @property
    def dist_name(self) -> str:
        return self.name

    @property
    def kind(self) -> Kind:
        return kind_of(self.source)

    @property
    def ref(self) -> str:
        return self.kind.pinned_ref(self)




@dataclass(frozen=True)
class Fetched:
    """A pinned source in the cache: an artifact file, or a bare git mirror plus the commit."""

    pin: Pin
    path: Path
    filename: str
    sha256: str | None = None
    commit: str | None = None

    @property
    def kind(self) -> str:
        if self.commit:
            return "git"
        if self.filename.endswith(".whl"):
            return "wheel"
        return "sdist" if self.pin.kind.from_index else "archive"

    @property
    def upstream_ref(self) -> str:
        """The `Upstream-Ref:` value for patches made against this source."""
        return upstream_ref(self)

    @property
    def label(self) -> str:
        """Short form for tables: the pin and which artifact served it."""
        if self.commit:
            return f"{self.pin.git}@{self.commit[:12]}"
        return f"{self.pin.ref} ({self.kind} {self.sha256[:12]})"


def upstream_ref(fetched: Fetched) -> str:
    """The `Upstream-Ref:` value for patches made against a fetched source."""
    pin = fetched.pin
    if pin.source == "pypi":
        tree = ("installed package, patch -p1 in site-packages" if fetched.filename.endswith(".whl")
                else "sdist root, patch -p1")
        return f"{pin.name}=={pin.version} sha256:{fetched.sha256} (tree: {tree})"
    if pin.source == "url":
        return f"{pin.url} sha256:{fetched.sha256}"
    return f"{pin.git}@{fetched.commit}"


def ref_problem(ref: str, pin: Pin) -> str | None:
    """None when a patch's `Upstream-Ref:` names this pin, else what is wrong with it."""
    if pin.source == "pypi":
        m = PYPI_REF_RE.match(ref)
        if not m:
            return f"Upstream-Ref {ref!r} is not NAME==VERSION sha256:HEX"
        if canon(m.group("name")) != canon(pin.name) or m.group("version") != pin.version:
            return f"made against {m.group('name')} {m.group('version')}, but the pin is {pin.ref}"
        if m.group("sha256") and pin.sha256 and m.group("sha256") not in pin.sha256:
            return f"made against artifact sha256:{m.group('sha256')[:12]}, which {pin.ref} does not pin"
        return None
    if pin.source == "url":
        m = URL_REF_RE.match(ref)
        if not m:
            return f"Upstream-Ref {ref!r} is not URL sha256:HEX"
        if m.group("sha256") not in pin.sha256:
            return f"made against sha256:{m.group('sha256')[:12]}, which the pin does not name"
        return None
    m = GIT_REF_RE.match(ref)
    if not m:
        return f"Upstream-Ref {ref!r} is not URL@COMMIT"
    if m.group("commit") != pin.commit:
        return f"made against commit {m.group('commit')[:12]}, but the pin is {pin.commit[:12]}"
    return None
