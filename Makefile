# The two commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test bench notebooks clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

EXAMPLES := build/examples
PORT ?= 8080

serve: $(STAMP)
	$(BIN)/python -m mmserver examples $(EXAMPLES)
	$(BIN)/python -m mmserver serve --host 127.0.0.1 --port $(PORT) --model-root $(EXAMPLES) \
		--preload digits=$(EXAMPLES)/digits/model \
		--preload resnet18=$(EXAMPLES)/resnet18/model \
		--preload tabular=$(EXAMPLES)/tabular/model

test: $(STAMP)
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

notebooks: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir notebooks

bench: $(STAMP)
	$(BIN)/python bench/batching_efficiency.py

clean:
	rm -rf $(VENV) build *.egg-info
