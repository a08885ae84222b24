"""Which external data a bundle's ONNX file may name: only files its artifact lists, inside the model's folder.

An ONNX model may keep tensors in other files ("external data"), named by a relative ``location`` that ONNX Runtime
(or OpenVINO) opens next to the model; a hostile model could name ../../etc/passwd, an absolute path, or a file the
manifest does not list (CVE-2022-25882, CVE-2024-27318). The locations are read by
:mod:`edgesdk.engines.model_files` (without the onnx package); this module holds them against the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.model_files import external_data_locations, location_problem
from ..errors import BundleError
from .schema import _show


def check_external_data(root: Path, manifest: dict[str, Any]) -> None:
    """Refuse an ONNX file of the bundle at ``root`` whose external data is not one of its artifact's listed files.

    Runs on the verified files (after their sha256 check), before any engine reads them.
    """
    for art in manifest["artifacts"]:
        files = [root / f["path"] for f in art["files"]]
        listed = {f.resolve() for f in files}
        for rel, model in zip((f["path"] for f in art["files"]), files):
            # Every file, whatever its name: OpenVINO picks its reader by content, so an ONNX file named .xml loads.
            try:
                locations = external_data_locations(model)
            except BundleError:
                # Not well-formed protobuf (the walk follows the same messages ONNX's parser does): no engine can
                # load it, so it reads no external data either; the engine's load refuses it and says why.
                continue
            for location in locations:
                problem = location_problem(model, location)
                if problem is None and (model.parent / location).resolve() not in listed:
                    problem = "is not among the artifact's files in the manifest"
                if problem:
                    raise BundleError(f"bundle artifact {art['id']!r}: {rel} names external data "
                                      f"{_show(location)}, which {problem}")
