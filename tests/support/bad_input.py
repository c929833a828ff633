"""Bad input, as the error tests build it: graph inputs made symbolic so a
badly shaped feed reaches the kernel, an initializer swapped for another
array, and the check that a session names what is wrong."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from support.sessions import error_text, hina_session


def relax_inputs(model: onnx.ModelProto, unknown_rank: bool = False) -> onnx.ModelProto:
    """Make every graph input's dims symbolic (or drop the shape entirely) so
    ORT does not reject a badly shaped feed before the kernel sees it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        tt = vi.type.tensor_type
        if unknown_rank:
            tt.ClearField("shape")
        else:
            for j, d in enumerate(tt.shape.dim):
                d.ClearField("dim_value")
                d.dim_param = f"{vi.name}_d{j}"
    return m


def expect_error(model, feeds_fn, *needles):
    with pytest.raises(Exception) as info:
        sess = hina_session(model)
        sess.run(None, feeds_fn())
    text = error_text(info.value)
    for n in needles:
        assert n in text, text


def replace_init(model, name, arr, elem=None):
    from onnx import TensorProto, helper

    for init in model.graph.initializer:
        if init.name == name:
            et = elem if elem is not None else (TensorProto.UINT8 if arr.dtype == np.uint8 else TensorProto.FLOAT)
            init.CopyFrom(helper.make_tensor(name, et, list(arr.shape), arr.tobytes(), raw=True))
            return
    raise KeyError(name)
