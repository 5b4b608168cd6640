# `make run`: a local three-node cluster in the foreground (Ctrl-C stops it).
# `make test`: the whole test suite.
# `make image`: the node's Docker image (deploy/build-image.sh says which base it used).
# All create .venv on first use and install the project into it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test proto check-proto bench image clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dledger cluster up --nodes 3 --data-dir ./data --base-port 20911

test: $(STAMP) check-proto
	$(PY) -m pytest -q -rs

# Regenerate rpcgen/ from proto/. The generated files are committed.
proto: $(STAMP)
	$(PY) -m tools.genproto rpcgen

# Fails when rpcgen/ differs from what proto/ generates.
check-proto: $(STAMP)
	$(PY) -m tools.genproto --check rpcgen

bench: $(STAMP)
	$(PY) -m bench.append

# The official python:3.11-slim base when present or pullable, else a local
# one built from Debian packages; the build itself runs without network.
image: $(STAMP)
	PYTHON=$(PY) deploy/build-image.sh

clean:
	rm -rf $(VENV) data
