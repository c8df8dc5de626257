"""trainbox.runtime.kernels: the causal_conv1d choice per device and its pure-torch reference, checked on the CPU
against an explicit loop (and against the causal-conv1d package where it imports: CUDA hosts)."""

from __future__ import annotations

import pytest
import torch

from trainbox.runtime import device, kernels
from trainbox.runtime.errors import TrainboxError


def loop_reference(x, weight, bias=None, activation=None):
    """out[b, c, t] = act(bias[c] + sum_k w[c, k] * x[b, c, t - (W - 1) + k]), zeros before t = 0, in float64."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    xd, wd = x.double(), weight.double()
    out = torch.zeros(batch, dim, seqlen, dtype=torch.float64)
    for b in range(batch):
        for c in range(dim):
            for t in range(seqlen):
                acc = float(bias[c]) if bias is not None else 0.0
                for k in range(width):
                    src = t - (width - 1) + k
                    if src >= 0:
                        acc += float(wd[c, k]) * float(xd[b, c, src])
                out[b, c, t] = acc
    return torch.nn.functional.silu(out) if activation in ("silu", "swish") else out


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_causal_conv1d_matches_the_loop(width, activation, with_bias):
    g = torch.Generator().manual_seed(width * 7 + with_bias)
    x = torch.randn(2, 5, 9, generator=g)
    w = torch.randn(5, width, generator=g)
    b = torch.randn(5, generator=g) if with_bias else None
    out = kernels.causal_conv1d(x, w, b, activation)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), loop_reference(x, w, b, activation), rtol=1e-5, atol=1e-5)


def test_causal_conv1d_is_causal_and_keeps_the_input_dtype():
    x = torch.randn(1, 3, 8)
    w = torch.randn(3, 4)
    future = x.clone()
    future[..., 5:] += 100.0  # changing t >= 5 must not move any output before t = 5
    a, b = kernels.causal_conv1d(x, w), kernels.causal_conv1d(future, w)
    torch.testing.assert_close(a[..., :5], b[..., :5])
    assert not torch.allclose(a[..., 5:], b[..., 5:])
    out = kernels.causal_conv1d(x.to(torch.bfloat16), w)  # computed in the weight's dtype, returned in x's
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), kernels.causal_conv1d(x.to(torch.bfloat16).float(), w),
                               rtol=1e-2, atol=1e-2)


def test_causal_conv1d_gradients_flow():
    x = torch.randn(2, 4, 6, requires_grad=True)
    w = torch.randn(4, 3, requires_grad=True)
    kernels.causal_conv1d(x, w, activation="silu").sum().backward()
    assert x.grad is not None and w.grad is not None and torch.isfinite(w.grad).all()


def test_causal_conv1d_rejects_bad_input():
    with pytest.raises(TrainboxError, match="activation='relu'"):
        kernels.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(2, 2), activation="relu")
    with pytest.raises(TrainboxError, match=r"x \(1, 3, 4\) and weight \(2, 2\)"):
        kernels.causal_conv1d(torch.zeros(1, 3, 4), torch.zeros(2, 2))


def test_causal_conv1d_matches_the_causal_conv1d_package_when_it_imports():
    pkg = pytest.importorskip("causal_conv1d", reason="the causal-conv1d package (CUDA) is not installed here")
    if not torch.cuda.is_available():
        pytest.skip("the causal-conv1d kernel needs a CUDA device")
    x, w, b = torch.randn(2, 64, 128, device="cuda"), torch.randn(64, 4, device="cuda"), torch.randn(64, device="cuda")
    torch.testing.assert_close(kernels.causal_conv1d(x, w, b, "silu"), pkg.causal_conv1d_fn(x, w, b, "silu"),
                               rtol=1e-3, atol=1e-3)


def test_the_choice_per_device(monkeypatch):
    npu = kernels.choose_causal_conv1d("npu")
    assert npu.name == "torch" and npu.fn is kernels.causal_conv1d and "192 KB unified buffer" in npu.reason
    assert kernels.choose_causal_conv1d("cpu").fn is kernels.causal_conv1d
    cuda = kernels.choose_causal_conv1d("cuda")  # the package is absent here: the reference, saying why
    assert cuda.name == "torch" and "causal-conv1d package does not import" in cuda.reason

    class StandIn:  # stand-in for the causal-conv1d package on a CUDA host
        @staticmethod
        def causal_conv1d_fn(x, weight, bias=None, activation=None):
            return "fused"

    monkeypatch.setattr(device, "optional_import", lambda name: (StandIn, None) if name == "causal_conv1d"
                        else (None, "absent"))
    chosen = kernels.choose_causal_conv1d("cuda")
    assert chosen.name == "causal_conv1d" and chosen.fn is StandIn.causal_conv1d_fn
    assert kernels.choose_causal_conv1d("npu").name == "torch"  # never the Triton kernel on Ascend


def test_the_capability_names_the_reference(monkeypatch):
    monkeypatch.delenv("TRAINBOX_DEVICE", raising=False)
    cap = device.capabilities("npu")["causal_conv1d"]
    assert not cap and "192 KB" in cap.reason and "kernels.causal_conv1d" in cap.alternative
    with pytest.raises(device.CapabilityError, match="unified buffer.*torch conv1d"):
        device.require("causal_conv1d", "npu")
    assert not device.capabilities("cpu")["causal_conv1d"]
