"""Small modules the tests capture: one per kind of region the frontend must handle."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearGelu(nn.Module):
    def __init__(self, k, n, approximate="none"):
        super().__init__()
        self.proj = nn.Linear(k, n)
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(self.proj(x), approximate=self.approximate)


class LinearLayerNorm(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.proj = nn.Linear(k, n)
        self.norm = nn.LayerNorm(n)

    def forward(self, x):
        return self.norm(self.proj(x))


class LinearResidualLayerNorm(nn.Module):
    """The README example: Linear + bias + residual + LayerNorm."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.proj(x) + x)


class LinearSoftmax(nn.Module):
    def __init__(self, k, n, scale=0.125):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False)
        self.scale = scale

    def forward(self, x):
        return torch.softmax(self.proj(x) * self.scale, dim=-1)


class LinearLogSoftmax(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.proj = nn.Linear(k, n)

    def forward(self, x):
        return torch.log_softmax(self.proj(x).float(), dim=-1)


class RMSNorm(nn.Module):
    """As transformers writes it (LlamaRMSNorm): fp32 statistics, cast back, weight."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


class LinearRMSNorm(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False)
        self.norm = RMSNorm(n)

    def forward(self, x):
        return self.norm(self.proj(x))


class Conv1D(nn.Module):
    """GPT-2's Conv1D: addmm with a K x N weight."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Conv1DResidualLayerNorm(nn.Module):
    """GPT-2's c_proj (Conv1D) + the residual -> the next LayerNorm; the sum is returned too (the
    next block's residual)."""

    def __init__(self, k, n):
        super().__init__()
        self.c_proj = Conv1D(n, k)
        self.ln = nn.LayerNorm(n)

    def forward(self, x, residual):
        h = self.c_proj(x) + residual
        return self.ln(h), h


class GPT2MLP(nn.Module):
    """GPT-2's MLP block with its pre-norm and residual: ln -> c_fc -> gelu_new -> c_proj -> + x."""

    def __init__(self, d, hidden):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.c_fc = Conv1D(hidden, d)
        self.c_proj = Conv1D(d, hidden)

    def forward(self, x):
        h = self.c_fc(self.ln(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.c_proj(h)


class SwiGLU(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class NotFusable(nn.Module):
    """A GEMM followed only by ops outside the fusion domain, and a float32 GEMM."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.f32 = nn.Linear(d, d).float()

    def forward(self, x):
        y = self.proj(x).transpose(-1, -2).cumsum(-1)
        z = F.gelu(self.f32(x.float()))
        return y, z


class Elementwise(nn.Module):
    """Every elementwise op of the translator after one GEMM."""

    def __init__(self, k, n):
        super().__init__()
        self.proj = nn.Linear(k, n)
        self.gamma = nn.Parameter(torch.rand(n) + 0.5)

    def forward(self, x):
        h = self.proj(x)
        a = torch.sigmoid(h) * torch.tanh(h) - torch.relu(h) / 3.0
        b = torch.exp(-h.abs()) + torch.sqrt(h * h + 1.0) - torch.rsqrt(h * h + 2.0)
        c = torch.log(h * h + 1.5) * self.gamma + torch.reciprocal(h.abs() + 1.0) - (-h)
        d = F.silu(h) + torch.pow(h, 2.0) * 0.01 + (2.0 - h)
        return (a + b * c + d).to(torch.bfloat16)


class BatchedWeight(nn.Module):
    """bmm whose B is one matrix broadcast over the batch (a 2-D GEMM over flattened rows),
    and bmm with a per-batch B (a true batched GEMM)."""

    def __init__(self, k, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, n) * 0.05)

    def forward(self, x, y):
        shared = torch.bmm(x, self.w.expand(x.shape[0], -1, -1))
        per_batch = torch.bmm(x, y)
        return torch.relu(shared + 1.0), torch.relu(per_batch + 1.0)


class LlamaMLP(nn.Module):
    """transformers' LlamaMLP as it writes it (act_fn(gate_proj(x)) * up_proj(x) -> down_proj);
    mlp_bias and GeGLU (act="gelu") as its config allows."""

    def __init__(self, d, hidden, bias=False, act="silu"):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)
        self.act_fn = nn.SiLU() if act == "silu" else nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LinearMLP(nn.Module):
    """A plain two-Linear MLP with biases (BERT/ViT style): fc1 + bias + GELU -> fc2 + bias + x."""

    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class MLPKeepsHidden(nn.Module):
    """The hidden activation is returned too: S is stored, so no B2B kernel holds it in registers."""

    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        return self.fc2(h), h


class StackedGatedMLP(nn.Module):
    """Phi-3's MLP: one projection over the stacked gate and up weights, chunk(2, -1), the gate's
    activation times the other half, then down_proj. `up_first`: the up half comes first;
    `conv1d`: the projection is GPT-2's Conv1D (addmm, K x 2N weight, bias); `chunks`/`sizes`:
    the split (only two equal blocks are a gated GEMM)."""

    def __init__(self, d, hidden, act="silu", up_first=False, conv1d=False, bias=False, sizes=None, chunks=2):
        super().__init__()
        self.hidden, self.up_first, self.sizes, self.chunks = hidden, up_first, sizes, chunks
        width = sum(sizes) if sizes else chunks * hidden
        self.gate_up_proj = Conv1D(width, d) if conv1d else nn.Linear(d, width, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.act_fn = nn.SiLU() if act == "silu" else nn.GELU(approximate="tanh")

    def forward(self, x):
        h = self.gate_up_proj(x)
        parts = h.split(self.sizes, dim=-1) if self.sizes else h.chunk(self.chunks, dim=-1)
        gate, up = (parts[1], parts[0]) if self.up_first else (parts[0], parts[1])
        y = up * self.act_fn(gate)
        for extra in parts[2:]:
            y = y + extra
        return self.down_proj(y)
