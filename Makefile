# Set-up and the main jobs. `make test` and `make bench` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test bench bench-full bench-memory arena clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,arena]"
	# references whose own requirements are loose or heavy: their real needs (numpy, matplotlib) are in .[test]
	$(BIN)/pip install -q --no-deps ranger21==0.1.0 pytorch-optimizer==4.1.0
	# GaLore and APOLLO references: their requirements (transformers, bitsandbytes) would pull a GPU stack;
	# transformers and huggingface_hub only need to import, their import needs are in .[test]
	$(BIN)/pip install -q --no-deps galore-torch==1.0 apollo-torch==1.0.3 transformers==5.24.0 huggingface_hub==2.4.0 bitsandbytes==0.50.2
	touch $(STAMP)

# the suite in parallel (pytest-xdist): TEST_WORKERS processes, one torch thread each (tests/conftest.py); the 25
# slowest tests listed at the end, to keep the whole within its budget (15 minutes on an idle 2-core machine)
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

bench: $(STAMP)
	$(BIN)/gradwise bench step --size 25m

bench-full: $(STAMP)
	$(BIN)/gradwise bench step --size 124m

# The arena's quick suite (3 workloads x 4 optimizers, self-tuning, 3 studies): leaderboard and report path.
arena: $(STAMP)
	$(BIN)/gradwise arena run --suite quick --storage arena-results/quick.db --out arena-results/report

# state bytes per parameter (124M, allocated), loss per state format, and the 8-bit references
# (torchao and bitsandbytes, installed without their dependencies so torch stays 2.13.0)
bench-memory: $(STAMP)
	$(BIN)/pip install -q --no-deps torchao==0.18.0 bitsandbytes==0.50.2
	$(BIN)/python bench/memory.py --bytes --measure --quality --references

clean:
	rm -rf $(VENV) .pytest_cache
