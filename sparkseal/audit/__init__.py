"""Audits of what sparkseal builds and runs: secret scan, NCCL collective comparison."""
