# Set-up and the main jobs. `make test` and `make bench` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test bench bench-full bench-memory clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/gradwise bench step --size 25m

bench-full: $(STAMP)
	$(BIN)/gradwise bench step --size 124m

# state bytes per parameter (124M, allocated), loss per state format, and the 8-bit references
# (torchao and bitsandbytes, installed without their dependencies so torch stays 2.13.0)
bench-memory: $(STAMP)
	$(BIN)/pip install -q --no-deps torchao==0.18.0 bitsandbytes==0.50.2
	$(BIN)/python bench/memory.py --measure --references

clean:
	rm -rf $(VENV) .pytest_cache
