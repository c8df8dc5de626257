# trainbox: `make demo` (build the cpu image and train in it), `make test` (everything, real Docker included).
SHELL := /bin/bash
PYTHON ?= python3
# This checkout's package, whichever checkout an editable install points at (several clones or worktrees).
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))
TRAINBOX ?= $(PYTHON) -m trainbox.cli
# `trainbox image build` takes pip's own find-links directory as its wheelhouse by itself; the Makefile still names
# it for the commands that compare against a plain pip run (bench-build's limit runs pip without pip.conf) and for
# the smoke's report. It is pip's first find-links entry when it holds a CPU torch wheel (how that wheel reaches
# image builds on machines that cannot reach PyTorch's index); WHEELHOUSE=DIR overrides.
PIP_LINKS_DIR := $(patsubst file://%,%,$(firstword $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)))
WHEELHOUSE ?= $(if $(PIP_LINKS_DIR),$(if $(wildcard $(PIP_LINKS_DIR)/torch-*+cpu-*.whl),$(PIP_LINKS_DIR)))
WHEELHOUSE_ARG = $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE),)
# Tests start thousands of Python processes: each one reuses the bytecode the others wrote (a machine that sets
# PYTHONDONTWRITEBYTECODE would recompile every module, and pytest's assertion rewrite, each time: 15% of the CPU).
PYTEST ?= env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest

.PHONY: slurm-up slurm-down registry
.PHONY: help docs install ensure-installed engine render render-check lint test test-fast test-loaded hog smoke image-cpu image-npu image-cuda demo bench bench-build bench-import

help:
	@echo "make demo        build the cpu image, run the doctor and the cpu-ddp training job in it"
	@echo "make test        all tests (starts a Docker engine when none answers)"
	@echo "make test-fast   the inner loop: no Docker, no network, no slow tests"
	@echo "make test-loaded the docker and slow tests with every core kept busy by a CPU hog (LOADED_MARKS= for all)"
	@echo "make render      re-render Dockerfile.npu, Dockerfile.cuda and build/generated/"
	@echo "make docs        regenerate docs/reference/commands.md from the parser"
	@echo "make lint        render --check, strict validation, hadolint, shellcheck, launcher checks"
	@echo "make smoke       trainbox smoke over ci/smoke-offline.yaml: cpu, then npu-910b and the workload stacks on their substitute base"
	@echo "make image-cpu|image-npu|image-cuda, make bench"

# The host tests run real multi-process torch: TORCH_SPEC is the CPU build (pip's configured wheel directory holds
# it on these machines; elsewhere add PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
TORCH_SPEC ?= torch==2.13.0
install:
	$(PYTHON) -m pip install -q -e '.[build,dev]' '$(TORCH_SPEC)' -c ci/constraints.txt

# install on first use, so that a fresh clone needs only `make demo` / `make test` (the modules are found, not
# imported: importing torch alone took 3 of the inner loop's seconds)
ensure-installed:
	@$(PYTHON) -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
	  trainbox jinja2 pydantic yaml rich docker pytest xdist torch jsonschema kubernetes_validate cyclonedx \
	  || $(MAKE) install

engine:
	bash ci/ensure-docker.sh

render:
	$(TRAINBOX) render

render-check:
	$(TRAINBOX) render --check

# the command reference table, generated from the parser (tests/test_cli.py checks it)
DOCS_COMMANDS = docs/reference/commands.md
docs:
	$(PYTHON) -m trainbox.cli_reference $(DOCS_COMMANDS)

