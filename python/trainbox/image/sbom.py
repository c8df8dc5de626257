"""The image's SBOM: CycloneDX JSON from what the image really holds and what its build planned (host module).

Where the parts come from:
- installed distributions: `python -m trainbox.runtime.installed` run in the built image (stdlib only: the
  image never carries the CycloneDX library), with their versions; each artifact's sha256 from pip's own
  record where it kept one (PEP 610 `direct_url.json`, URL and local-wheel installs), else from the wheelhouse
  file pip took (name, version and wheel tags), else the one hash the build's hash-pinned requirements allow;
  a distribution resolved during the build without a hash pin says so;
- git sources (URL, commit, tree id) and patches (file, sha256): the build's manifest (`stack.json`, rendered
  from the plan), patches also as each patched component's pedigree;
- the base image: its registry digest, or its image id where it has none (a local `docker import`), saying so;
- the CANN / CUDA toolkit versions: found in the image, else what the stack declares (named as such).

The document is deterministic for the same inputs (no wall-clock timestamp: SOURCE_DATE_EPOCH, default 0; a
serial number derived from the content), so the layer that carries it rebuilds bit for bit (see `commit`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import re
import tarfile
import uuid
from pathlib import Path
from typing import Protocol, Sequence

from ..paths import write_atomic
from .engine import Client
from ..runtime.errors import TrainboxError
from ..runtime.redact import printable
from ..runtime.installed import SBOM_FILE as SBOM_PATH, canon

SBOM_LABEL = "io.trainbox.sbom"  # value: sha256 of the document, so a re-run knows the image has it
PROP = "trainbox:"


def source_date_epoch() -> int:
    """The one timestamp trainbox writes (SBOM metadata, layer mtimes): $SOURCE_DATE_EPOCH, default 0."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "0").strip() or "0"
    if not value.isdigit():
        raise TrainboxError(f"SOURCE_DATE_EPOCH={value!r}: expected seconds since 1970 (digits only)")
    return int(value)


def require_library() -> None:
    """CycloneDX's library (the `build` extra) is importable, or one line says how to get it."""
    try:
        import cyclonedx.output.json  # noqa: F401
    except ImportError:
        raise TrainboxError("the image's SBOM needs cyclonedx-python-lib on this host: pip install "
                            "'cyclonedx-python-lib>=8' (or pip install -e '.[build]')") from None


# -- what the build allowed ------------------------------------------------------------------------------

def requirement_hashes(texts: list[str], platform: str | None = None,
                       python: str | None = None) -> dict[str, tuple[str, list[str]]]:
    """`name==version [; marker] --hash=sha256:X ...` lines (the build's requirement files) -> {canon name: (version,
    [X])}, for the image of `platform` (and `python`, "3.11"): a line whose marker does not hold there is not the
    one pip installed (torch's aarch64 line is not the x86_64 one), as pip itself evaluates it in the build.
    Without a platform the markers are evaluated for this host."""
    from packaging.markers import InvalidMarker, Marker

    from ..specs.platforms import PLATFORM_MACHINE

    env = {"platform_machine": PLATFORM_MACHINE[platform]} if platform in PLATFORM_MACHINE else {}
    if python:
        env.update(python_version=python, python_full_version=f"{python}.0")
    out: dict[str, tuple[str, list[str]]] = {}
    for text in texts:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^]]*\])?==([^\s;]+)\s*(?:;(.*?))?\s*(?:--hash|$)", line)
            if not m:
                continue
            if m.group(3) and m.group(3).strip():
                try:
                    if not Marker(m.group(3).strip()).evaluate(env):
                        continue
                except InvalidMarker:
                    pass  # a line pip would refuse: keep its hashes rather than guess
            out[canon(m.group(1))] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


class WheelhouseFile(Protocol):
    """A file of the build's wheelhouse as the SBOM reads it (supply.wheelhouse.WheelFile; named here so that
    reading an image's SBOM does not load the supply stage)."""

    @property
    def name(self) -> str: ...
    @property
    def sha256(self) -> str: ...


def _wheel_hash(dist: dict, wheels: Sequence[WheelhouseFile]) -> str | None:
    """The wheelhouse file pip installed `dist` from: same name, version and one of its wheel tags."""
    tags = set(dist.get("wheel_tags") or [])
    for w in wheels:
        parts = w.name[:-4].split("-") if w.name.endswith(".whl") else []
        if len(parts) < 5 or canon(parts[0]) != dist["canonical_name"] or parts[1] != dist["version"]:
            continue
        file_tags = {f"{py}-{abi}-{plat}" for py in parts[-3].split(".") for abi in parts[-2].split(".")
                     for plat in parts[-1].split(".")}
        if tags & file_tags:
            return w.sha256
    return None


