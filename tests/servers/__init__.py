"""Loopback servers the tests and benchmarks start: index, nginx cache, registry, BuildGrid, fake OpenAI."""
