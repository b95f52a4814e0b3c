"""Offline stand-in for @rules_python (Bazel 4.2.3 WORKSPACE): re-exports Bazel's native Python rules."""

py_binary = native.py_binary
py_library = native.py_library
