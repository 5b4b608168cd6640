# `make run`: a local three-node cluster in the foreground (Ctrl-C stops it).
# `make test`: the whole test suite.
# `make image`: the node's Docker image (deploy/build-image.sh says which base it used);
# `make image-spark`: the Spark image on top of it (docker-compose.yml's `spark` profile).
# All create .venv on first use and install the project into it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test proto check-proto bench image image-spark clean browser-deps

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dledger cluster up --nodes 3 --data-dir ./data --base-port 20911

test: $(STAMP) check-proto browser-deps
	$(PY) -m pytest -q -rs -n 2

# The web console's browser test drives Debian's chromium and chromium-driver
# (a browser download at run time cannot work here). Installed where this runs
# as root with apt-get; elsewhere, or with PYDLEDGER_BROWSER_TESTS=0, the test
# is skipped and says why. Never fails the build.
browser-deps:
	@if [ "$${PYDLEDGER_BROWSER_TESTS:-1}" = 0 ]; then exit 0; fi; \
	if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver for the console's browser test"; \
	  (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1)) || \
	  echo "browser-deps: could not install chromium; the console's browser test will be skipped"; \
	else echo "browser-deps: not root or no apt-get; the console's browser test will be skipped"; fi

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

# The Spark image (master, workers, replay driver of the compose file's
# `spark` profile): the node image plus PySpark and a Java runtime.
image-spark: image
	PYTHON=$(PY) deploy/build-spark-image.sh

clean:
	rm -rf $(VENV) data