def artifact_hash(dist: dict, pinned: dict[str, tuple[str, list[str]]],
                  wheels: Sequence[WheelhouseFile]) -> tuple[str | None, str]:
    """(sha256 of the artifact installed, where that is known from) for one inventory entry."""
    archive = ((dist.get("direct_url") or {}).get("archive_info") or {})
    hashes = archive.get("hashes") or {}
    if "sha256" in hashes:
        return hashes["sha256"], "pip direct_url.json"
    if str(archive.get("hash", "")).startswith("sha256="):
        return archive["hash"].split("=", 1)[1], "pip direct_url.json"
    if dist.get("local_file_sha256"):
        url = (dist.get("direct_url") or {}).get("url")
        return dist["local_file_sha256"], f"the file it was installed from, still in the image ({url})"
    from_wheelhouse = _wheel_hash(dist, wheels)
    version, allowed = pinned.get(dist["canonical_name"], (None, []))
    if from_wheelhouse and (not allowed or from_wheelhouse in allowed):
        return from_wheelhouse, "wheelhouse file, hash-checked by pip"
    if version == dist["version"] and len(allowed) == 1:
        return allowed[0], "hash-pinned requirement (pip --require-hashes)"
    if version == dist["version"] and allowed:
        return None, "one of the pinned hashes " + " ".join(allowed) + " (pip does not record which)"
    url = (dist.get("direct_url") or {}).get("url")
    if url:
        return None, f"installed from {url}; pip recorded no hash"
    return None, "not hash-pinned: resolved during the build" if dist.get("installer") == "pip" \
        else f"installed by {dist.get('installer') or 'the base image'}, not by the build's pip"


# -- the document ----------------------------------------------------------------------------------------

def _props(**kw) -> list:
    from cyclonedx.model import Property

    return [Property(name=PROP + k.replace("_", "-"), value=str(v)) for k, v in kw.items() if v not in (None, "")]


def _sha(value: str | None) -> list:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=value)] if value else []


def _patch_components(manifest: dict) -> tuple[list, dict[str, list]]:
    """Each patch file as a component with its sha256, and per series the CycloneDX patches that point at them."""
    from cyclonedx.model import XsUri
    from cyclonedx.model.component import Component, ComponentType, Diff, Patch, PatchClassification

    files, pedigree = [], {}
    for series, entries in sorted((manifest.get("patches") or {}).items()):
        for e in entries:
            path = f"patches/{series}/{e['file']}"
            files.append(Component(type=ComponentType.FILE, name=path, bom_ref=f"patch:{path}",
                                   hashes=_sha(e.get("sha256")), properties=_props(patch_series=series)))
            pedigree.setdefault(series, []).append(
                Patch(type=PatchClassification.UNOFFICIAL, diff=Diff(url=XsUri(path))))
    return files, pedigree


def _dist_components(inventory: dict, manifest: dict, pinned: dict, wheels: Sequence[WheelhouseFile],
                     pedigree: dict) -> list:
    from cyclonedx.model.component import Component, Pedigree
    from packageurl import PackageURL

    patched = {canon(c.get("name") or k): c["patches"] for k, c in (manifest.get("components") or {}).items()
               if c.get("patches")}
    out = []
    for d in inventory["distributions"]:
        sha, how = artifact_hash(d, pinned, wheels)
        series = patched.get(d["canonical_name"])
        out.append(Component(
            name=d["name"], version=d["version"], bom_ref=f"pypi:{d['canonical_name']}",
            purl=PackageURL(type="pypi", name=d["canonical_name"], version=d["version"]), hashes=_sha(sha),
            pedigree=Pedigree(patches=pedigree[series]) if series in pedigree else None,
            properties=_props(hash_source=how, record_sha256=d.get("record_sha256"), location=d.get("location"),
                              installer=d.get("installer"),
                              wheel_tags=" ".join(d.get("wheel_tags") or []),
                              direct_url=json.dumps(d["direct_url"], sort_keys=True) if d.get("direct_url") else None)))
    return out


