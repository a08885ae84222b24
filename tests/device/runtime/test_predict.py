"""Model.predict / predict_batch: every input form, the result, bad requests, and use from many threads."""

from __future__ import annotations

import json
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import edgesdk
from edgesdk import InputError
from edgesdk.engines import ENGINE_NAMES
from support import digits_pixels_to_input

LABELS = [str(i) for i in range(10)]


@pytest.fixture(scope="module", params=ENGINE_NAMES)
def model(request, digits_bundle):
    """The digits bundle on each engine's CPU (its int8 artifact), shared by the tests of this module."""
    with edgesdk.load(digits_bundle.bundle, engine=request.param, policy="cpu-only") as m:
        yield m


@pytest.fixture(scope="module")
def image(digits_images) -> Path:
    return sorted((digits_images / "val" / "3").glob("*.png"))[0]


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height gray pixels, with almost no data behind it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


# -- input forms -------------------------------------------------------------------------------------------

def test_every_input_form_gives_the_same_outputs(model, image):
    pixels = np.asarray(Image.open(image))
    assert pixels.dtype == np.uint8 and pixels.shape == (8, 8)
    x = model.bundle.preprocess(image)
    np.testing.assert_allclose(x, digits_pixels_to_input(pixels[None]), atol=1e-6)  # the manifest's preprocessing
    forms = {"path": image, "str": str(image), "pil": Image.open(image), "rgb pil": Image.open(image).convert("RGB"),
             "uint8": pixels, "uint8 hwc": pixels[:, :, None], "float": x, "float no batch": x[0],
             "float64": x.astype(np.float64)}
    results = {name: model.predict(value) for name, value in forms.items()}
    ref = results["path"]
    for name, r in results.items():
        assert len(r.outputs) == 1 and r.outputs[0].shape == (1, 10), name
        assert np.array_equal(r.outputs[0], ref.outputs[0]), name
        assert r.top == ref.top, name


def test_result(model, image):
    r = model.predict(image)
    assert r.source == "device"
    assert r.placement is model.placement
    assert model.labels == LABELS
    scores = np.asarray(r.outputs[0], dtype=np.float64).reshape(-1)
    softmax = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    assert len(r.top) == 5
    assert r.top[0].index == int(scores.argmax()) and r.top[0].label == LABELS[r.top[0].index]
    assert [t.label for t in r.top] == [LABELS[t.index] for t in r.top]
    assert [t.score for t in r.top] == sorted((t.score for t in r.top), reverse=True)
    np.testing.assert_allclose([t.score for t in r.top], softmax[[t.index for t in r.top]], rtol=1e-6)
    assert softmax.sum() == pytest.approx(1.0) and 0 < sum(t.score for t in r.top) <= 1 + 1e-9
    assert set(r.timings_ms) == {"preprocess", "inference", "postprocess"}
    assert all(v >= 0 for v in r.timings_ms.values())
    data = json.loads(json.dumps(r.to_dict()))
    assert data["source"] == "device" and data["top"][0]["label"] == r.top[0].label


def test_a_result_carries_values_not_the_models_state(model, image):
    """Result.placement and Result.budget are read-only values (shared by the model's results, never copied per
    prediction): changing one result changes neither its model nor the next result."""
    from dataclasses import FrozenInstanceError

    from edgesdk.frozen import thaw

    first = model.predict(image)
    placement, budget = model.placement.to_dict(), thaw(model.budget)
    assert first.placement.to_dict() == placement and first.budget == budget and budget["memory"]["model_mb"] > 0
    with pytest.raises(FrozenInstanceError):
        first.placement.engine = "elsewhere"
    refused = {"skipped": lambda: first.placement.skipped.append(None),
               "executing": lambda: first.placement.executing.clear(),
               "numerics": lambda: first.placement.numerics.update(checked=False),
               "budget": lambda: first.budget.__setitem__("action", "mine"),
               "budget memory": lambda: first.budget["memory"].pop("limit_mb")}
    for name, change in refused.items():
        with pytest.raises(TypeError, match="read-only"):
            change()
    mine = thaw(first.budget)  # a mutable copy is the caller's own
    mine["memory"]["limit_mb"] = 0.0
    first.budget = {"replaced": True}  # and so are a result's fields
    after = model.predict(image)
    assert model.placement.to_dict() == placement and model.budget == budget
    assert after.placement.to_dict() == placement and after.budget == budget
    # still a dict and a list for every reader
    assert isinstance(after.budget, dict) and isinstance(after.placement.skipped, list)
    assert json.loads(json.dumps(after.budget)) == budget == json.loads(json.dumps(after.to_dict()))["budget"]


def test_run_prepared_runs_the_tensors_io_feeds_prepared(model, image):
    """The public way to run inputs prepared elsewhere (HybridModel, calibrate-escalation): as predict runs them."""
    r = model.run_prepared(model.io.feeds(image))
    assert np.array_equal(r.outputs[0], model.predict(image).outputs[0])
    assert r.placement is model.placement and r.top[0].label == model.predict(image).top[0].label
    assert r.timings_ms["preprocess"] == 0.0  # no start given: preparing was not timed here
    started = time.perf_counter()
    timed = model.run_prepared(model.io.feeds(image), started)
    assert timed.timings_ms["preprocess"] > 0.0


