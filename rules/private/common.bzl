"""Settings shared by every sparkseal build action."""

# The environment of every action: a fixed locale and hash seed so that Python tools behave the same on
# every machine, and no bytecode written next to sources in the sandbox.
ACTION_ENV = {
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "TZ": "UTC",
}

def tool(label):
    """An attribute for one of sparkseal's action programs, built for the execution platform."""
    return attr.label(default = Label(label), executable = True, cfg = "exec")

def apparent_repo_name(name):
    """The name a user writes for the repository Bazel calls `name`: bzlmod's canonical names lose their
    prefix (`_main~sparkseal~vllm_sdist`, Bazel 6 and 7, and `+sparkseal+vllm_sdist`, Bazel 8, are
    `vllm_sdist`; `rules_python~0.22.1` and `rules_python+` are `rules_python`), any other name is itself.

    sparkseal/core/repo_names.py's apparent_name for Starlark (tests/unit/test_repo_names.py holds the two
    to the same answers): what rules print, e.g. `rctx.name` in a fail(), goes through this.
    """
    for separator in ["~", "+"]:
        if separator in name:
            parts = name.split(separator)
            if len(parts) == 2:
                return parts[0] or parts[1]
            return parts[-1]
    return name

def label_string(label):
    """`//package:name` (`@repo//package:name` outside the main repository), the same on every Bazel release
    and in every mode: the label as the user wrote it.

    `str(label)` is not: Bazel 4 prints `//package:name`, Bazel 7 and later `@@//package:name` or
    `@//package:name`, and under bzlmod `@@_main~sparkseal~vllm_sdist//file:file`. Strings that end up in
    output bytes (image history, provenance) and in fail() messages use this instead, so a Bazel upgrade
    changes no digest and a user reads the names of their own BUILD files.
    """
    repo = "@" + apparent_repo_name(label.workspace_name) if label.workspace_name else ""
    return "%s//%s:%s" % (repo, label.package, label.name)