def _git_components(manifest: dict, pedigree: dict) -> list:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.component import Component, ComponentType, Pedigree

    out = []
    for key, c in sorted((manifest.get("components") or {}).items()):
        if c.get("source") != "git":
            continue
        out.append(Component(
            type=ComponentType.LIBRARY, name=key, version=c["commit"], bom_ref=f"git:{key}",
            external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(c["git"]))],
            pedigree=Pedigree(patches=pedigree[c["patches"]]) if c.get("patches") in pedigree else None,
            properties=_props(git_url=c["git"], git_commit=c["commit"], git_tree=c.get("tree") or "not recorded "
                              "(the tree was not staged by `trainbox image build`)", git_ref=c.get("ref"),
                              install=c.get("install"), subdir=c.get("subdir"), path=c.get("path"))))
    return out


def _base_component(base: dict):
    from cyclonedx.model.component import Component, ComponentType

    digest = base.get("digest")
    ref = digest or base.get("image_id")
    kind = ("registry digest" if digest else
            "image id: no registry digest exists (a local image, e.g. `docker import` / `trainbox base bootstrap`)")
    return Component(type=ComponentType.CONTAINER, name=base["used"], version=ref, bom_ref="base-image",
                     hashes=_sha(ref.split(":", 1)[1] if ref and ref.startswith("sha256:") else None),
                     properties=_props(base_reference=kind, base_requested=base.get("requested"),
                                       base_substituted=base.get("substituted")))


def _toolkit_components(inventory: dict, manifest: dict) -> list:
    from cyclonedx.model.component import Component, ComponentType

    found = inventory.get("toolkits") or {}
    from .toolkits import TOOLKITS

    declared = {t.NAME: t.declared_version(manifest) for t in TOOLKITS.values()}
    out = []
    for name in declared:
        f = found.get(name)
        if f:
            version, where = f["version"], f"found in the image: {f['source']}"
        elif declared[name]:
            version, where = declared[name], "declared by the stack; not in the image (" + (
                "built on a substitute base)" if (manifest.get("base") or {}).get("substituted") else "not found)")
        else:
            continue
        out.append(Component(type=ComponentType.FRAMEWORK, name=f"{name}-toolkit", version=version,
                             bom_ref=f"toolkit:{name}", properties=_props(toolkit_source=where)))
    return out


def make_bom(*, manifest: dict, inventory: dict, base: dict, image: str, content_hash: str, platform: str,
             requirements: list[str], wheels: Sequence[WheelhouseFile]):
    """The CycloneDX Bom of one image (see the module docstring for where each part comes from)."""
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType

    files, pedigree = _patch_components(manifest)
    pinned = requirement_hashes(requirements, platform, manifest.get("python"))
    components = [*_dist_components(inventory, manifest, pinned, wheels, pedigree),
                  *_git_components(manifest, pedigree), *files, _base_component(base),
                  *_toolkit_components(inventory, manifest)]
    subject = Component(type=ComponentType.CONTAINER, name=image, version=content_hash, bom_ref="image",
                        properties=_props(stack=manifest.get("stack"), platform=platform,
                                          python=inventory.get("python"), device=manifest.get("device")))
    when = _dt.datetime.fromtimestamp(source_date_epoch(), _dt.timezone.utc)
    seed = json.dumps([content_hash, platform, inventory, base, manifest.get("patches")], sort_keys=True)
    bom = Bom(components=components, serial_number=uuid.uuid5(uuid.NAMESPACE_URL, "trainbox:" + seed),
              metadata=BomMetaData(component=subject, timestamp=when))
    bom.register_dependency(subject, components)  # the image holds every one of them
    return bom


def to_json(bom) -> str:
    from cyclonedx.output.json import JsonV1Dot6

    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


# -- reading it back -------------------------------------------------------------------------------------

def installed_in(doc: dict) -> dict[str, str]:
    """{canonical name: version} of the distributions an SBOM document lists (pypi purls)."""
    out = {}
    for c in doc.get("components") or []:
        if str(c.get("purl", "")).startswith("pkg:pypi/"):
            out[canon(c["name"])] = c.get("version")
    return out


def compare(doc: dict, inventory: dict) -> list[str]:
    """One line per difference between an SBOM and an inventory of the same image (empty: they agree)."""
    listed, have = installed_in(doc), {d["canonical_name"]: d["version"] for d in inventory["distributions"]}
    lines = [f"{n} {v} is installed but not in the SBOM" for n, v in sorted(have.items()) if n not in listed]
    lines += [f"{n} {v} is in the SBOM but not installed" for n, v in sorted(listed.items()) if n not in have]
    lines += [f"{n}: installed {have[n]}, the SBOM says {listed[n]}" for n in sorted(have)
              if n in listed and listed[n] != have[n]]
    return lines


