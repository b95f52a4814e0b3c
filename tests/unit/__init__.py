"""Unit tests: programs and modules on the CPU, small local tools, loopback servers (docs/layout.md)."""
