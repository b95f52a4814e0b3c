"""The pure library every other part of sparkseal builds on; it imports nothing else of ours."""
