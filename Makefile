# The two commands of the README: `make image` builds, `make test` runs every test. Both set up first:
# `make image` only what building needs (.ci/setup-build), `make test` everything the tests need (.ci/setup).
SHELL := /bin/bash
VENV ?= $(HOME)/.cache/sparkseal/venv
PYTEST_ARGS ?=

.PHONY: setup setup-build tools image wheel test lint deps rules-doc gpu-test fresh-host-image fresh-host-test

setup:
	@.ci/setup

setup-build:
	@.ci/setup-build

# The `sparkseal` command for build hosts and auditors: ~/.cache/sparkseal/tools/bin/sparkseal.
tools:
	@.ci/setup-tools

# The main job: the OCI image for GB10 (linux/arm64); `bazel run //:image.load` loads it.
image: setup-build
	bazel build //:image

wheel: setup-build
	bazel build //third_party/vllm:wheel_linux_aarch64 //third_party/vllm:wheel_linux_x86_64

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Rewrite the Bazel dependency lists (ACTION_DEPS, CORE_DEPS, HELPER_SOURCES) from the imports; standard
# library only, so it needs no set-up. Run it after adding, moving or changing the imports of a module.
deps:
	python3 -m sparkseal.devtools.deps

# Rewrite docs/rules.md, the rule reference, from the doc strings of what rules/defs.bzl exports (standard
# library only). Run it after changing a rule, an attribute, a provider or their docs.
rules-doc:
	python3 -m sparkseal.devtools.rules_doc

test: setup
	$(VENV)/bin/python -m pytest -m "not gpu" $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU.
gpu-test: setup
	$(VENV)/bin/python -m pytest -m gpu $(PYTEST_ARGS)

# The README's two commands on a pristine Debian bookworm (debootstrap, public registries only), at COMMIT
# (default HEAD): long (bench/results/fresh_host.md), needs root and 20 / 45 GB of disk; not part of `make test`.
# EXPECT=sha256:... fails the image check when the fresh root builds another image digest.
COMMIT ?= HEAD
EXPECT ?=
fresh-host-image:
	.ci/fresh-host $(if $(EXPECT),--expect $(EXPECT)) $(COMMIT) image

fresh-host-test:
	.ci/fresh-host $(COMMIT) test
