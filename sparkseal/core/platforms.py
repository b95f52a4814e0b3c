"""The one table of sparkseal's platforms: wheel-tag style names and what each is called elsewhere.

Everything in the build says ``linux_aarch64`` or ``linux_x86_64``, as wheel tags do; OCI image configs and
indexes need the Go-style triple, manylinux tags the machine name, Debian its architecture name, and all of
them get it from here. ``rules/private/platforms.bzl`` repeats the names for Starlark (a test keeps the two
equal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OciPlatform:
    """An OCI platform: ``os``, ``architecture`` and, where the architecture has one, ``variant``."""

    os: str
    architecture: str
    variant: str = ""

    def as_dict(self) -> dict[str, str]:
        """The platform object of an OCI index entry (and the matching image config fields)."""
        fields = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            fields["variant"] = self.variant
        return fields

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


# arm64 carries variant v8, as the image-spec platform table lists it and as registries label
# GB10 (Grace, Armv9 but run as arm64 v8) images; amd64 has no variant.
PLATFORMS: dict[str, OciPlatform] = {
    "linux_aarch64": OciPlatform(os="linux", architecture="arm64", variant="v8"),
    "linux_x86_64": OciPlatform(os="linux", architecture="amd64"),
}


def oci_platform(name: str) -> OciPlatform:
    """Return the OCI platform of a sparkseal platform name; ``ValueError`` lists the known names."""
    try:
        return PLATFORMS[name]
    except KeyError:
        known = ", ".join(sorted(PLATFORMS))
        raise ValueError(f"unknown platform {name!r}: expected one of {known}") from None


# The machine part of a manylinux platform tag (``manylinux_2_28_aarch64``) and of ``uname -m``.
MACHINES: dict[str, str] = {
    "linux_aarch64": "aarch64",
    "linux_x86_64": "x86_64",
}

# Debian's architecture names, used by the Debian locks and apt.
DEBIAN_ARCHITECTURES: dict[str, str] = {
    "linux_aarch64": "arm64",
    "linux_x86_64": "amd64",
}
