"""Source models: a ``.pt2`` (torch.export), an ``.onnx``, a float ``.tflite``, or an ``nn.Module``.

A :class:`Source` knows its inputs/outputs and how to hand itself to each
target's toolchain as a float model (``float_tflite``, ``float_onnx``,
``openvino_model``). Refused routes raise :class:`ConversionError` naming the
supported ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgesdk.engines import TensorSpec
from edgesdk.errors import ConversionError

TARGETS = ("tflite", "openvino", "onnx")
SUFFIXES = {".pt2": "pytorch", ".onnx": "onnx", ".tflite": "tflite"}
# Which targets each source kind can reach, and why not the others.
ROUTES = {
    "pytorch": ("tflite", "openvino", "onnx"),
    "onnx": ("tflite", "openvino", "onnx"),
    "tflite": ("tflite", "openvino"),
}
ROUTES_TEXT = (
    "supported routes: .pt2/nn.Module -> tflite, openvino, onnx; .onnx -> tflite, openvino, onnx; "
    ".tflite -> tflite, openvino"
)


class Source:
    """A float model to quantize. Build with :func:`open_source`."""

    kind: str = ""

    def __init__(self, name: str, path: Path | None):
        self.name = name
        self.path = path
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.shapes_from: str | None = None  # where dynamic input dimensions were fixed from, if there were any
        # What was done to the model on the way to a target (an opset upgrade): ``notes`` are said in the progress
        # log once the targets are checked, ``provenance`` goes into the manifest's ``source`` section.
        self.notes: list[str] = []
        self.provenance: dict[str, Any] = {}

    @property
    def targets(self) -> tuple[str, ...]:
        return ROUTES[self.kind]

    def default_targets(self, say: Callable[[str], None]) -> list[str]:
        """The targets built when none are named: every one this source can reach."""
        return list(self.targets)

    def check_targets(self, targets: list[str]) -> None:
        for t in targets:
            if t not in TARGETS:
                raise ConversionError(f"unknown target {t!r}; targets are {', '.join(TARGETS)}")
            if t not in self.targets:
                raise ConversionError(f"cannot build target {t!r} from a {self.kind} source ({self.name}); {ROUTES_TEXT}")

    def fix_shapes(self, sample: list[np.ndarray]) -> None:
        """Replace dynamic input dimensions with those of a real sample."""
        if self.shapes_from is None and any(d == -1 for s in self.inputs for d in s.shape):
            self.shapes_from = "calibration data"
        self.inputs = [TensorSpec(s.name, tuple(a.shape), s.dtype) for s, a in zip(self.inputs, sample)]

    def set_input_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Fix the inputs' dynamic dimensions from ``--input-shape name:1x3x48x192`` before any data is read."""
        names = [s.name for s in self.inputs]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise ConversionError(f"--input-shape names {', '.join(map(repr, unknown))}, which {self.name} does not "
                                  f"have (inputs: {', '.join(names)})")
        fixed = []
        for spec in self.inputs:
            shape = tuple(shapes.get(spec.name, spec.shape))
            if len(shape) != len(spec.shape) or any(d != -1 and d != g for d, g in zip(spec.shape, shape)):
                raise ConversionError(f"--input-shape {spec.name}:{'x'.join(map(str, shape))} does not fit "
                                      f"{self.name}'s input {spec.name!r} of shape {_shape_text(spec.shape)}")
            if any(d < 1 for d in shape):
                raise ConversionError(f"--input-shape {spec.name}: every dimension must be at least 1, got "
                                      f"{'x'.join(map(str, shape))}")
            fixed.append(TensorSpec(spec.name, shape, spec.dtype))
        self.inputs = fixed
        self.shapes_from = "--input-shape"

    # Each subclass implements the hand-offs its routes need.
    def float_tflite(self, path: Path) -> Path:
        raise ConversionError(f"no route to tflite from {self.kind}; {ROUTES_TEXT}")

    def float_onnx(self, path: Path) -> Path:
        raise ConversionError(f"no route to onnx from {self.kind}; {ROUTES_TEXT}")

    def openvino_model(self):
        """The float model as an OpenVINO model with the fixed input shapes of the data.

        Static shapes matter: the CPU plugin compiles them faster, and an INT8 IR left
        with dynamic dims (as ``convert_model`` gives for an ExportedProgram) fails to
        compile in bf16 mode ("No suitable implementations").
        """
        import openvino as ov

        try:
            model = ov.convert_model(self._openvino_input())
            model.reshape({i: list(s.shape) for i, s in enumerate(self.inputs)})
        except Exception as exc:
            raise ConversionError(f"OpenVINO could not convert {self.name}: {exc}") from exc
        return model

    def _openvino_input(self):
        return str(self.path)


