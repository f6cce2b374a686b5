# The two commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test bench notebooks clean mutation

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

EXAMPLES := build/examples
PORT ?= 8080
GRPC_PORT ?= 8081

serve: $(STAMP)
	$(BIN)/python -m mmserver examples $(EXAMPLES)
	$(BIN)/python -m mmserver serve --host 127.0.0.1 --port $(PORT) --grpc-port $(GRPC_PORT) \
		--model-root $(EXAMPLES) \
		--preload digits=$(EXAMPLES)/digits/model \
		--preload resnet18=$(EXAMPLES)/resnet18/model \
		--preload tabular=$(EXAMPLES)/tabular/model \
		--preload minilm=$(EXAMPLES)/minilm/model

test: $(STAMP)
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

notebooks: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir notebooks

# Mutation testing of the core modules against their fast tests ([tool.mutmut] in pyproject.toml;
# README, "Mutation testing"). Not part of `make test` (README gives its run time). From scratch
# every time: mutmut's cached test map misses a function that is new since it was made. Then the
# score of each module.
MUTATION_WORKERS ?= 2
mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTATION_WORKERS)
	$(BIN)/python -c "$$MUTATION_SCORES"

define MUTATION_SCORES
import collections, json, pathlib
KILLED, TIMEOUT = {1, 3}, {36, 24, -24, 152, 255}  # mutmut's exit codes: failed test, timed out
counts = collections.defaultdict(collections.Counter)
for meta in sorted(pathlib.Path("mutants").rglob("*.py.meta")):
    module = str(meta.relative_to("mutants"))[:-len(".meta")]
    for code in json.loads(meta.read_text())["exit_code_by_key"].values():
        caught = code in KILLED | TIMEOUT
        outcome = "not run" if code is None else "killed" if caught else "survived"
        counts[module][outcome] += 1
print(f"{'module':34} {'mutants':>7} {'killed':>6} {'survived':>8} {'score':>6} {'not run':>7}")
for module, c in counts.items():
    total = c["killed"] + c["survived"]
    score = c["killed"] / total if total else 0
    print(f"{module:34} {total:7} {c['killed']:6} {c['survived']:8} {score:6.0%} "
          f"{c['not run']:7}")
endef
export MUTATION_SCORES

bench: $(STAMP)
	$(BIN)/python bench/batching_efficiency.py

clean:
	rm -rf $(VENV) build *.egg-info
