"""sparkseal's external repositories, declared once for both entry points: WORKSPACE and MODULE.bazel.

`SPARKSEAL_REPOSITORIES` lists what the build fetches, each entry one call of a repository rule (or of
the locked toolchains) with the lock it reads; the locks are the only source of truth for what each
repository holds. Two entry points declare them, through the same `declare_repositories`:

- WORKSPACE (Bazel 4.2.3, and Bazel 7.7.1 with `--config=bazel7`): `sparkseal_repositories()`, then
  the `repositories.bzl` that the `vllm_lock` and `python_lock` hubs generate from their locks (a
  WORKSPACE macro cannot read a file, so those hubs write the `pypi_file` calls out);
- MODULE.bazel (bzlmod, Bazel 7.7.1's default): the `sparkseal` module extension of
  rules/extensions.bzl, which reads the same locks with the same readers (`vllm_pins`, `python_pins`)
  and declares the same `pypi_file` repositories itself.

Either way the repositories have the same names and attributes, so every BUILD file is the same.
"""

load(":common.bzl", "label_string")
load(":cuda_toolkit.bzl", "cuda_toolkit")
load(":debian.bzl", "debian_packages")
load(":host_wheel.bzl", "host_wheel")
load(":patch_series.bzl", "patch_series")
load(":platforms.bzl", "DEBIAN_ARCHITECTURES", "PLATFORMS")
load(":pypi_file.bzl", "pypi_file")
load(":python_lock.bzl", "python_lock", "python_pins")
load(":secret_scanner.bzl", "secret_scanner")
load(":toolchains.bzl", "locked_toolchain")
load(":vllm_lock.bzl", "vllm_lock", "vllm_pins")

# What the project fetches, in WORKSPACE order: (kind, attributes). Kinds are the repository rules
# below (KINDS); "toolchains" are the locked interpreter and compilers of rules/private/toolchains.bzl.
SPARKSEAL_REPOSITORIES = [
    # The build's own interpreter and compilers, from locked Debian packages (third_party/toolchains):
    # every action runs on them, none on the host's python3 or g++.
    ("toolchains", {}),
    # vLLM: the locked sdist and upstream wheels, fetched by sha256 through the pip index.
    ("vllm_lock", {"name": "vllm_lock", "lock": "//third_party/vllm:vllm.lock.json"}),
    # The order of our patch series, read from patches/vllm/series.
    ("patch_series", {"name": "vllm_patches", "series": "//patches/vllm:series"}),
    # The kernels toolchain (kernels_sm121): CUDA 13.0, cmake, ninja, scikit-build-core from locked wheels
    # (`python3 -m sparkseal.fetch.lock_wheels` writes the lock).
    ("cuda_toolkit", {"name": "sparkseal_cuda", "lock": "//third_party/cuda:toolchain.lock.json"}),
    # The image's base OS: Debian bookworm packages locked per architecture (`sparkseal lock debian`).
    ("debian_packages", {"name": "debian_linux_aarch64", "lock": "//third_party/debian:bookworm_arm64.lock.json"}),
    ("debian_packages", {"name": "debian_linux_x86_64", "lock": "//third_party/debian:bookworm_amd64.lock.json"}),
    # Python dependencies of the image: one hash-locked requirements file per platform (written by
    # `sparkseal lock python`), each wheel a pypi_file fetched only when a target needs it.
    ("python_lock", {
        "name": "python_deps",
        "files": {
            "//third_party/python:requirements_linux_aarch64.files.json": "linux_aarch64",
            "//third_party/python:requirements_linux_x86_64.files.json": "linux_x86_64",
        },
        "locks": {
            "//third_party/python:requirements_linux_aarch64.txt": "linux_aarch64",
            "//third_party/python:requirements_linux_x86_64.txt": "linux_x86_64",
        },
    }),
    # Build tools that run inside actions (the wheel installer), locked the same way.
    ("python_lock", {
        "name": "python_tools",
        "files": {"//third_party/python:tools.files.json": "any"},
        "locks": {"//third_party/python:tools.txt": "any"},
        # Wheels that rules name themselves (rules/private/{pex,image}.bzl), not through the
        # hub: under bzlmod the main repository imports them too.
        "direct": ["python_tools_any_installer", "python_tools_any_pex"],
    }),
    # The secret scanner of the layer scan: Kingfisher and its maintained rule catalogue, locked by sha256.
    ("secret_scanner", {"name": "secret_scanner", "lock": "//third_party/scan:scanner.lock.json"}),
    # The zstd compressor of zstd image layers (--config=zstd): python-zstandard, locked by sha256 per
    # build host. Fetched only when a build asks for zstd layers.
    ("host_wheel", {"name": "zstandard", "lock": "//third_party/zstd:zstandard.lock.json", "module": "zstandard"}),
]

