"""Installed trees: wheels into a venv, locked .debs into a root, byte-compiled in fresh interpreters."""
