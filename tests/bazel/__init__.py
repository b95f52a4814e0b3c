"""Tests that run Bazel: fixture workspaces and the real one (docs/layout.md)."""
