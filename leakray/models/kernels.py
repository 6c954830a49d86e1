"""Faster kernels for the same functions, swapped into a loaded model."""

from __future__ import annotations


def fuse_gelu(model) -> int:
    """Swap GPT-2's `gelu_new` (tanh-approximated GELU spelled as six tensor operations) for
    torch's fused kernel of the same function (`gelu_pytorch_tanh`): 15% off a greedy decoding
    step of the demo's model on CPU, the same tokens (tests/test_decode.py). Returns how many."""
    from transformers.activations import NewGELUActivation, PytorchGELUTanh

    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is NewGELUActivation:
                setattr(module, name, PytorchGELUTanh())
                swapped += 1
    return swapped


def adam(params, **kwargs):
    """Adam with torch's fused kernel where the parameters' device has one (CPU and CUDA): one
    kernel for every parameter's update instead of a dozen tensor operations each. The same
    update rule; the last bits of the weights can differ from the for-loop implementation
    (another summation order). On the detectors' small classifiers (batches of 4-100 rows) the
    optimiser step is most of a training step: AdvPrompt-MIA and CGMIA fit in half the time on
    the demo's collections (benchmarks/bench_detect.py)."""
    import torch

    params = list(params)
    device = next((p.device.type for p in params if isinstance(p, torch.Tensor)), "cpu")
    return torch.optim.Adam(params, fused=device in ("cpu", "cuda"), **kwargs)
