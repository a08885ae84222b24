# The two commands: `make demo` (set up, then quantize the digits sample) and `make test`.
# Everything installs into .venv; nothing is needed beforehand but python3 (>= 3.10).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
EXTRAS ?= convert,litert,openvino,onnxruntime,dev

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	$(VENV)/bin/edgesdk demo

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/quantize.py

clean:
	rm -rf build .pytest_cache
