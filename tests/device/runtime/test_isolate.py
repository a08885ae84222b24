"""``load(isolate=True)`` (:mod:`edgesdk.runtime.isolate`) against a real crash, and what the isolated probe trusts.

``FakeCrashingNPUEngine`` is a pretend NPU (hardware this machine lacks) whose driver aborts while loading, as a
vendor delegate that meets a hostile file might: the signal is real. The damaged-file corpus is in
test_damaged_models.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.runtime import isolate
from edgesdk.bundle.reader import Bundle
from edgesdk.engines import Device, Discovery, Engine, open_engine, register_backend, unregister_backend
from edgesdk.errors import BackendUnavailable, BundleError


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(edgesdk.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


# -- isolate=True against a real crash ------------------------------------------------------------------------

FAKE_NPU = "fake-crashing-npu"


class FakeCrashingNPUEngine(Engine):
    """A pretend NPU backend (hardware this machine lacks) whose driver aborts the process on every load.

    ``os.abort()`` raises a real SIGABRT, as a native crash in a vendor delegate would; nothing in Python
    can catch it. It takes the bundle's ONNX artifacts.
    """

    name = FAKE_NPU
    suffixes = (".onnx",)
    formats = ("onnxruntime",)
    version = "0.0-fake"

    @classmethod
    def discover(cls) -> Discovery:
        return Discovery(FAKE_NPU, cls.version, [Device(FAKE_NPU, "NPU", "NPU", "Fake crashing NPU (tests only)",
                                                        ("int8", "fp32"))], [])

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        os.abort()

    def run_prepared(self, feeds):  # pragma: no cover - never reached
        raise AssertionError("unreachable")


class FakeHangingNPUEngine(FakeCrashingNPUEngine):
    """A pretend NPU whose compile never returns (a hung driver)."""

    def __init__(self, model_path, **options):
        Engine.__init__(self, model_path, **options)
        time.sleep(600)


@pytest.fixture
def crashing_npu():
    register_backend(FAKE_NPU, FakeCrashingNPUEngine)
    yield FAKE_NPU
    unregister_backend(FAKE_NPU)


def test_fake_crashing_npu_really_kills_a_process_without_isolate(crashing_npu, digits_bundle):
    """What isolate protects against: the same load in a process of its own dies by SIGABRT."""
    code = ("import sys, edgesdk; from edgesdk.engines import register_backend; "
            f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]; "
            "from test_isolate import FakeCrashingNPUEngine, FAKE_NPU; "
            "register_backend(FAKE_NPU, FakeCrashingNPUEngine); "
            f"edgesdk.load({str(digits_bundle.bundle)!r}, engine=FAKE_NPU)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_child_env())
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-1000:])


def test_isolate_skips_a_crashing_candidate_and_loads_the_next(crashing_npu, digits_bundle):
    model = edgesdk.load(digits_bundle.bundle, isolate=True)
    with model:
        crashed = [s for s in model.placement.skipped if s.candidate.engine == FAKE_NPU]
        assert model.placement.engine != FAKE_NPU and model.placement.numerics["checked"]
        assert crashed and all(s.reason == "isolated_probe_failed" for s in crashed), model.placement.skipped
        assert "killed by SIGABRT" in crashed[0].detail and "Fatal Python error: Aborted" in crashed[0].detail


def test_isolate_raises_bundle_error_when_only_crashing_candidates_remain(crashing_npu, digits_bundle):
    with pytest.raises(BundleError, match=r"onnxruntime-(int8|fp32) failed its isolated probe.*killed by SIGABRT"
                                          r".*stderr: .*Aborted"):
        edgesdk.load(digits_bundle.bundle, require=FAKE_NPU, isolate=True)


def test_isolated_probe_times_out(digits_bundle):
    register_backend(FAKE_NPU, FakeHangingNPUEngine)
    try:
        with pytest.raises(BackendUnavailable, match=r"isolated_probe_failed: .* did not finish in 2 s"):
            isolate.probe(Bundle.open(digits_bundle.bundle), "onnxruntime-fp32", FAKE_NPU, {"device": "NPU"},
                          timeout=2.0)
    finally:
        unregister_backend(FAKE_NPU)


def test_isolate_refuses_a_backend_the_child_cannot_import(digits_bundle):
    class LocalEngine(FakeCrashingNPUEngine):
        pass

    register_backend(FAKE_NPU, LocalEngine)
    try:
        with pytest.raises(BackendUnavailable, match=r"cannot import backend .*LocalEngine"):
            isolate.probe(Bundle.open(digits_bundle.bundle), "onnxruntime-fp32", FAKE_NPU, {"device": "NPU"})
    finally:
        unregister_backend(FAKE_NPU)


@pytest.mark.parametrize("engine", ["litert", "openvino", "onnxruntime"])
def test_isolate_loads_a_good_bundle_as_without_it(engine, digits_bundle):
    """Same placement and the same numbers; the load-time cost is printed (no timing assertion)."""
    golden = Bundle.open(digits_bundle.bundle).golden()["input_0"]
    times = {}
    outputs = {}
    for isolated in (False, True):
        start = time.perf_counter()
        with edgesdk.load(digits_bundle.bundle, engine=engine, device="CPU", isolate=isolated) as model:
            times[isolated] = (time.perf_counter() - start) * 1e3
            outputs[isolated] = (model.placement.artifact, [model.predict(x[None]).outputs[0] for x in golden])
    assert outputs[True][0] == outputs[False][0]
    np.testing.assert_array_equal(np.stack(outputs[True][1]), np.stack(outputs[False][1]))
    print(f"\n{engine}: load {times[False]:.0f} ms, with isolate=True {times[True]:.0f} ms "
          f"(+{times[True] - times[False]:.0f} ms)")


def test_in_prefer_device_mode_a_crashing_device_leaves_the_cloud_to_answer(crashing_npu, digits_bundle):
    """No device candidate survives its isolated probe: the hybrid model still loads, with no device and the
    BundleError as the reason, so its predictions go to the cloud (here an address where nothing listens)."""
    from cloud_server import free_port

    from edgesdk.errors import CloudError

    model = edgesdk.load(digits_bundle.bundle, require=FAKE_NPU, isolate=True, mode="prefer-device",
                         cloud=f"http://127.0.0.1:{free_port()}")
    with model:
        assert model.device is None and isinstance(model.device_error, BundleError)
        with pytest.raises((CloudError, BundleError)):
            model.predict(Bundle.open(digits_bundle.bundle).golden()["input_0"][:1])


# -- what the isolated probe trusts ---------------------------------------------------------------------------

class FakeSecondInputCrashNPUEngine(FakeCrashingNPUEngine):
    """A pretend NPU that runs golden input 0 (through onnxruntime on the CPU) and aborts on any later run,
    as a delegate might on one input only."""

    def __init__(self, model_path, **options):
        Engine.__init__(self, model_path, **options)
        self._cpu = open_engine("onnxruntime", model_path)
        self.inputs, self.outputs = self._cpu.inputs, self._cpu.outputs
        self._runs = 0

    def run_prepared(self, feeds):
        self._runs += 1
        if self._runs > 1:
            os.abort()
        return self._cpu.run_prepared(feeds)

    def close(self):
        self._cpu.close()
        super().close()


class FakeMarkerPrintingNPUEngine(FakeCrashingNPUEngine):
    """A pretend NPU whose driver prints what an old probe took for its success verdict, then fails the load."""

    def __init__(self, model_path, **options):
        Engine.__init__(self, model_path, **options)
        print('EDGESDK_ISOLATED_PROBE {"ok": true}', flush=True)
        raise BackendUnavailable("load_failed", "the real verdict: this driver cannot load the model")


class FakeEnvReportingNPUEngine(FakeCrashingNPUEngine):
    """A pretend NPU that reports, as its load error, what the probe's child can see."""

    def __init__(self, model_path, **options):
        Engine.__init__(self, model_path, **options)
        raise BackendUnavailable("load_failed", f"MY_API_TOKEN={os.environ.get('MY_API_TOKEN')} "
                                                f"MY_SETTING={os.environ.get('MY_SETTING')} "
                                                f"json={sys.modules['json'].__file__}")