KINDS = {
    "cuda_toolkit": cuda_toolkit,
    "debian_packages": debian_packages,
    "host_wheel": host_wheel,
    "patch_series": patch_series,
    "python_lock": python_lock,
    "secret_scanner": secret_scanner,
    "vllm_lock": vllm_lock,
}

# The attributes of each kind that name files (labels); "locks"/"files" map labels to platforms.
LABEL_ATTRS = ["lock", "series"]
LABEL_DICT_ATTRS = ["locks", "files"]

def toolchain_repositories():
    """`(name, kind, platform, lock)` of the locked interpreter and compiler of every platform."""
    return [
        (
            "sparkseal_%s_%s" % (kind, platform),
            kind,
            platform,
            "//third_party/toolchains:%s_bookworm_%s.lock.json" % (kind, DEBIAN_ARCHITECTURES[platform]),
        )
        for platform in PLATFORMS
        for kind in ["python", "cc"]
    ]

def declared_names(kind, attrs):
    """The repositories of one entry that BUILD files and rules name (MODULE.bazel's use_repo)."""
    if kind == "toolchains":
        return [name for name, _, _, _ in toolchain_repositories()]
    return [attrs["name"]] + attrs.get("direct", [])

def _labels(attrs, label):
    """`attrs` with every file attribute passed through `label` (Label under bzlmod, as is in WORKSPACE)."""
    out = dict(attrs)
    for key in LABEL_ATTRS:
        if key in out:
            out[key] = label(out[key])
    for key in LABEL_DICT_ATTRS:
        if key in out:
            out[key] = {label(k): v for k, v in out[key].items()}
    return out

def _as_is(label):
    return label

def declare_repositories(kind, attrs, reader = None):
    """Declare the repositories of one entry (`kind`, `attrs`) of SPARKSEAL_REPOSITORIES.

    Called from a WORKSPACE macro (`reader` None: label strings are the main repository's, and the
    `pypi_file`s of a lock hub are left to the `repositories.bzl` it generates) or from the module
    extension (`reader` the module context: labels become Labels of this file's repository, the main
    one, and the hub's locks are read here, with the hub's own reader, to declare its `pypi_file`s).
    """
    label = Label if reader != None else _as_is
    if kind == "toolchains":
        for name, toolchain_kind, platform, lock in toolchain_repositories():
            locked_toolchain(name = name, kind = toolchain_kind, platform = platform, lock = label(lock))
        return
    if kind not in KINDS:
        fail("sparkseal: unknown repository kind %r (expected toolchains or one of %s)" % (kind, ", ".join(sorted(KINDS))))
    attrs = _labels(attrs, label)
    direct = attrs.pop("direct", [])
    KINDS[kind](**attrs)
    if reader == None:
        return
    repos = []
    if kind == "vllm_lock":
        repos = vllm_pins(reader.read(attrs["lock"]), label_string(attrs["lock"])).repos
    elif kind == "python_lock":
        repos = python_pins(reader, attrs["name"], attrs["locks"], attrs["files"]).repos
    for name, filename, sha256 in repos:
        pypi_file(name = name, filename = filename, sha256 = sha256)
    missing = [name for name in direct if name not in [repo for repo, _, _ in repos]]
    if missing:
        fail("sparkseal: %s %s: `direct` names %s, which its locks do not declare" % (kind, attrs["name"], ", ".join(missing)))

def sparkseal_repositories():
    """Declares every repository of SPARKSEAL_REPOSITORIES and registers the toolchains (WORKSPACE).

    Then load and call the generated `repositories.bzl` of `@vllm_lock`, `@python_deps` and
    `@python_tools` (WORKSPACE shows how).
    """
    for kind, attrs in SPARKSEAL_REPOSITORIES:
        declare_repositories(kind, attrs)
    register_sparkseal_toolchains()

def register_sparkseal_toolchains():
    """Registers the toolchains of //third_party/toolchains (WORKSPACE; MODULE.bazel registers them too)."""
    native.register_toolchains("//third_party/toolchains:all")

def sparkseal_toolchains():
    """Declares the locked toolchains' repositories and registers their toolchains (WORKSPACE).

    A repository is fetched only when toolchain resolution picks it: the one of the platform the
    actions execute on.
    """
    declare_repositories("toolchains", {})
    register_sparkseal_toolchains()
