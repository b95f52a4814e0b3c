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