def _probe_with(backend, bundle_dir: Path, **kw):
    register_backend(FAKE_NPU, backend)
    try:
        return isolate.probe(Bundle.open(bundle_dir), "onnxruntime-fp32", FAKE_NPU, {"device": "NPU"}, **kw)
    finally:
        unregister_backend(FAKE_NPU)


def test_isolated_probe_runs_every_golden_input(digits_bundle):
    """The numerics check runs every golden input in this process: a crash on input 1 must happen in the child."""
    assert len(Bundle.open(digits_bundle.bundle).golden()["input_0"]) > 1
    with pytest.raises(BackendUnavailable, match=r"isolated_probe_failed: .*killed by SIGABRT"):
        _probe_with(FakeSecondInputCrashNPUEngine, digits_bundle.bundle)


def test_isolated_probe_ignores_a_verdict_printed_on_stdout(digits_bundle):
    with pytest.raises(BackendUnavailable, match=r"load_failed: .*isolated probe.*the real verdict"):
        _probe_with(FakeMarkerPrintingNPUEngine, digits_bundle.bundle)


def test_isolated_probe_does_not_import_from_the_working_directory(digits_bundle, tmp_path, monkeypatch):
    (tmp_path / "json.py").write_text("import os\nos._exit(42)\n")
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) not in sys.path
    assert isolate.probe(Bundle.open(digits_bundle.bundle), "onnxruntime-fp32", "onnxruntime", {"device": "CPU"}) > 0
    with pytest.raises(BackendUnavailable, match=r"load_failed: .*json=(?!.*" + re.escape(str(tmp_path)) + ")"):
        _probe_with(FakeEnvReportingNPUEngine, digits_bundle.bundle)


def test_isolated_probe_child_does_not_see_secret_looking_variables(digits_bundle, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", "s3cret")
    monkeypatch.setenv("MY_SETTING", "kept")
    with pytest.raises(BackendUnavailable, match=r"load_failed: .*MY_API_TOKEN=None MY_SETTING=kept"):
        _probe_with(FakeEnvReportingNPUEngine, digits_bundle.bundle)