class PyTorchSource(Source):
    kind = "pytorch"

    def __init__(self, program, name: str, path: Path | None):
        super().__init__(name, path)
        self.program = program
        sig = program.graph_signature
        nodes = {n.name: n for n in program.graph.nodes}
        self.inputs = [_torch_spec(name, nodes[name]) for name in sig.user_inputs]
        out_node = next(n for n in program.graph.nodes if n.op == "output")
        out_vals = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        self.outputs = [_torch_spec(f"output_{i}", n) for i, n in enumerate(out_vals)]

    def example_inputs(self) -> tuple:
        import torch

        if any(d == -1 for s in self.inputs for d in s.shape):
            raise ConversionError(f"{self.name}: input shapes {[list(s.shape) for s in self.inputs]} are not fixed")
        return tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.inputs)

    def float_tflite(self, path: Path) -> Path:
        import litert_torch

        try:
            litert_torch.convert(self.program.module(), self.example_inputs()).export(str(path))
        except Exception as exc:  # litert-torch raises many kinds on unsupported graphs
            raise ConversionError(f"litert-torch could not convert {self.name} to tflite: {exc}") from exc
        return path

    def float_onnx(self, path: Path) -> Path:
        import torch

        try:
            torch.onnx.export(
                self.program, (), str(path), dynamo=True, external_data=False,
                input_names=[s.name for s in self.inputs], verbose=False,
            )
        except Exception as exc:
            raise ConversionError(f"torch.onnx.export could not export {self.name}: {exc}") from exc
        return path

    def _openvino_input(self):
        return self.program


