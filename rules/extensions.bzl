"""The `sparkseal` module extension: MODULE.bazel's side of rules/private/repositories.bzl (bzlmod only).

MODULE.bazel use::

    sparkseal = use_extension("//rules:extensions.bzl", "sparkseal")
    sparkseal.repositories()
    use_repo(sparkseal, "vllm_lock", ...)

`repositories()` declares everything `SPARKSEAL_REPOSITORIES` lists, exactly as WORKSPACE's
`sparkseal_repositories()` does, and reads the `vllm_lock` and `python_lock` locks with the same readers
to declare their `pypi_file` repositories (under WORKSPACE the hubs' generated `repositories.bzl` does).
The other tags declare one entry each, with the attributes of the WORKSPACE rule of the same name, for
workspaces that need only some (the test fixtures): `toolchains()`, `vllm_lock`, `patch_series`,
`cuda_toolkit`, `debian_packages`, `python_lock`, `secret_scanner`, `host_wheel`.

Only the root module's tags count. The extension is reproducible (its repositories are a function of
the locks it reads), so Bazel keeps none of it in a lockfile.

Bazel 4.2.3 cannot load this file (`module_extension` came with Bazel 6), so nothing else loads it.
"""

load("//rules/private:repositories.bzl", "SPARKSEAL_REPOSITORIES", "declare_repositories", "declared_names")

_NAME = {"name": attr.string(mandatory = True)}
_LOCK = {"lock": attr.label(mandatory = True, allow_single_file = [".json"])}

_TAGS = {
    "cuda_toolkit": dict(_NAME, host = attr.string(), **_LOCK),
    "debian_packages": dict(_NAME, **_LOCK),
    "host_wheel": dict(_NAME, module = attr.string(mandatory = True), project = attr.string(), **_LOCK),
    "patch_series": dict(_NAME, series = attr.label(mandatory = True, allow_single_file = True)),
    "python_lock": dict(
        _NAME,
        direct = attr.string_list(doc = "pypi_file repositories that rules name themselves (imported too)"),
        files = attr.label_keyed_string_dict(mandatory = True, allow_files = [".json"]),
        locks = attr.label_keyed_string_dict(mandatory = True, allow_files = [".txt"]),
    ),
    "secret_scanner": dict(_NAME, local_binary = attr.string(), **_LOCK),
    "toolchains": {},
    "vllm_lock": dict(_NAME, **_LOCK),
}

def _root_entries(mctx):
    """(kind, attrs) of every tag of the root module, `repositories()` expanded, in the tags' order."""
    entries = []
    for module in mctx.modules:
        if not module.is_root:
            continue
        for _ in module.tags.repositories:
            entries.extend(SPARKSEAL_REPOSITORIES)
        for kind in sorted(_TAGS):
            for tag in getattr(module.tags, kind):
                entries.append((kind, {key: getattr(tag, key) for key in _TAGS[kind]}))
    return entries

def _sparkseal_impl(mctx):
    names = []
    for kind, attrs in _root_entries(mctx):
        for name in declared_names(kind, attrs):
            if name in names:
                fail("sparkseal: the repository %r is declared twice in MODULE.bazel's sparkseal tags" % name)
            names.append(name)
        declare_repositories(kind, attrs, reader = mctx)
    return mctx.extension_metadata(
        root_module_direct_deps = sorted(names),
        root_module_direct_dev_deps = [],
        reproducible = True,
    )

sparkseal = module_extension(
    implementation = _sparkseal_impl,
    doc = "sparkseal's repositories from its locks, as WORKSPACE declares them (rules/private/repositories.bzl).",
    tag_classes = dict(
        {kind: tag_class(attrs = attrs) for kind, attrs in _TAGS.items()},
        repositories = tag_class(doc = "Every repository of SPARKSEAL_REPOSITORIES (the project's own)."),
    ),
)
