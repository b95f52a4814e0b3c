"""The tests: shared helpers and conftest here, the tests by kind below (docs/layout.md)."""
