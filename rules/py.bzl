"""The Python rules of this workspace, loaded by every BUILD file from here and from nowhere else.

Bazel 4 provides `py_library` and `py_binary` natively; Bazel 8 removes the native rules in favour of
rules_python's. Every BUILD file loads them from this file, so that switch is one edit here. Programs
that actions run are `py_tool`s: they start on the locked interpreter, never through a host Python.
"""

load("//rules/private:py_tool.bzl", _py_tool = "py_tool")

py_tool = _py_tool

def py_library(**kwargs):
    """A Python library (Bazel's native `py_library`)."""
    native.py_library(**kwargs)

def py_binary(**kwargs):
    """A Python program (Bazel's native `py_binary`)."""
    native.py_binary(**kwargs)
