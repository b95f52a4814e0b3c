"""The Python rules of this workspace, loaded by every BUILD file from here and from nowhere else.

Bazel 4.2.3 to 7 provide `py_library` and `py_binary` natively; later releases drop the native rules in
favour of rules_python's. These wrappers call the native rule where the running Bazel has one and
rules_python's otherwise, so BUILD files see one face on every release. `@rules_python` is Bazel's own
under bzlmod (MODULE.bazel), Debian's under Bazel 7.7.1 WORKSPACE (`--config=bazel7`) and, on Bazel
4.2.3, the stand-in third_party/bazel/rules_python (the native rules again). Programs that actions run are
`py_tool`s: they start on the locked interpreter, never through a host Python.
"""

load("@rules_python//python:defs.bzl", _rules_python_binary = "py_binary", _rules_python_library = "py_library")
load("//rules/private:py_tool.bzl", _py_tool = "py_tool")

py_tool = _py_tool

def py_library(**kwargs):
    """A Python library: Bazel's native `py_library`, rules_python's where Bazel has none."""
    if hasattr(native, "py_library"):
        native.py_library(**kwargs)
    else:
        _rules_python_library(**kwargs)

def py_binary(**kwargs):
    """A Python program: Bazel's native `py_binary`, rules_python's where Bazel has none."""
    if hasattr(native, "py_binary"):
        native.py_binary(**kwargs)
    else:
        _rules_python_binary(**kwargs)
