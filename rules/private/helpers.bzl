"""The Python helpers repository rules run, each with every source file it imports.

A repository rule runs a helper with only these files on its path, each read through its label: Bazel then
re-runs the rule when one of them changes (editing sparkseal/fetch/series.py or the series reader in
sparkseal/core/patchset.py re-runs @vllm_patches), and a helper that imports an undeclared module fails
instead of reading the checkout. tests/unit/test_hygiene.py keeps each list equal to the helper's imports.
"""

HELPER_SOURCES = {
    "sparkseal.fetch.actual_sha256": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/credentials.py",
        "sparkseal/core/determinism.py",
        "sparkseal/core/digests.py",
        "sparkseal/core/platforms.py",
        "sparkseal/core/tree.py",
        "sparkseal/core/wheels.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/actual_sha256.py",
        "sparkseal/fetch/download.py",
        "sparkseal/fetch/index.py",
    ],
    "sparkseal.fetch.credentials": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/credentials.py",
        "sparkseal/core/platforms.py",
        "sparkseal/core/wheels.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/credentials.py",
        "sparkseal/fetch/index.py",
    ],
    "sparkseal.fetch.debian_archive": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/credentials.py",
        "sparkseal/core/determinism.py",
        "sparkseal/core/files.py",
        "sparkseal/core/platforms.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/debian_archive.py",
        "sparkseal/fetch/lock_debian.py",
    ],
    "sparkseal.fetch.resolve": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/credentials.py",
        "sparkseal/core/platforms.py",
        "sparkseal/core/wheels.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/credentials.py",
        "sparkseal/fetch/index.py",
        "sparkseal/fetch/resolve.py",
    ],
    "sparkseal.fetch.toolchain_root": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/determinism.py",
        "sparkseal/core/digests.py",
        "sparkseal/core/paths.py",
        "sparkseal/core/platforms.py",
        "sparkseal/core/tree.py",
        "sparkseal/core/wheels.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/toolchain_root.py",
        "sparkseal/install/__init__.py",
        "sparkseal/install/bytecode.py",
        "sparkseal/install/debian_rootfs.py",
    ],
    "sparkseal.fetch.series": [
        "sparkseal/__init__.py",
        "sparkseal/core/__init__.py",
        "sparkseal/core/patchset.py",
        "sparkseal/core/paths.py",
        "sparkseal/fetch/__init__.py",
        "sparkseal/fetch/series.py",
    ],
}
