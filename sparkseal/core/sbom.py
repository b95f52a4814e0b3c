"""What an SBOM of one platform's image says: one package list, which every SBOM format renders.

sparkseal writes the image's SBOM in two formats (SPDX 2.3 and CycloneDX 1.6, sparkseal/actions/sbom.py).
Both are renderings of one :class:`SbomContent`, read here once from the action's inputs, so that a
package, its version, its sha256, its package URL, its supplier or its licence has one home and the two
documents cannot disagree:

* every locked Debian package of the base OS and every locked wheel (sha256 from the locks, which the
  repository rules verify on download);
* the wheels the build made (our vLLM wheel, the sparkseal wheel), hashed here, with the licence their
  METADATA declares;
* the vLLM sdist and upstream wheel our vLLM wheel is made from, and the patch series applied to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from sparkseal.core.patchset import PatchError, read_headers
from sparkseal.core.slsa import (
    PLATFORMS,
    Locked,
    ProvenanceError,
    VllmSources,
    built_wheel,
    debian_packages,
    generic_purl,
    pypi_purl,
    python_wheels,
    vllm_sources,
)

# Who supplied each kind of file, where the inputs tell it: the Debian lock's packages come from the
# Debian archive, and the built wheels from this build. A locked wheel's author is not in its lock.
SUPPLIERS = {"deb": "Debian", "built-wheel": "sparkseal"}


@dataclass(frozen=True)
class SbomInputs:
    """Everything one SBOM is made from (the action's arguments, parsed)."""

    platform: str
    name: str
    vllm_lock: Path
    python_lock: Path
    debian_lock: Path
    vllm_wheel: Path
    wheels: tuple[Path, ...]
    patches: tuple[tuple[str, Path], ...]


@dataclass(frozen=True)
class License:
    """A licence a wheel's METADATA declares: an SPDX expression (``License-Expression``, PEP 639) or free
    text (the older ``License`` field), which only some formats can carry."""

    text: str
    expression: bool


@dataclass(frozen=True)
class Package:
    """One file the SBOM lists: the locked or built file, and what is known of its origin."""

    item: Locked
    license: License | None = None

    @property
    def supplier(self) -> str | None:
        """Who supplied the file, where the inputs tell it (:data:`SUPPLIERS`)."""
        return SUPPLIERS.get(self.item.role)


@dataclass(frozen=True)
class SeriesPatch:
    """One patch of the vLLM series: its name in the repository, its bytes and its header."""

    name: str
    data: bytes
    subject: str
    upstream: str

    @property
    def sha1(self) -> str:
        return hashlib.sha1(self.data).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def upstreamed(self) -> bool:
        """Whether the header names an upstream change it carries (``Upstream: none ...`` says it is ours)."""
        return not self.upstream.lower().startswith("none")


@dataclass(frozen=True)
class SbomContent:
    """The image's packages and what our vLLM wheel is made of, as every SBOM format describes them."""

    platform: str
    name: str
    vllm: VllmSources
    built_vllm: Package
    installed: tuple[Package, ...]
    patches: tuple[SeriesPatch, ...]

    @property
    def sources(self) -> tuple[Package, Package]:
        """The vLLM sdist and the upstream wheel our vLLM wheel is made from (not installed as they are)."""
        return Package(self.vllm.sdist), Package(self.vllm.wheel)

    @property
    def built_from(self) -> str:
        """One sentence on how our vLLM wheel was made."""
        return (
            f"Built by sparkseal from the vLLM sdist at commit {self.vllm.commit} with the patches of the "
            "series applied and the upstream wheel's compiled files."
        )


def wheel_license(path: Path) -> License | None:
    """The licence the METADATA of a built wheel declares; None when it declares none."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [
                name
                for name in archive.namelist()
                if name.count("/") == 1 and name.endswith(".dist-info/METADATA")
            ]
            if len(names) != 1:
                raise ProvenanceError(
                    f"{path}: expected one top-level *.dist-info/METADATA, found {len(names)}"
                )
            text = archive.read(names[0]).decode("utf-8")
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise ProvenanceError(f"{path}: expected a wheel with UTF-8 METADATA, found: {error}") from error
    headers = HeaderParser().parsestr(text)
    expression = (headers.get("License-Expression") or "").strip()
    if expression:
        return License(expression, expression=True)
    # Older metadata: free text, of which the first line names the licence; setuptools writes UNKNOWN.
    lines = (headers.get("License") or "").strip().splitlines()
    if lines and lines[0].strip() not in ("", "UNKNOWN"):
        return License(lines[0].strip(), expression=False)
    return None


def _built(path: Path, published: bool) -> Package:
    """A wheel this build made, with a package URL told by its content (``published``: its project is on
    the package index, as vLLM is; the sparkseal wheel's is not)."""
    item = built_wheel(path)
    purl = (
        pypi_purl(item.name, item.version, item.filename, item.sha256)
        if published
        else generic_purl(item.name, item.version, item.filename, item.sha256)
    )
    return Package(dataclasses.replace(item, purl=purl), wheel_license(path))


def _series_patch(name: str, path: Path) -> SeriesPatch:
    try:
        data = path.read_bytes()
    except FileNotFoundError as error:
        raise ProvenanceError(f"{path}: expected the patch {name}, found no file") from error
    try:
        headers = read_headers(data, str(path))
    except PatchError as error:
        raise ProvenanceError(str(error)) from error
    return SeriesPatch(name, data, headers["Subject"], headers["Upstream"])


def read_content(inputs: SbomInputs) -> SbomContent:
    """Read the locks, hash the built wheels and read the patches of ``inputs``."""
    if inputs.platform not in PLATFORMS:
        raise ProvenanceError(
            f"--platform: expected one of {', '.join(PLATFORMS)}, found {inputs.platform!r}"
        )
    vllm = vllm_sources(inputs.vllm_lock, inputs.platform)
    ours = _built(inputs.vllm_wheel, published=True)
    if ours.item.name != "vllm":
        raise ProvenanceError(f"{inputs.vllm_wheel}: expected a vllm wheel, found project {ours.item.name!r}")
    installed = (
        *(Package(item) for item in debian_packages(inputs.debian_lock)),
        *(Package(item) for item in python_wheels(inputs.python_lock, "wheel")),
        *sorted((_built(path, published=False) for path in inputs.wheels), key=lambda p: p.item.filename),
    )
    patches = tuple(_series_patch(name, path) for name, path in inputs.patches)
    return SbomContent(inputs.platform, inputs.name, vllm, ours, installed, patches)
