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

def label_string(label):
    """`//package:name` (`@repo//package:name` outside the main repository), the same on every Bazel release.

    `str(label)` is not: Bazel 4 prints `//package:name`, Bazel 7 and later `@@//package:name` or
    `@//package:name`. Strings that end up in output bytes (image history, provenance) use this instead,
    so a Bazel upgrade changes no digest.
    """
    repo = "@" + label.workspace_name if label.workspace_name else ""
    return "%s//%s:%s" % (repo, label.package, label.name)