class OnnxSource(Source):
    """An ``.onnx`` file from any exporter: opsets 7 and up, dynamic dims declared as ``dim_param``, ``-1``/``0``
    or unnamed, ops checked route by route before any work (see :mod:`.onnx_prepare`)."""

    kind = "onnx"

    def __init__(self, path: Path):
        super().__init__(path.name, path)
        import onnx

        from .onnx_prepare import check_opset

        try:
            model = onnx.load(str(path), load_external_data=False)
            self.opset = check_opset(model, path.name)  # first: the checker's own words on an opset are obscure
            onnx.checker.check_model(model)
        except ConversionError:
            raise
        except Exception as exc:
            raise ConversionError(f"{path} is not a valid ONNX model: {exc}") from exc
        quantized = [n.op_type for n in model.graph.node
                     if n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                                      "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear")]
        if quantized:
            raise ConversionError(f"{path} is already quantized (it has {quantized[0]} nodes); give the float model")
        self.provenance = {"opset": self.opset}
        inits = {i.name for i in model.graph.initializer}
        self.inputs = [_onnx_spec(v) for v in model.graph.input if v.name not in inits]
        self.outputs = [_onnx_spec(v) for v in model.graph.output]
        self._why_not: dict[str, str | None] = {}
        self._for_onnx = None  # the model the onnx target quantizes, once check_targets has prepared it

    def _model(self):
        import onnx

        return onnx.load(str(self.path), load_external_data=False)

    def unsupported(self, target: str) -> str | None:
        """Why ``target`` cannot take this model (every offending op at once), or None; checked once per target,
        before any data is read."""
        if target not in self._why_not:
            check = {"tflite": self.unsupported_for_tflite, "onnx": self._unsupported_for_onnx,
                     "openvino": self._unsupported_for_openvino}[target]
            self._why_not[target] = check()
        return self._why_not[target]

    def unsupported_for_tflite(self) -> str | None:
        """Why the ONNX importer cannot take this model (every op type it lacks, at once), or None."""
        from .onnx_import import unsupported_ops

        missing = unsupported_ops(self._model())
        if not missing:
            return None
        return f"{len(missing)} op type(s) are not supported by the ONNX importer: {_op_listing(missing)}"

    def _unsupported_for_onnx(self) -> str | None:
        """Ops outside the domains ONNX Runtime implements; an opset the quantizer needs upgraded and cannot be."""
        from .onnx_prepare import PER_AXIS_QDQ_OPSET, dynamic_dims_named, upgrade_opset

        model = self._model()
        custom = _ops_outside(model, _ORT_DOMAINS)
        if custom:
            return f"{len(custom)} custom op type(s) that ONNX Runtime does not implement: {_op_listing(custom)}"
        if self.opset < PER_AXIS_QDQ_OPSET:
            try:
                model = upgrade_opset(model, PER_AXIS_QDQ_OPSET, self.name)
            except ConversionError as exc:
                return (f"it is opset {self.opset} and per-channel INT8 (QuantizeLinear/DequantizeLinear with an axis) "
                        f"needs opset {PER_AXIS_QDQ_OPSET}, but {exc}")
            self.notes.append(f"[onnx] {self.name} is ONNX opset {self.opset}: upgraded to opset {PER_AXIS_QDQ_OPSET} "
                              "with onnx.version_converter (per-channel QuantizeLinear/DequantizeLinear need it)")
            self.provenance["opset_upgrade"] = {"to": PER_AXIS_QDQ_OPSET, "targets": ["onnx"],
                                                "tool": "onnx.version_converter"}
        self._for_onnx = dynamic_dims_named(model)
        return None

    def _unsupported_for_openvino(self) -> str | None:
        """Ops OpenVINO's ONNX frontend cannot convert: its partial conversion leaves them as framework nodes."""
        from openvino.frontend import FrontEndManager

        # The manager owns the frontend's library: it must outlive every object the frontend made (dropping it
        # first unloads the code those objects run, a segfault).
        manager = FrontEndManager()
        frontend = manager.load_by_framework("onnx")
        found: dict[str, list] = {}
        try:
            source = frontend.load(str(self.path))
            partial = frontend.convert_partially(source)
            for op in partial.get_ordered_ops():
                if "FrameworkNode" in op.get_type_name():
                    attrs = op.get_attributes()
                    domain, op_type = attrs.get("ONNX_META_domain", ""), attrs.get("ONNX_META_type", op.get_type_name())
                    entry = found.setdefault(f"{domain}.{op_type}" if domain else op_type, [0, op.get_friendly_name()])
                    entry[0] += 1
            op = partial = source = None  # released while the manager is alive
        except Exception as exc:  # the frontend raises its own GeneralFailure/OpConversionFailure kinds
            return f"OpenVINO's ONNX frontend cannot read it: {exc}"
        finally:
            del frontend, manager
        if not found:
            return None
        missing = [(op, n, first) for op, (n, first) in found.items()]
        return f"{len(missing)} op type(s) that OpenVINO cannot convert: {_op_listing(missing)}"

    def default_targets(self, say: Callable[[str], None]) -> list[str]:
        """Every target that can take the model; each one that cannot is named in the log with why."""
        chosen = []
        for target in self.targets:
            why = self.unsupported(target)
            if why is None:
                chosen.append(target)
            else:
                say(f"not building {target} from {self.name}: {why}")
        if not chosen:
            raise ConversionError(f"no target can take {self.name}: " + "; ".join(
                f"{t}: {self.unsupported(t)}" for t in self.targets))
        return chosen

    def check_targets(self, targets: list[str]) -> None:
        super().check_targets(targets)
        refused = [(t, self.unsupported(t)) for t in targets]  # before any data is read or work starts
        refused = [(t, why) for t, why in refused if why is not None]
        if refused:
            fine = [t for t in self.targets if t not in targets and self.unsupported(t) is None]
            raise ConversionError(f"{self.name} cannot go to " + "; ".join(f"{t}: {why}" for t, why in refused)
                                  + (f" (targets that take it: {', '.join(fine)})" if fine else ""))

    def float_onnx(self, path: Path) -> Path:
        """The model the onnx target quantizes: opset upgraded where per-channel QDQ needs it, ``-1`` dims named."""
        import onnx

        if self._for_onnx is None and self.unsupported("onnx") is not None:
            raise ConversionError(f"{self.name} cannot go to onnx: {self.unsupported('onnx')}")
        onnx.save(self._for_onnx, str(path))
        return path

    def float_tflite(self, path: Path) -> Path:
        """ONNX -> torch (edgesdk's importer, shapes fixed) -> litert-torch, the PyTorch route's converter."""
        import litert_torch
        import torch

        from .onnx_import import import_onnx

        module = import_onnx(self.path, {s.name: tuple(s.shape) for s in self.inputs})
        example = tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.inputs)
        try:
            litert_torch.convert(module, example).export(str(path))
        except Exception as exc:  # litert-torch raises many kinds on unsupported graphs
            raise ConversionError(f"litert-torch could not convert {self.name} (imported from ONNX) to tflite: "
                                  f"{exc}") from exc
        return path


# Domains ONNX Runtime's CPU build implements (the standard ones and Microsoft's contrib ops).
_ORT_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc")


