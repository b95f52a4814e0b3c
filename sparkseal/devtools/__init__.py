"""Tools for working on the repository (generated tables and pages): never shipped, never run by a build."""
