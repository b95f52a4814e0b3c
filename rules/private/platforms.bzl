"""The platforms every rule and BUILD file knows, the Starlark side of `sparkseal/core/platforms.py`.

Names are wheel-tag style everywhere (`linux_aarch64`, `linux_x86_64`); a test keeps this table equal to
the Python one, which also maps each name to its OCI platform and manylinux machine.
"""

# Every platform a rule builds for (wheel-tag names); the `platform` attributes take one of these.
PLATFORMS = ["linux_aarch64", "linux_x86_64"]

# `uname -m` of a build host -> the platform of the locked host tools it runs (the scanner, nvcc, zstd).
HOST_PLATFORMS = {
    "aarch64": "linux_aarch64",
    "x86_64": "linux_x86_64",
}

def host_platform(rctx, purpose):
    """The platform of the machine a repository rule runs on; fails naming `purpose` on another host."""
    os_name = rctx.os.name.lower()
    uname = rctx.execute(["uname", "-m"])
    arch = uname.stdout.strip()
    if not os_name.startswith("linux") or uname.return_code != 0 or arch not in HOST_PLATFORMS:
        fail("sparkseal: %s: expected a Linux build host of %s, got os %r, arch %r" % (
            purpose,
            " or ".join(sorted(HOST_PLATFORMS)),
            os_name,
            arch,
        ))
    return HOST_PLATFORMS[arch]

# Debian's architecture name of each platform (the Debian locks are per architecture).
DEBIAN_ARCHITECTURES = {
    "linux_aarch64": "arm64",
    "linux_x86_64": "amd64",
}

# Debian's multiarch triplet of each platform (library folders, compiler names of the locked toolchains).
TRIPLETS = {
    "linux_aarch64": "aarch64-linux-gnu",
    "linux_x86_64": "x86_64-linux-gnu",
}

# The constraint values of each platform, for toolchain and execution-platform matching.
CONSTRAINTS = {
    "linux_aarch64": ["@platforms//os:linux", "@platforms//cpu:aarch64"],
    "linux_x86_64": ["@platforms//os:linux", "@platforms//cpu:x86_64"],
}
