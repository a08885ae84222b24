"""An ``.onnx`` model from any exporter: opsets 7-21 (upgraded for the ONNX Runtime INT8 route where it needs
13), ``-1`` / ``0`` / ``dim_param`` dimensions all dynamic, and the ops each route cannot take named up front."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.engines import TensorSpec
from edgesdk.errors import ConversionError

from .base import Source, _op_listing


class OnnxSource(Source):
    """An ``.onnx`` file from any exporter: opsets 7 and up, dynamic dims declared as ``dim_param``, ``-1``/``0``
    or unnamed, ops checked route by route before any work (see :mod:`.onnx_prepare`)."""

    kind = "onnx"

    def __init__(self, path: Path):
        super().__init__(path.name, path)
        import onnx

        from ..onnx_prepare import check_opset

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

    def fix_inputs(self, values: dict[str, Any]) -> None:
        """Fold the ``If`` branches these input values decide (Silero VAD's ``If`` on ``sr``), as OpenVINO and the
        LiteRT importer need: the model becomes correct for these values only. The inputs stay (the bundle records
        each value; a device fills it in or refuses another)."""
        import tempfile
        import weakref

        import onnx

        from ..onnx_prepare import control_flow, fold_constant_branches

        specs = {s.name: s for s in self.inputs}
        unknown = sorted(set(values) - set(specs))
        if unknown:
            raise ConversionError(f"fixed_inputs names {', '.join(map(repr, unknown))}, which {self.name} does not "
                                  f"have (inputs: {', '.join(specs)})")
        constants = {}
        for name, value in values.items():
            spec = specs[name]
            if any(d == -1 for d in spec.shape):
                raise ConversionError(f"fixed_inputs[{name!r}]: input {name!r} has a dynamic shape "
                                      f"{list(spec.shape)}; give its shape with input_shapes first")
            array = np.full(spec.shape, value, dtype=spec.dtype)
            if array.reshape(-1)[0] != value:
                raise ConversionError(f"fixed_inputs[{name!r}] = {value!r} is not a {spec.dtype} value")
            constants[name] = array
        before = len(control_flow(self._model()))
        shapes = {s.name: tuple(s.shape) for s in self.inputs if all(d > 0 for d in s.shape)}
        folded = fold_constant_branches(self._model(), constants, shapes)
        work = Path(tempfile.mkdtemp(prefix="edgesdk-fixed-"))
        weakref.finalize(self, shutil.rmtree, work, True)
        self.path = work / self.name
        onnx.save(folded, str(self.path))
        self._why_not, self._for_onnx = {}, None  # the routes are checked again on the folded model
        self.fixed = {name: np.asarray(v).item() for name, v in constants.items()}
        left = len(control_flow(folded))
        self.notes.append(f"[source] {self.name} specialized for {self.fixed}: {before - left} If node(s) folded"
                          + (f", {left} control-flow node(s) left" if left else ""))
        self.provenance["fixed_inputs"] = dict(self.fixed)

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
        from ..onnx_import import unsupported_ops

        missing = unsupported_ops(self._model())
        if not missing:
            return None
        return f"{len(missing)} op type(s) are not supported by the ONNX importer: {_op_listing(missing)}"

    def _unsupported_for_onnx(self) -> str | None:
        """Ops outside the domains ONNX Runtime implements; an opset the quantizer needs upgraded and cannot be."""
        from ..onnx_prepare import PER_AXIS_QDQ_OPSET, dynamic_dims_named, upgrade_opset

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

        from ..onnx_import import import_onnx

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




def _onnx_spec(value) -> TensorSpec:
    import onnx

    ttype = value.type.tensor_type
    # Dynamic: a dim_param, an unnamed dim, or a dim_value of -1 or 0 (Paddle exports declare a batch as -1).
    shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in ttype.shape.dim)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
    return TensorSpec(value.name, shape, dtype)
