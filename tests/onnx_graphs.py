"""Tiny ONNX graphs for the importer tests, and the comparison against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

RNG_SEED = 0


class Const:
    """An initializer input of a one-node graph (a runtime input is a plain ndarray)."""

    def __init__(self, value):
        self.value = np.asarray(value)


def rand(*shape, dtype=np.float32, low=-1.0, high=1.0, seed=None):
    rng = np.random.default_rng(RNG_SEED if seed is None else seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(low), int(high), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def node_model(op_type: str, inputs: list, opset: int = 13, outputs: int = 1, **attrs):
    """A one-node model and its feeds: ndarray -> graph input, Const -> initializer, None -> absent input."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(value, Const):
            inits.append(numpy_helper.from_array(value.value, name))
        else:
            value = np.asarray(value)
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
            feeds[name] = value
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, name=f"{op_type.lower()}_node", **attrs)
    graph = helper.make_graph([node], op_type, graph_inputs, [helper.make_empty_tensor_value_info(n) for n in out_names],
                              initializer=inits)
    return make_model(graph, opset), feeds


def save_graph(path, nodes, inputs, outputs, inits: dict, opset: int = 13) -> None:
    """Write a graph of ``nodes`` (initializers ``inits``: name -> array) as an ONNX model at ``path``."""
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, [numpy_helper.from_array(v, k)
                                                                  for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))


def make_model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 19 else 9
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {vi.name: vi for vi in inferred.graph.output}
    for out in model.graph.output:
        if typed.get(out.name) is not None and typed[out.name].type.tensor_type.elem_type:
            out.CopyFrom(typed[out.name])
    return model


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_module(module: torch.nn.Module, model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    initializers = {init.name for init in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers]
    with torch.no_grad():
        result = module(*[torch.from_numpy(np.array(feeds[n])) for n in names])
    if isinstance(result, torch.Tensor):
        result = (result,)
    return [r.numpy() for r in result]


def assert_close(actual: list[np.ndarray], expected: list[np.ndarray], rel: float = 1e-5,
                 exact_int_width: bool = True) -> None:
    """Same shapes and dtypes; floats within ``rel`` of each output's range, others exactly equal.

    ``exact_int_width=False`` accepts int32 for int64 (LiteRT has no int64 tensors at its boundary).
    """
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != {e.shape}"
        if exact_int_width or not np.issubdtype(e.dtype, np.integer):
            assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype} != {e.dtype}"
        else:
            assert np.issubdtype(a.dtype, np.integer), f"output {i}: dtype {a.dtype} != {e.dtype}"
        if np.issubdtype(e.dtype, np.floating):
            finite = np.isfinite(e)
            assert np.array_equal(finite, np.isfinite(a)), f"output {i}: inf/nan positions differ"
            if finite.any():
                span = float(np.ptp(e[finite])) if e[finite].size > 1 else abs(float(e[finite][0]))
                err = float(np.max(np.abs(a[finite].astype(np.float64) - e[finite])))
                assert err <= rel * max(span, 1e-3), f"output {i}: max abs error {err:.3g} (range {span:.3g})"
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"output {i}")


def chain_model() -> onnx.ModelProto:
    """Conv -> HardSigmoid/HardSwish -> Concat -> Resize -> ConvTranspose -> Split -> Slice -> Add -> Softmax
    -> ReduceMean -> Reshape -> LayerNormalization (opset 17), and a MaxPool side output."""
    T = onnx.TensorProto
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["a"], ["hs"]),
        helper.make_node("HardSwish", ["a"], ["hw"]),
        helper.make_node("Concat", ["hs", "hw"], ["cat"], axis=1),
        helper.make_node("Resize", ["cat", "", "scales"], ["up"], mode="linear"),
        helper.make_node("ConvTranspose", ["up", "w2", "b2"], ["ct"], strides=[2, 2], pads=[1, 1, 1, 1],
                         output_padding=[1, 1]),
        helper.make_node("Split", ["ct", "split"], ["s1", "s2"], axis=1),
        helper.make_node("Slice", ["s1", "starts1", "ends1", "axes"], ["left"]),
        helper.make_node("Slice", ["s2", "starts2", "ends2", "axes"], ["right"]),
        helper.make_node("Add", ["left", "right"], ["sum"]),
        helper.make_node("Softmax", ["sum"], ["soft"], axis=1),
        helper.make_node("ReduceMean", ["soft"], ["mean"], axes=[3], keepdims=1),
        helper.make_node("Reshape", ["mean", "shape"], ["rows"]),
        helper.make_node("LayerNormalization", ["rows", "ln_scale", "ln_bias"], ["out"], axis=-1),
        helper.make_node("MaxPool", ["a"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    inits = {
        "w1": rand(6, 4, 3, 3, seed=31), "b1": rand(6, seed=32) * 3, "scales": np.array([1, 1, 2, 2], np.float32),
        "w2": rand(12, 8, 3, 3, seed=33), "b2": rand(8, seed=34), "split": np.array([4, 4], np.int64),
        "starts1": np.array([0], np.int64), "ends1": np.array([16], np.int64), "axes": np.array([3], np.int64),
        "starts2": np.array([16], np.int64), "ends2": np.array([32], np.int64),
        "shape": np.array([0, 4, 32], np.int64), "ln_scale": rand(32, seed=35), "ln_bias": rand(32, seed=36),
    }
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("out", T.FLOAT, [1, 4, 32]),
                               helper.make_tensor_value_info("pooled", T.FLOAT, [1, 6, 4, 4])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return make_model(graph, 17)


class SideBySide(torch.nn.Module):
    """Several imported one-node modules in one module, so one litert-torch conversion covers them all."""

    def __init__(self, modules: list[torch.nn.Module], input_counts: list[int]):
        super().__init__()
        self.parts = torch.nn.ModuleList(modules)
        self.input_counts = input_counts

    def forward(self, *args):
        outputs, start = [], 0
        for part, count in zip(self.parts, self.input_counts):
            result = part(*args[start:start + count])
            start += count
            outputs.extend(result if isinstance(result, tuple) else (result,))
        return tuple(outputs)


def run_litert(path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    """Run a litert-torch export through its signature (inputs args_0.., outputs output_0..)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner()
    wanted = {name: detail["dtype"] for name, detail in runner.get_input_details().items()}
    # litert-torch turns int64 inputs into int32 ones
    result = runner(**{f"args_{i}": f.astype(wanted[f"args_{i}"]) for i, f in enumerate(feeds)})
    return [result[f"output_{i}"] for i in range(len(result))]