def _ops_outside(model, domains: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """``(domain.op_type, count, first node name)`` of the main graph's and subgraphs' ops in other domains."""
    found: dict[str, list] = {}

    def visit(graph):
        for node in graph.node:
            if node.domain not in domains:
                entry = found.setdefault(f"{node.domain}.{node.op_type}", [0, node.name or node.output[0]])
                entry[0] += 1
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    visit(sub)

    visit(model.graph)
    return [(op, n, first) for op, (n, first) in found.items()]


def _op_listing(missing: list[tuple[str, int, str]]) -> str:
    return ", ".join(f"{op} ({n} node{'s' if n > 1 else ''}, first {first!r})" for op, n, first in missing)


class TFLiteSource(Source):
    """A float ``.tflite`` file from any exporter (litert-torch, the TF converter, MediaPipe). A model without a
    SignatureDef gets one for the tflite target; custom ops are checked route by route before any work."""

    kind = "tflite"

    def __init__(self, path: Path):
        super().__init__(path.name, path)
        from ai_edge_litert.interpreter import Interpreter

        from .tflite_model import has_signature, operators

        self.operators = operators(path)  # from the flatbuffer: an interpreter stops at the first custom op
        self.has_signature = has_signature(path)
        try:
            interp = Interpreter(model_path=str(path))
            self.inputs = [_tflite_spec(d) for d in interp.get_input_details()]
            self.outputs = [_tflite_spec(d) for d in interp.get_output_details()]
            tensors = interp.get_tensor_details()
        except Exception as exc:  # ValueError, RuntimeError... from the interpreter
            raise ConversionError(f"{path} is not a loadable TFLite model: {type(exc).__name__}: {exc}") from exc
        # A quantized model may keep float I/O around an int8 graph: look at every tensor.
        quantized = [d for d in tensors
                     if np.dtype(d["dtype"]) in (np.int8, np.uint8, np.int16) and d["quantization"][0]]
        if quantized:
            raise ConversionError(
                f"{path} is already quantized ({quantized[0]['name']} is {np.dtype(quantized[0]['dtype']).name}); "
                "give the float model"
            )
        self._litert_error = None
        try:
            interp.allocate_tensors()  # resolves every op's kernel
        except Exception as exc:
            if not self.custom_ops():
                raise ConversionError(f"{path} is not a loadable TFLite model: {type(exc).__name__}: {exc}") from exc
            self._litert_error = " ".join(str(exc).split())
        self._why_not: dict[str, str | None] = {}

    def custom_ops(self) -> list[tuple[str, int, str]]:
        """``(custom code, node count, first node)`` of every custom op (MediaPipe's ``Convolution2DTransposeBias``,
        TF Select's ``Flex*``)."""
        found: dict[str, list] = {}
        for op in self.operators:
            if op.custom:
                found.setdefault(op.name, [0, f"node {op.index}" + (f" of subgraph {op.subgraph}" if op.subgraph
                                                                     else "")])[0] += 1
        return [(name, n, first) for name, (n, first) in found.items()]

    def unsupported(self, target: str) -> str | None:
        """Why ``target`` cannot take this model, or None; checked once per target, before any data is read."""
        if target not in self._why_not:
            check = {"tflite": self._unsupported_for_tflite, "openvino": self._unsupported_for_openvino}[target]
            self._why_not[target] = check()
        return self._why_not[target]

    def _unsupported_for_tflite(self) -> str | None:
        if self._litert_error is not None:
            # LiteRT's own text adds only "Encountered unresolved custom op" and a link when the kernel is missing.
            detail = "" if "unresolved custom op" in self._litert_error else f": {self._litert_error}"
            return (f"{_custom_listing(self.custom_ops())} that LiteRT has no kernel for (AI Edge Quantizer "
                    f"calibrates by running the model in LiteRT, and a device runs it there){detail}")
        if not self.has_signature:
            self.notes.append(f"[tflite] {self.name} has no SignatureDef: one is built from its inputs and outputs "
                              "(AI Edge Quantizer calibrates through it); both LiteRT artifacts carry it")
            self.provenance["signature_added"] = {"key": "serving_default", "targets": ["tflite"]}
        return None

    def _unsupported_for_openvino(self) -> str | None:
        """Ops OpenVINO's TFLite frontend cannot convert: its partial conversion leaves them as framework nodes
        (named by their index in the main subgraph)."""
        from openvino.frontend import FrontEndManager

        try:
            frontend = FrontEndManager().load_by_framework("tflite")
            partial = frontend.convert_partially(frontend.load(str(self.path)))
        except Exception as exc:  # the frontend raises its own GeneralFailure/OpConversionFailure kinds
            return f"OpenVINO's TFLite frontend cannot read it: {' '.join(str(exc).split())}"
        main = {str(op.index): op.name for op in self.operators if op.subgraph == 0}
        found: dict[str, list] = {}
        for node in partial.get_ordered_ops():
            if "FrameworkNode" in node.get_type_name():
                index = node.get_friendly_name()
                found.setdefault(main.get(index, node.get_type_name()), [0, f"node {index}"])[0] += 1
        if not found:
            return None
        missing = [(op, n, first) for op, (n, first) in found.items()]
        custom = {name for name, _, _ in self.custom_ops()}
        what = "custom op" if all(op in custom for op, _, _ in missing) else "op"
        return f"{len(missing)} {what} type(s) that OpenVINO's TFLite frontend cannot convert: {_op_listing(missing)}"

    def default_targets(self, say: Callable[[str], None]) -> list[str]:
        """Every target that can take the model; each one that cannot is named in the log with why."""
        chosen = []
        for target in self.targets:
            why = self.unsupported(target)
            if why is None:
                chosen.append(target)
            else:
                say(f"not building {target} from {self.name}: {why}")
        if not chosen:
            raise ConversionError(f"no target can take {self.name}: " + "; ".join(
                f"{t}: {self.unsupported(t)}" for t in self.targets))
        return chosen

    def check_targets(self, targets: list[str]) -> None:
        super().check_targets(targets)
        refused = [(t, self.unsupported(t)) for t in targets]  # before any data is read or work starts
        refused = [(t, why) for t, why in refused if why is not None]
        if refused:
            fine = [t for t in self.targets if t not in targets and self.unsupported(t) is None]
            raise ConversionError(f"{self.name} cannot go to " + "; ".join(f"{t}: {why}" for t, why in refused)
                                  + (f" (targets that take it: {', '.join(fine)})" if fine else ""))

    def float_tflite(self, path: Path) -> Path:
        shutil.copyfile(self.path, path)
        return path


def _tflite_spec(detail: dict) -> TensorSpec:
    return TensorSpec(detail["name"], tuple(int(v) for v in detail["shape"]), np.dtype(detail["dtype"]).name)


def _custom_listing(custom: list[tuple[str, int, str]]) -> str:
    return f"{len(custom)} custom op type(s) {_op_listing(custom)}"


def open_source(source: Any, example_input: Any = None) -> Source:
    """Open a path (``.pt2``, ``.onnx``, ``.tflite``) or an ``nn.Module`` with ``example_input``."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        kind = SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise ConversionError(
                f"unknown model type {path.suffix or '(no extension)'!r} for {path.name}: "
                f"give a {', '.join(SUFFIXES)} file (or an nn.Module from Python)"
            )
        if not path.is_file():
            raise ConversionError(f"model file not found: {path}")
        if kind == "onnx":
            return OnnxSource(path)
        if kind == "tflite":
            return TFLiteSource(path)
        import torch

        try:
            program = torch.export.load(str(path))
        except Exception as exc:
            raise ConversionError(f"{path} is not a torch.export program (.pt2): {exc}") from exc
        return PyTorchSource(program, path.name, path)
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - convert extra missing
        raise ConversionError("an in-memory model needs torch (pip install 'edgesdk[convert]')") from exc
    if isinstance(source, torch.nn.Module):
        if example_input is None:
            raise ConversionError("an nn.Module source needs example_input (a tensor or tuple of tensors)")
        args = example_input if isinstance(example_input, tuple) else (example_input,)
        args = tuple(torch.as_tensor(a) for a in args)
        try:
            program = torch.export.export(source.eval(), args)
        except Exception as exc:
            raise ConversionError(f"torch.export could not trace {type(source).__name__}: {exc}") from exc
        return PyTorchSource(program, type(source).__name__, None)
    raise ConversionError(f"cannot quantize a {type(source).__name__}; give a model path or an nn.Module")


def _torch_spec(name: str, node) -> TensorSpec:
    val = node.meta.get("val")
    shape = tuple(int(d) if isinstance(d, int) else -1 for d in getattr(val, "shape", ()))
    dtype = str(getattr(val, "dtype", "torch.float32")).replace("torch.", "")
    return TensorSpec(name, shape, dtype)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join("?" if d == -1 else str(d) for d in shape)


def _onnx_spec(value) -> TensorSpec:
    import onnx

    ttype = value.type.tensor_type
    # Dynamic: a dim_param, an unnamed dim, or a dim_value of -1 or 0 (Paddle exports declare a batch as -1).
    shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in ttype.shape.dim)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
    return TensorSpec(value.name, shape, dtype)