# -- the image ---------------------------------------------------------------------------------------------

def inventory_of(client: Client, ref: str) -> dict:
    """`python -m trainbox.runtime.installed` in the image (no network, removed after)."""
    proc = client.run("run", "--rm", "--network", "none", "--label", "io.trainbox.sbom-probe=1",
                      "--entrypoint", "/opt/venv/bin/python", ref, "-m", "trainbox.runtime.installed",
                      check=False, timeout=300)
    if proc.returncode != 0:
        raise TrainboxError(f"{ref}: listing what is installed failed (exit {proc.returncode}): "
                            + proc.stderr.decode(errors="replace").strip()[-500:])
    try:
        return json.loads(proc.stdout)
    except ValueError as exc:
        raise TrainboxError(f"{ref}: the inventory is not JSON ({exc})") from None


def layer_tar(doc: str, epoch: int) -> bytes:
    """The SBOM as a tar for `docker cp` into /: directories and file with fixed owner, mode and mtime, so the
    committed layer is the same bytes whenever the document is."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("etc", "etc/trainbox"):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        data = doc.encode()
        info = tarfile.TarInfo(SBOM_PATH.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o644, epoch
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def commit(client: Client, tags: list[str], doc: str) -> str:
    """Write `doc` into the image `tags[0]` at SBOM_PATH as one layer (created container, `docker cp`,
    `docker commit`: no process runs) and move every tag to the result. Returns the document's sha256."""
    digest = hashlib.sha256(doc.encode()).hexdigest()
    # no --label here: `docker commit` would carry the container's labels into the image
    cid = client.run("create", "--network", "none", tags[0]).stdout.decode().strip()
    try:
        client.run("cp", "-", f"{cid}:/", input=layer_tar(doc, source_date_epoch()))
        client.run("commit", "-m", f"trainbox: the SBOM at {SBOM_PATH}", "--change",
                   f"LABEL {SBOM_LABEL}=sha256:{digest}", cid, tags[0])
    finally:
        client.run("rm", "-f", cid, check=False)
    for t in tags[1:]:
        client.tag(tags[0], t)
    return digest


# An SBOM of the largest stack is ~200 KiB; a bound keeps a hostile image from filling memory through `docker cp`.
MAX_SBOM_BYTES = 32 << 20


def read_from_image(client: Client, ref: str) -> str:
    """The SBOM document an image carries (its text), or a TrainboxError saying it has none or that what is
    there is not a plain UTF-8 file (a link is refused, never followed)."""
    if not client.image_exists(ref):  # `docker create` would try to pull it
        raise TrainboxError(f"{ref}: no such image in this engine (`trainbox image ls` lists trainbox's)")
    # a command for images without CMD (never run: the container is only read)
    cid = client.run("create", "--network", "none", "--label", "io.trainbox.sbom-probe=1", ref, "true").stdout \
        .decode().strip()
    try:
        proc = client.run("cp", f"{cid}:{SBOM_PATH}", "-", check=False, timeout=120)
    finally:
        client.run("rm", "-f", cid, check=False)
    if proc.returncode != 0:
        raise TrainboxError(f"{ref}: no SBOM at {SBOM_PATH} (an image not built by `trainbox image build`, or one "
                            "built before SBOMs); rebuild it with `trainbox image build --force`")
    where = f"{ref}: {SBOM_PATH}"
    try:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            member = tar.next()
            if member is not None and (member.issym() or member.islnk()):
                raise TrainboxError(f"{where} is a link (to {printable(member.linkname)[:200]}), not the file trainbox "
                                    "writes; refusing to follow it: rebuild the image with `trainbox image build "
                                    "--force`")
            if member is None or not member.isfile():
                raise TrainboxError(f"{where} is not a file; rebuild the image with `trainbox image build --force`")
            if member.size > MAX_SBOM_BYTES:
                raise TrainboxError(f"{where}: {member.size} bytes; an SBOM may hold at most {MAX_SBOM_BYTES}")
            raw = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise TrainboxError(f"{where}: `docker cp` gave no readable tar ({' '.join(str(exc).split())[:200]})") \
            from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrainboxError(f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); not an "
                            "SBOM trainbox wrote: rebuild the image with `trainbox image build --force`") from None


