# Every target installs what it needs into .venv/ first, so a fresh clone needs only python3.11.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install tools run test bench clean

$(STAMP): pyproject.toml
	python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/recall up

# promtool and prometheus (Debian package) check deploy/prometheus and the dashboard's PromQL;
# installed here where this user may, else those tests skip and say why.
tools:
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
	  || echo "prometheus/promtool could not be installed: their tests will be skipped"; }

test: install tools
	$(VENV)/bin/pytest -q

# Every benchmark; each rewrites its own section of docs/benchmarks.md (~30 min on 2 cores).
bench: install
	$(PY) -m bench.engine_bench
	$(PY) -m bench.ingest_bench
	$(PY) -m bench.recall_service_bench
	$(PY) -m bench.recall_cpu_bench
	$(PY) -m bench.redaction_bench

clean:
	rm -rf $(VENV) .pytest_cache
