# The two commands of the README: `make image` builds, `make test` runs every test. Both set up first:
# `make image` only what building needs (.ci/setup-build), `make test` everything the tests need (.ci/setup).
SHELL := /bin/bash
VENV ?= $(HOME)/.cache/sparkseal/venv
PYTEST_ARGS ?=

.PHONY: setup setup-build image wheel test lint gpu-test

setup:
	@.ci/setup

setup-build:
	@.ci/setup-build

# The main job: the OCI image for GB10 (linux/arm64); `bazel run //:image.load` loads it.
image: setup-build
	bazel build //:image

wheel: setup-build
	bazel build //third_party/vllm:wheel_linux_aarch64 //third_party/vllm:wheel_linux_x86_64

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup
	$(VENV)/bin/python -m pytest -m "not gpu" $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU.
gpu-test: setup
	$(VENV)/bin/python -m pytest -m gpu $(PYTEST_ARGS)