# -- reading a document from elsewhere (an image anyone may have built) ------------------------------------

class SbomError(TrainboxError):
    """An SBOM document that is not the CycloneDX shape `image sbom` reads (one line: where, key, expected)."""


def _expect(value, kind: type | tuple, where: str, key: str, optional: bool = True):
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = {dict: "an object", list: "an array", str: "a string"}
        want = names.get(kind, getattr(kind, "__name__", str(kind)))
        got = "nothing" if value is None else type(value).__name__.replace("dict", "object").replace("list", "array")
        raise SbomError(f"{where}: {key}: expected {want}, got {got}; not an SBOM trainbox wrote")
    return value


def parse_document(text: str, where: str) -> dict:
    """Parse and check an SBOM's text: JSON (depth-bounded), an object, and every field `image sbom` shows of
    the type CycloneDX gives it (components[].name a string, properties[] objects with string name and value ...).
    SbomError (one line) otherwise."""
    from ..yamlfile import json_loads as loads

    try:
        doc = loads(text)
    except ValueError as exc:
        raise SbomError(f"{where}: {exc}; not an SBOM trainbox wrote") from None
    _expect(doc, dict, where, "(top level)", optional=False)
    meta = _expect(doc.get("metadata"), dict, where, "metadata") or {}
    subject = _expect(meta.get("component"), dict, where, "metadata.component") or {}
    for key in ("name", "version"):
        _expect(subject.get(key), str, where, f"metadata.component.{key}")
    for key in ("bomFormat", "specVersion"):
        _expect(doc.get(key), str, where, key)
    for i, c in enumerate(_expect(doc.get("components"), list, where, "components") or []):
        at = f"components[{i}]"
        _expect(c, dict, where, at, optional=False)
        _expect(c.get("name"), str, where, f"{at}.name", optional=False)
        for key in ("type", "version"):
            _expect(c.get(key), str, where, f"{at}.{key}")
        for j, prop in enumerate(_expect(c.get("properties"), list, where, f"{at}.properties") or []):
            _expect(prop, dict, where, f"{at}.properties[{j}]", optional=False)
            _expect(prop.get("name"), str, where, f"{at}.properties[{j}].name", optional=False)
            _expect(prop.get("value"), str, where, f"{at}.properties[{j}].value")
        for j, h in enumerate(_expect(c.get("hashes"), list, where, f"{at}.hashes") or []):
            _expect(h, dict, where, f"{at}.hashes[{j}]", optional=False)
            for key in ("alg", "content"):
                _expect(h.get(key), str, where, f"{at}.hashes[{j}].{key}")
    return doc


def summary(doc: dict, image: str) -> tuple[str, list[list[str]]]:
    """The heading line and the table rows `image sbom` prints (every value printable: see `printable`)."""
    subject = (doc.get("metadata") or {}).get("component") or {}
    head = (f"{printable(image)}: {printable(subject.get('name'))} {printable(subject.get('version'))} "
            f"({printable(doc.get('bomFormat'))} {printable(doc.get('specVersion'))}, "
            f"{len(doc.get('components') or [])} components)")
    rows = []
    for c in doc.get("components") or []:
        props = {p["name"].removeprefix(PROP): p.get("value") or "" for p in c.get("properties") or []}
        sha = next((h.get("content") or "" for h in c.get("hashes") or [] if h.get("alg") == "SHA-256"), "")
        note = props.get("git-url") or props.get("base-reference") or props.get("toolkit-source") \
            or props.get("hash-source") or props.get("patch-series") or ""
        rows.append([printable(x) for x in (c.get("type") or "", c["name"], c.get("version") or "", sha[:16], note)])
    return head, rows


def json_text(text: str, doc: dict) -> str:
    """The document for `image sbom --json`: its own text, unless that holds a raw control character JSON lets
    through (DEL, C1, bidi overrides); then the same document with every one escaped."""
    if all(c.isprintable() or c in "\n\r\t " for c in text):
        return text
    return json.dumps(doc, indent=2, ensure_ascii=True).replace("\x7f", "\\u007f") + "\n"


def write_beside(report_path: Path, doc: str) -> Path:
    """The SBOM next to the build report: build/reports/<stack>.json -> <stack>.sbom.cdx.json."""
    out = report_path.with_name(report_path.name.removesuffix(".json") + ".sbom.cdx.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(out, doc)
