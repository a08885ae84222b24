# The two commands: `make demo` (set up, then quantize the digits and shapes samples) and `make test`.
# Everything installs into .venv (and the cloud server into .venv-cloud); nothing is needed beforehand but python3 (>= 3.10).
# Three distributions, one per side: edgesdk (pyproject.toml, the device), edgesdk-converters (converters/, the
# workstation) and edgesdk-cloud (cloud/); each venv installs the device package and the sides it needs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# otel: the OpenTelemetry export of the monitor (tests/device/monitor/test_otel.py imports the SDK: never skipped).
EXTRAS ?= litert,openvino,onnxruntime,otel,dev
# The cloud side (`edgesdk serve`, KServe) has its own venv: kserve pins protobuf < 7, which the converters need.
CLOUD_VENV ?= .venv-cloud
CLOUD_EXTRAS ?= onnxruntime
# The device side alone, with bundle signatures (`trust`): model-signing 1.1 needs typing-extensions >= 4.14.1,
# which litert-torch's xdsl pin (< 4.13) keeps out of .venv. It also shows the runtime installs without the converters.
DEVICE_VENV ?= .venv-device
DEVICE_EXTRAS ?= onnxruntime,trust
# A second V2 server for the interop tests (tests/cloud/test_v2_interop.py): Seldon's MLServer, in a venv of its own
# (it pins what kserve's venv cannot share); the tests skip, saying so, without it.
MLSERVER_VENV ?= .venv-mlserver
MLSERVER ?= mlserver==1.7.1

.PHONY: setup setup-cloud setup-device setup-mlserver setup-isa demo demo-hybrid test bench conformance recovery fuzz clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml converters/pyproject.toml cloud/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" -e ./converters -e ./cloud
	touch $@

setup-cloud: $(CLOUD_VENV)/.installed

$(CLOUD_VENV)/.installed: pyproject.toml cloud/pyproject.toml
	$(PYTHON) -m venv $(CLOUD_VENV)
	$(CLOUD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CLOUD_VENV)/bin/python -m pip install --quiet -e ".[$(CLOUD_EXTRAS)]" -e "./cloud[serve,dev,otel]"
	touch $@

setup-device: $(DEVICE_VENV)/.installed

$(DEVICE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEVICE_VENV)/bin/python -m pip install --quiet -e ".[$(DEVICE_EXTRAS)]" "pytest>=8" "hypothesis>=6.170"
	touch $@

setup-mlserver: $(MLSERVER_VENV)/.installed

$(MLSERVER_VENV)/.installed:
	$(PYTHON) -m venv $(MLSERVER_VENV)
	$(MLSERVER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MLSERVER_VENV)/bin/python -m pip install --quiet "$(MLSERVER)" "onnxruntime>=1.18"
	touch $@

demo: setup
	$(VENV)/bin/edgesdk demo

# The cloud half of the demo: the device bundle's hard inputs go to a model served by `edgesdk serve`: the digits
# classifier's to a larger one, then the shapes detector's to its own float artifact.
demo-hybrid: setup setup-cloud
	$(PY) samples/digits/hybrid.py --cloud-venv "$(abspath $(CLOUD_VENV))"
	$(PY) samples/shapes/hybrid.py --cloud-venv "$(abspath $(CLOUD_VENV))"

# The INT8 tests also run each engine as on the lowest x86 class (AVX2, no AVX-512, no VNNI): ONNX Runtime and
# XNNPACK under qemu user-mode emulation (tests/isa.py), OpenVINO with ONEDNN_MAX_CPU_ISA. On an x86-64 Debian/Ubuntu
# machine where we are root, qemu-user is installed here; elsewhere those tests skip and say why.
setup-isa:
	@if [ "$$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null && command -v apt-get >/dev/null \
	    && [ "$$(id -u)" = 0 ]; then \
	  echo "installing qemu-user (lowest-x86 INT8 tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null) \
	    || echo "warning: qemu-user could not be installed; the emulated-CPU tests will skip"; \
	fi

# Two runs: everything in .venv, then the signature tests (marked `trust`) in the device venv.
test: setup setup-cloud setup-device setup-mlserver setup-isa
	EDGESDK_CLOUD_VENV="$(abspath $(CLOUD_VENV))" EDGESDK_DEVICE_VENV="$(abspath $(DEVICE_VENV))" \
	  EDGESDK_MLSERVER_VENV="$(abspath $(MLSERVER_VENV))" $(PY) -m pytest -q -m "not trust"
	$(DEVICE_VENV)/bin/python -m pytest -q -m trust tests/device/trust

bench: setup
	$(PY) benchmarks/quantize.py

# The conformance zoo (tests/zoo.py: real models from pip wheels) at full size through every default route: a table
# of what built, INT8 against float and p50 int8/fp32 (~15 min; make test runs the same zoo at a reduced size).
conformance: setup
	$(PY) benchmarks/conformance.py

# Accuracy recovery (quantize --recover), measured: nothing changes on the digits sample and the MobileNetV2-shaped
# model (recover off vs on, files and p50 side by side), and the PP-OCRv4 recognizer recovered per engine (~25 min).
recovery: setup
	$(PY) benchmarks/recovery.py

FUZZ_RUNS ?= 10000
# libFuzzer (atheris) on the bundle readers: manifest parser, .edgebundle reader, ONNX external-data scan. Any
# exception other than an EdgeSDKError is a crash (the input is saved as crash-*).
fuzz: setup
	$(PY) -m pip install --quiet -e ".[fuzz]"
	for t in manifest archive onnx; do $(PY) tests/fuzz/fuzz_bundle.py $$t -atheris_runs=$(FUZZ_RUNS) || exit 1; done

clean:
	rm -rf build .pytest_cache
