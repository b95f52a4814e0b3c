"""Build-action programs: each module with a ``main`` is one Bazel action."""
