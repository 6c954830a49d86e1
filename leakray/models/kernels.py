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
    the demo's collections (benchmarks/bench_detect.py). There it is `FusedAdam`: torch's kernel
    and state without torch.optim's Optimizer around them."""
    import torch

    params = list(params)
    device = next((p.device.type for p in params if isinstance(p, torch.Tensor)), "cpu")
    if device in ("cpu", "cuda"):
        return FusedAdam(params, **kwargs)
    return torch.optim.Adam(params, **kwargs)


class FusedAdam:
    """`torch.optim.Adam(fused=True)` as the detectors use it (step, zero_grad; no amsgrad,
    maximize, grad scaling or schedules): the same `torch._fused_adam_` call on the same state
    (step counts as float32 tensors on the parameters' device, moments zeros-like), so the
    weights it gives are torch's to the bit (tests/test_models.py). Why not torch's class: its
    Optimizer wraps construction, `step` and `zero_grad` in `torch._disable_dynamo`, whose first
    call imports torch._dynamo (and sympy): 1.4-2.4 CPU s in every process that fits a detector
    and loads no transformers model (a detect stage's Ray workers, its driver), for a compiler
    leakray never uses; and each step pays its hooks and profiler records (~0.35 ms, a sixth of
    AdvPrompt-MIA's step at batch 4). `benchmarks/bench_adam.py` measures both, side by side."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        import torch

        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("FusedAdam got no parameter that requires a gradient")
        if len({(p.device, p.dtype) for p in self.params}) > 1:
            raise ValueError("FusedAdam keeps one device and dtype (torch.optim.Adam groups several)")
        if not (0.0 <= lr and 0.0 <= eps and 0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0 and 0.0 <= weight_decay):
            raise ValueError(f"invalid Adam settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), (float(betas[0]), float(betas[1])), float(eps), \
            float(weight_decay)
        self._state: dict[int, tuple] = {}  # index -> (step, exp_avg, exp_avg_sq), made at the first step (as torch)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def step(self) -> None:
        import torch

        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        for i in live:
            if i not in self._state:
                p = self.params[i]
                self._state[i] = (torch.zeros((), dtype=torch.float32, device=p.device),
                                  torch.zeros_like(p, memory_format=torch.preserve_format),
                                  torch.zeros_like(p, memory_format=torch.preserve_format))
        with torch.no_grad():
            steps = [self._state[i][0] for i in live]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_([self.params[i] for i in live], [self.params[i].grad for i in live],
                               [self._state[i][1] for i in live], [self._state[i][2] for i in live], [], steps,
                               amsgrad=False, lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                               weight_decay=self.weight_decay, eps=self.eps, maximize=False, grad_scale=None,
                               found_inf=None)
