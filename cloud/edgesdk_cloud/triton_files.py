"""The text files of a Triton model repository for a bundle: ``config.pbtxt`` and the README.

Strings are protobuf text-format strings in the config (:func:`pbtxt_string`) and escaped in comments and Markdown
(:mod:`edgesdk_cloud.escaping`); the request size Triton should accept is the one-image cap of
:class:`~edgesdk_cloud.limits.ServeLimits`.
"""

from __future__ import annotations

import json
import shlex

from edgesdk import __version__
from edgesdk.bundle.reader import Artifact, Bundle

from .escaping import md_code, one_line
from .limits import ServeLimits, dynamic_inputs
from .server import BundleSignature


def triton_limits(bundle: Bundle) -> ServeLimits | None:
    """Triton takes the manifest's full shapes, batch 1 included: the caps of one image; None when an input has a
    dynamic dimension (-1), whose size the manifest does not give."""
    if dynamic_inputs(bundle.manifest):
        return None
    return ServeLimits.for_manifest(bundle.manifest, max_batch=1)


def _unsized(bundle: Bundle, quote) -> str:
    return (f"input(s) {', '.join(map(quote, dynamic_inputs(bundle.manifest)))} have a dynamic dimension (-1), so "
            f"the size of a request is not known here")


def triton_config(bundle: Bundle, chosen: Artifact, names: dict[str, list[str]]) -> str:
    signature = BundleSignature(bundle.manifest)
    limits = triton_limits(bundle)

    def tensors(kind: str, specs, onnx_names: list[str]) -> list[str]:
        blocks = []
        for spec, name in zip(specs, onnx_names):
            dims = ", ".join(str(d) for d in spec.shape)
            blocks.append(f"  {{\n    name: {pbtxt_string(name)}\n    data_type: TYPE_{spec.datatype}\n"
                          f"    dims: [ {dims} ]\n  }}")
        return [f"{kind} [", ",\n".join(blocks), "]"]

    if limits is None:
        cap = [f"# The {_unsized(bundle, one_line)}. Triton's body cap is a server option: set",
               "# tritonserver --http-max-input-size=<bytes> to the largest request you expect (its default: 64 MiB)."]
    else:
        cap = [f"# A request is one image: at most {limits.max_body_bytes} bytes in JSON (32 bytes a value + 64 KiB). "
               f"Triton's body cap is a server option:",
               f"# tritonserver --http-max-input-size={limits.max_body_bytes} (its default, 64 MiB, is more than this "
               f"model needs)."]
    lines = [
        f"# Written by edgesdk export triton: bundle {one_line(json.dumps(bundle.name))} version "
        f"{one_line(bundle.manifest['version'])}, artifact {one_line(chosen.id)}.",
        "# max_batch_size 0: the artifact is compiled for a fixed batch of 1, so the dims are its full shapes.",
        *cap,
        f"name: {pbtxt_string(bundle.name)}",
        'platform: "onnxruntime_onnx"',
        "max_batch_size: 0",
        *tensors("input", signature.inputs, names["inputs"]),
        *tensors("output", signature.outputs, names["outputs"]),
    ]
    return "\n".join(lines) + "\n"


def pbtxt_string(text: str) -> str:
    """A protobuf text-format string: printable ASCII as is, the rest as octal escapes of its UTF-8 bytes."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        out.append(f"\\{char}" if char in '"\\' else char if 32 <= byte < 127 else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def triton_readme(bundle: Bundle, chosen: Artifact, names: dict[str, list[str]], marker: str) -> str:
    manifest_inputs = [t["name"] for t in bundle.manifest["inputs"]]
    device = ("so its inputs are what a device running the bundle sends (names, datatypes, shapes)"
              if names["inputs"] == manifest_inputs else
              f"which differ from the input names a device running the bundle sends "
              f"({', '.join(map(md_code, manifest_inputs))}): "
              f"for a device's cloud, use `edgesdk export kserve`")
    limits = triton_limits(bundle)
    body_cap = "<bytes>" if limits is None else limits.max_body_bytes
    cap_text = (f"The {_unsized(bundle, md_code)}: set `--http-max-input-size` to the largest request body you "
                f"expect." if limits is None else "`--http-max-input-size` caps a request body at what one image "
                "takes in JSON (32 bytes a value, plus 64 KiB).")
    return f"""\
# {one_line(bundle.name)} {one_line(bundle.manifest['version'])}: a Triton model repository

Written by `edgesdk export triton` (edgesdk {__version__}): {md_code(bundle.name + '/1/model.onnx')} is artifact
{md_code(chosen.id)} of the bundle, unchanged; {md_code(bundle.name + '/config.pbtxt')} gives Triton its inputs and
outputs (platform `onnxruntime_onnx`, `max_batch_size: 0`: the artifact takes exactly the manifest's shapes, batch 1
included). `{marker}` marks the folder as an export; Triton reads only the model folders.

```bash
docker run --rm -p 8000:8000 -v "$PWD":/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 \\
    tritonserver --model-repository=/models --http-max-input-size={body_cap}
curl {shlex.quote(one_line(f"localhost:8000/v2/models/{bundle.name}"))}
```

{cap_text}
Triton speaks the Open Inference Protocol V2 under the same model name as `edgesdk serve`, with the ONNX file's
tensor names (inputs {', '.join(map(md_code, names['inputs']))}; outputs {', '.join(map(md_code, names['outputs']))}),
{device}.
Unlike `edgesdk serve`, it takes a batch of 1 only.
"""
