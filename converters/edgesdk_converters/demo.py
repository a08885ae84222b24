"""``edgesdk demo``: the samples of a checkout, quantized offline, each with its validation table.

- ``digits`` (samples/digits): a classifier, scikit-learn's 8x8 digits exported to image folders, quantized from
  ``digits.pt2`` to all three targets.
- ``shapes`` (samples/shapes): a detector that is not a classifier. Its data generator writes the images, the
  detector is quantized with its task (``task.toml``: YOLO rows, NMS) and its letterbox preprocess, then the demo
  images are predicted as ``edgesdk.load`` places the bundle here: one line per image with its boxes (in the
  original image's pixels) and a PNG with them drawn.

Everything is written under the work directory (``build/demo`` by default); data already there is reused. The
samples' own scripts run as a user runs them (a subprocess of this Python), so they stay programs to copy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgesdk.errors import ConversionError

REPO_ROOT = Path(__file__).resolve().parents[2]  # a checkout: converters/edgesdk_converters/demo.py
SAMPLES = ("digits", "shapes")
SHAPES_SAMPLES = 200  # calibration images of the shapes detector: all data.py writes, and quick (~15 s)


def run_demo(workdir: Path, sample: str = "all", quiet: bool = False) -> None:
    """Run one sample's demo (``digits``, ``shapes``) or ``all`` of them, in that order."""
    if sample != "all" and sample not in SAMPLES:
        raise ConversionError(f"no demo sample {sample!r} (samples: {', '.join(SAMPLES)}, or all)")
    names = SAMPLES if sample == "all" else (sample,)
    for i, name in enumerate(names):
        if len(names) > 1:
            print(f"{chr(10) * 2 if i else ''}== {name} (samples/{name}) ==", flush=True)
        (digits_demo if name == "digits" else shapes_demo)(Path(workdir), quiet)


def digits_demo(workdir: Path, quiet: bool = False) -> Path:
    """Quantize the digits classifier to all three targets and print the validation table; returns the bundle."""
    from .quantize import quantize

    sample = _sample("digits", "digits.pt2")
    images = workdir / "digits-images"
    if not (images / "val").is_dir():
        print(f"exporting scikit-learn's digits to {images}", file=sys.stderr)
        _run_script(sample / "export_images.py", images, "exporting the digits images",
                    "needs scikit-learn: pip install 'edgesdk[dev]'")
    result = quantize(
        sample / "digits.pt2", images / "train", workdir / "digits.bundle", val=images / "val",
        preprocess=sample / "preprocess.toml", overwrite=True, progress=not quiet, max_drop=0.5,
    )
    print(result.table())
    print(f"\nbundle written to {result.bundle} (inspect it: edgesdk inspect {result.bundle})")
    return result.bundle


def shapes_demo(workdir: Path, quiet: bool = False) -> Path:
    """Write the shapes data, quantize the detector with its task and letterbox preprocess (bundle name
    ``shapes``), print the validation table, then predict the demo images and draw their boxes; returns the
    bundle."""
    from edgesdk.tomlfile import read_toml

    from .quantize import quantize

    sample = _sample("shapes", "shapes_detector.onnx")
    data = workdir / "shapes-data"
    if not (data / "val.json").is_file():
        print(f"writing the shapes images to {data}", file=sys.stderr)
        _run_script(sample / "data.py", data, "writing the shapes images")
    result = quantize(
        sample / "shapes_detector.onnx", data / "calib", workdir / "shapes.bundle", val=data / "val",
        preprocess=sample / "preprocess.toml", labels=data / "labels.txt",
        task=read_toml(sample / "task.toml", "task"), samples=SHAPES_SAMPLES, name="shapes", overwrite=True,
        progress=not quiet,
    )
    print(result.table())
    print(f"\nbundle written to {result.bundle} (inspect it: edgesdk inspect {result.bundle})\n")
    draw_detections(result.bundle, sorted((data / "demo").glob("*.png")), workdir / "shapes-drawn")
    return result.bundle


def draw_detections(bundle: Path, images: list[Path], out: Path) -> list[Path]:
    """Predict each image with ``bundle`` (as ``edgesdk.load`` places it here), print one line per image with
    its detections, and write each with its boxes drawn to ``out``/<image name>; returns the PNGs written."""
    import edgesdk
    from edgesdk.cli.show import describe, draw

    written = []
    with edgesdk.load(bundle) as model:
        print(f"predicting {len(images)} demo image(s) with {model.placement}")
        for image in images:
            result = model.predict(image)
            drawn = draw(result.decoded, image, out / image.name)
            with_size = f"{image.name} ({_size(image)})"
            print(f"{with_size}: {describe(result.decoded)} -> {drawn}")
            written.append(drawn)
    return written


def _size(image: Path) -> str:
    from PIL import Image

    with Image.open(image) as opened:
        return f"{opened.width}x{opened.height}"


def _sample(name: str, model: str) -> Path:
    folder = REPO_ROOT / "samples" / name
    if not (folder / model).is_file():
        raise ConversionError(f"the {name} sample is not at {folder}; run the demo from a checkout of edgesdk")
    return folder


def _run_script(script: Path, out: Path, what: str, hint: str = "") -> None:
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ConversionError(f"{what} failed{f' ({hint})' if hint else ''}:\n{done.stderr.strip()[-2000:]}")


__all__ = ["SAMPLES", "run_demo", "digits_demo", "shapes_demo", "draw_detections"]