lint: render-check
	$(PYTHON) -m trainbox.cli_reference --check $(DOCS_COMMANDS)
	$(TRAINBOX) stack validate --strict
	hadolint Dockerfile.npu Dockerfile.cuda build/generated/*/Dockerfile
	shellcheck .ci/run ci/*.sh ci/slurm/*.sh
	$(TRAINBOX) launch check --target slurm --target slurm-pyxis --target ascendjob --target volcano --target pytorchjob --target rayjob

# One pytest-xdist run on TEST_JOBS workers: the docker tests that share the cpu image in one serial queue, the
# modules with images of their own and the slow ones each in a queue of its own, the longest queues handed out
# first (tests/conftest.py says which), everything else spread over the workers as they free up. The engine's
# builds and containers, the registry and PyPI leave the cores idle much of the time; more workers than cores
# fill it.
TEST_JOBS ?= 4
FAST_MARKS = not docker and not network and not slow
test: engine ensure-installed
	$(PYTEST) -q -ra -n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder --durations=25

# No test's verdict may depend on how fast the machine is (tests/hangguard.py): the docker and slow tests run
# here with every core kept busy by a CPU hog (tests/cpuhog.py: one busy process per core, bounded by HOG_S and
# killed when pytest ends). LOADED_MARKS= runs the whole suite loaded; LOADED_TESTS names files or node ids.
# `make hog` is the hog alone, to load a machine while something else runs.
HOG_S ?= 14400
LOADED_MARKS ?= docker or slow
LOADED_TESTS ?=
test-loaded: engine ensure-installed
	$(PYTHON) tests/cpuhog.py --seconds $(HOG_S) -- $(PYTEST) -q -ra -n $(TEST_JOBS) --dist loadgroup \
	  --no-loadscope-reorder --durations=25 $(if $(LOADED_MARKS),-m "$(LOADED_MARKS)") $(LOADED_TESTS)

hog:
	$(PYTHON) tests/cpuhog.py --seconds $(HOG_S)

# The Slurm tests start the two-node test cluster themselves (and stop it afterwards); these keep one up.
slurm-up:
	bash ci/slurm/up.sh

slurm-down:
	bash ci/slurm/down.sh

# A registry on 127.0.0.1 (Debian's docker-registry) for `trainbox image push`, until Ctrl-C; the push tests
# start their own.
registry:
	$(PYTHON) tests/registry_helpers.py

# The inner loop: what needs no engine, no PyPI and no multi-second torch jobs (`make test` runs those), on
# every core (pytest-xdist): these tests share no fixed port, image or cache directory.
TEST_FAST_JOBS ?= auto
test-fast: ensure-installed
	$(PYTEST) -q -ra -n $(TEST_FAST_JOBS) --dist loadgroup -m "$(FAST_MARKS)"

# The workload stacks' git components come from the seeds' upstream trees: beside a checkout that has
# ../shared/upstream (CI), smoke reaches them through writable mirrors (ci/upstream-mirrors.sh); elsewhere
# through the user's own git configuration.
UPSTREAM ?= ../shared/upstream
SMOKE_GIT = $(if $(wildcard $(UPSTREAM)/README.md),GIT_CONFIG_GLOBAL="$$(bash ci/upstream-mirrors.sh $(UPSTREAM))")

smoke: ensure-installed engine
	$(SMOKE_GIT) $(TRAINBOX) smoke --profile ci/smoke-offline.yaml $(WHEELHOUSE_ARG) --junit build/reports/smoke/junit.xml

image-cpu: engine ensure-installed
	$(TRAINBOX) image build cpu $(WHEELHOUSE_ARG)

# The NPU and CUDA pins are not the machine's local wheels: pass a wheelhouse or a mirror explicitly, e.g.
# make image-npu IMAGE_ARGS="--base mirror/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11 --wheelhouse DIR"
IMAGE_ARGS ?=
image-npu: engine ensure-installed
	$(TRAINBOX) image build npu-910b $(IMAGE_ARGS)

image-cuda: engine ensure-installed
	$(TRAINBOX) image build cuda $(IMAGE_ARGS)

demo: image-cpu
	docker run --rm --network none --shm-size 8g trainbox/cpu:latest trainbox doctor
	$(TRAINBOX) run cpu-ddp --image trainbox/cpu:latest

bench: bench-import bench-build

bench-import:
	$(PYTHON) bench/import_time.py

bench-build: engine
	$(SMOKE_GIT) $(PYTHON) bench/build.py --prune-cache $(WHEELHOUSE_ARG)
