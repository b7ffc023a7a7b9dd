# Every target installs what it needs into .venv/ first, so a fresh clone needs only python3.11.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test bench clean

$(STAMP): pyproject.toml
	python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/recall up

test: install
	$(VENV)/bin/pytest -q

bench: install
	$(PY) -m bench.engine_bench

clean:
	rm -rf $(VENV) .pytest_cache