def test_the_digit_is_recognized(model, digits_images):
    """First val image of each digit: the int8 model names nearly all of them."""
    files = [sorted((digits_images / "val" / d).glob("*.png"))[0] for d in LABELS]
    hits = sum(model.predict(f).top[0].label == f.parent.name for f in files)
    assert hits >= 9


def test_predict_batch(model, digits_images):
    files = sorted((digits_images / "val" / "7").glob("*.png"))[:3]
    xs = [files[0], Image.open(files[1]), np.asarray(Image.open(files[2]))]
    batch = model.predict_batch(xs)
    assert len(batch) == 3 and all(isinstance(r, edgesdk.Result) for r in batch)
    for x, r in zip(xs, batch):
        assert np.array_equal(r.outputs[0], model.predict(x).outputs[0])
    assert model.predict_batch([]) == []


# -- bad requests ------------------------------------------------------------------------------------------

def _bad_inputs(tmp: Path) -> dict:
    (tmp / "text.png").write_text("not an image")
    (tmp / "huge.png").write_bytes(_png_header(9_000, 9_000))
    return {
        "wrong shape": (np.zeros((1, 1, 9, 9), np.float32),
                        r"input 'x' must have shape \[1, 1, 8, 8\] .*got \[1, 1, 9, 9\]"),
        "wrong rank": (np.zeros((1, 1, 1, 8, 8), np.float32), r"must have shape .*got \[1, 1, 1, 8, 8\]"),
        "complex": (np.zeros((1, 1, 8, 8), np.complex64), r"input 'x' must be numeric, got dtype complex64"),
        "object": (np.zeros((1, 1, 8, 8), object), r"must be numeric, got dtype object"),
        "complex image": (np.zeros((8, 8), np.complex64), r"input 'x' must be numeric, got dtype complex64"),
        "bool image": (np.zeros((8, 8), bool), r"input 'x' must be numeric, got dtype bool"),
        "ragged list": ([[1.0, 2.0], [3.0]], r"input 'x' is not an array"),
        "empty image": (np.zeros((0, 0), np.uint8), r"image is 0x0 pixels: empty"),
        "None": (None, r"must be numeric, got dtype object"),
        "NaN": (np.full((1, 1, 8, 8), np.nan, np.float32), r"input 'x' holds NaN or Inf"),
        "one inf": (np.where(np.eye(8) > 0, np.inf, 0.0)[None, None].astype(np.float32), r"holds NaN or Inf"),
        "-inf no batch": (np.full((1, 8, 8), -np.inf), r"holds NaN or Inf"),
        "unreadable file": (tmp / "text.png", r"text.png is not a readable image"),
        "missing file": (tmp / "nowhere.png", r"image not found: .*nowhere.png"),
        "huge png header": (tmp / "huge.png", r"image is 9000x9000 pixels; more than 50000000 is refused"),
        "huge array": (np.zeros((10_000, 10_000), np.uint8), r"image is 10000x10000 pixels"),
        "huge pil": (Image.new("L", (10_000, 10_000)), r"image is 10000x10000 pixels"),
        "huge float": (np.zeros((10_001, 10_000), np.float32), r"input 'x' has 100010000 elements"),
        "unknown type": (object(), r"must be numeric"),
    }


def test_bad_requests_raise_input_error_and_leave_the_model_working(model, image, tmp_path):
    good = model.predict(image)
    for name, (value, message) in _bad_inputs(tmp_path).items():
        with pytest.raises(InputError, match=message):
            model.predict(value)
        after = model.predict(image)  # a bad request never kills the model
        assert np.array_equal(after.outputs[0], good.outputs[0]), name


def test_bad_request_in_a_batch(model, image):
    with pytest.raises(InputError, match="holds NaN"):
        model.predict_batch([image, np.full((1, 8, 8), np.nan, np.float32)])
    assert len(model.predict_batch([image])) == 1


def test_png_header_beyond_pil_limit_is_an_input_error(digits_bundle, tmp_path):
    (tmp_path / "bomb.png").write_bytes(_png_header(100_000, 100_000))
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", policy="cpu-only") as m:
        with pytest.raises(InputError, match=r"bomb.png: image is too large to decode safely"):
            m.predict(tmp_path / "bomb.png")


def test_closed_model(digits_bundle, image):
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", policy="cpu-only") as m:
        assert m.predict(image).source == "device"
    with pytest.raises(InputError, match="model 'digits' was closed"):
        m.predict(image)
    m.close()  # twice is fine


# -- threads -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_threads_give_exactly_the_sequential_outputs(digits_bundle, engine):
    threads, per_thread = 8, 200
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((threads, per_thread, 1, 1, 8, 8)).astype(np.float32)
    with edgesdk.load(digits_bundle.bundle, engine=engine, artifact=f"{engine}-int8", policy="cpu-only") as m:
        sequential = [[m.predict(x).outputs[0] for x in row] for row in inputs]
        got: list[list | None] = [None] * threads
        errors: list[BaseException] = []
        start = threading.Barrier(threads)

        def work(i: int) -> None:
            try:
                start.wait()
                got[i] = [m.predict(x).outputs[0] for x in inputs[i]]
            except BaseException as exc:  # surfaced below: a thread's failure must fail the test
                errors.append(exc)

        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert errors == []
    for i in range(threads):
        assert len(got[i]) == per_thread
        assert all(np.array_equal(a, b) for a, b in zip(got[i], sequential[i])), (engine, i)
    # the random inputs are not all classified alike: the comparison is not vacuous
    assert len({int(o.argmax()) for row in sequential for o in row}) > 1
