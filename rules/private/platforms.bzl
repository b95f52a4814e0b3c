"""The platforms every rule and BUILD file knows, the Starlark side of `sparkseal/core/platforms.py`.

Names are wheel-tag style everywhere (`linux_aarch64`, `linux_x86_64`); a test keeps this table equal to
the Python one, which also maps each name to its OCI platform and manylinux machine.
"""

PLATFORMS = ["linux_aarch64", "linux_x86_64"]

# Debian's architecture name of each platform (the Debian locks are per architecture).
DEBIAN_ARCHITECTURES = {
    "linux_aarch64": "arm64",
    "linux_x86_64": "amd64",
}
