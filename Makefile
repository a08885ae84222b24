# The two commands: `make demo` (set up, then quantize the digits sample) and `make test`.
# Everything installs into .venv (and the cloud server into .venv-cloud); nothing is needed beforehand but python3 (>= 3.10).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
EXTRAS ?= convert,litert,openvino,onnxruntime,dev
# The cloud side (`edgesdk serve`, KServe) has its own venv: kserve pins protobuf < 7, which the converters need.
CLOUD_VENV ?= .venv-cloud
CLOUD_EXTRAS ?= cloud,cloud-dev,onnxruntime

.PHONY: setup setup-cloud demo demo-hybrid test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

setup-cloud: $(CLOUD_VENV)/.installed

$(CLOUD_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CLOUD_VENV)
	$(CLOUD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CLOUD_VENV)/bin/python -m pip install --quiet -e ".[$(CLOUD_EXTRAS)]"
	touch $@

demo: setup
	$(VENV)/bin/edgesdk demo

# The cloud half of the demo: the device bundle's hard inputs go to a larger model served by `edgesdk serve`.
demo-hybrid: setup setup-cloud
	$(PY) samples/digits/hybrid.py --cloud-venv "$(abspath $(CLOUD_VENV))"

test: setup setup-cloud
	EDGESDK_CLOUD_VENV="$(abspath $(CLOUD_VENV))" $(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/quantize.py

clean:
	rm -rf build .pytest_cache
