# Two commands for a newcomer on a fresh machine:
#   make demo   set up (once) and run the main job
#   make test   set up (once) and run the test suite against redis-server and valkey-server
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup demo test test-slow clean

$(STAMP): pyproject.toml
	bash scripts/setup.sh $(VENV) $(PYTHON)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m rollout_queue demo

test: $(STAMP)
	ROLLOUT_TEST_SERVERS=$${ROLLOUT_TEST_SERVERS:-redis,valkey} $(PY) -m pytest -q

test-slow: $(STAMP)
	ROLLOUT_TEST_SERVERS=$${ROLLOUT_TEST_SERVERS:-redis,valkey} $(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
