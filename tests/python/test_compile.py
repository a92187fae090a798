"""torch.compile(backend="comfuse") end to end on the CPU. Fused kernels need an sm_90 GPU;
here the documented behaviour is checked: regions the planner would fuse are reported as
"fusable" with the reason ("no sm_90 GPU ...") and the graph runs through Inductor unfused; with
config.force_regions the custom op goes into the graph (its fake implementation feeds
Inductor) and runs the region's aten ops."""
import operator

import pytest
import torch

import comfuse
from comfuse.kernels import REGISTRY

from conftest import close, compile_vs_eager as run, randn
import modules as M


@pytest.fixture(autouse=True)
def always_fuse():
    """These tests are about what happens to a region the planner accepts, not its estimate."""
    comfuse.config.min_gain = -1e9


def test_cpu_regions_are_reported_and_run_unfused():
    comfuse.config.rest = "eager"
    out, ref, rep = run(M.LinearLayerNorm(1024, 1024), randn(4, 512, 1024))
    close(out, ref)
    (r,) = rep.regions
    if comfuse.gpu_available()[0]:
        pytest.skip("this machine has an sm_90 GPU")
    assert r.status == "fusable"
    assert "not fused here: no sm_90 GPU" in r.reason
    assert r.calls == 0  # not rewritten: nothing of ComFuse runs
    assert "fusable but not fused here" in rep.summary()


def test_nothing_fused_goes_to_inductor_whole(inductor_graphs):
    """Where no region fuses, Inductor gets Dynamo's graph itself (as torch.compile's own backend
    does), not our AOTAutograd output: that second pass ran Llama decode 4% slower with nothing
    fused. The report still lists every region with its decision."""
    if comfuse.gpu_available()[0]:
        pytest.skip("this machine has an sm_90 GPU: the region would fuse")
    comfuse.config.rest = "inductor"
    out, ref, rep = run(M.LinearLayerNorm(256, 512), randn(2, 96, 256))
    close(out, ref)
    (g,) = rep.graphs
    assert g.note.startswith("nothing fused"), g.note
    (r,) = rep.regions
    assert r.status == "fusable" and r.calls == 0
    (gm,) = inductor_graphs
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(isinstance(t, torch._ops.OpOverload) for t in targets), targets  # Dynamo's graph, not aten


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_forced_region_goes_through_the_custom_op(rest):
    comfuse.config.force_regions = True
    comfuse.config.rest = rest
    model = M.LinearLayerNorm(256, 512)
    x = randn(2, 96, 256)
    out, ref, rep = run(model, x)
    close(out, ref)
    (r,) = rep.regions
    assert r.status in ("fused", "fusable")
    assert r.calls == 1
    if not comfuse.gpu_available()[0]:
        assert r.fallback_calls == 1 and "no sm_90 GPU" in r.runtime_fallback
    assert r.id in REGISTRY


def test_2d_input_as_gemm_operand_and_residual():
    """x [M, K] is the GEMM's A and the residual (no view between them in a 2-D graph): one FX value,
    two kernel inputs; the region's subgraph takes it twice (unique placeholder names)."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    comfuse.config.min_gain = -1e9
    model = M.LinearResidualLayerNorm(256)
    out, ref, rep = run(model, randn(192, 256))
    close(out, ref)
    assert any(r.calls == 1 for r in rep.regions), str(rep)


def test_graph_has_the_custom_op_and_no_region_ops():
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    seen = {}

    def spy(gm, ex, **kw):
        from torch._dynamo.backends.common import aot_autograd
        from comfuse.backend import _boxed, rewrite
        from comfuse.report import GraphReport

        def inference(agm, ex2):
            rewrite(agm, GraphReport(0))
            seen["targets"] = [n.target for n in agm.graph.nodes if n.op == "call_function"]
            return _boxed(agm)

        return aot_autograd(fw_compiler=inference, inference_compiler=inference)(gm, ex)

    model = M.GPT2MLP(256, 1024).to(torch.bfloat16).eval()
    x = randn(4, 128, 256)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=spy)(x)
    close(out, ref)
    t = seen["targets"]
    assert torch.ops.comfuse.fused.default in t
    assert torch.ops.aten.tanh.default not in t  # gelu_new went into the region
    assert operator.getitem in t


def test_several_outputs_and_outside_users():
    """A region value used inside and outside the region becomes an extra output."""

    class TwoUsers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(256, 512)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.proj(x))
            return torch.softmax(h, -1), h.cumsum(-1)

    comfuse.config.force_regions = True
    comfuse.config.rest = "inductor"
    out, ref, rep = run(TwoUsers(), randn(3, 64, 256))
    close(out, ref, tol=5e-2)
    (r,) = rep.regions
    assert r.calls == 1


def test_dynamic_shapes_and_one_region_per_graph():
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    model = M.LinearSoftmax(128, 256).to(torch.bfloat16).eval()
    f = torch.compile(model, backend="comfuse", dynamic=True)
    with torch.no_grad(), comfuse.collecting() as rep:
        for rows in (17, 64, 5):
            x = randn(rows, 128)
            close(f(x), model(x))
    assert len(rep.graphs) == 1, "a dynamic graph must not recompile per M"
    assert rep.graphs[0].dynamic
    (r,) = rep.regions
    assert r.calls == 3


def test_training_graph_is_not_partitioned():
    comfuse.config.rest = "eager"
    model = M.LinearGelu(64, 128).to(torch.bfloat16)
    x = randn(4, 64).requires_grad_(True)
    with comfuse.collecting() as rep:
        y = torch.compile(model, backend="comfuse")(x)
        y.float().sum().backward()
    assert x.grad is not None
    assert "needs gradients" in rep.graphs[0].note
    assert all(r.status == "fallback" and "gradients" in r.reason for r in rep.regions)


def test_fuse_a_function():
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    w = randn(512, 256, scale=0.05)
    b = randn(512)

    @comfuse.fuse
    def f(x):
        return torch.nn.functional.silu(x @ w.t() + b) * 2.0

    x = randn(100, 256)
    with torch.no_grad(), comfuse.collecting() as rep:
        close(f(x), torch.nn.functional.silu(x @ w.t() + b) * 2.0)
    (r,) = rep.regions
    assert [o.split(":")[-1] for o in r.ops] == ["mm", "add", "silu", "mul"]


def test_explain_names_modules_and_reasons():
    model = torch.nn.Sequential(M.LinearLayerNorm(1024, 1024), M.NotFusable(1024)).to(torch.bfloat16).eval()
    model[1].f32.float()
    rep = comfuse.explain(model, randn(4, 512, 1024))
    text = str(rep)
    assert "0.proj:addmm + 0.norm:native_layer_norm" in text
    assert "1.proj:addmm" in text and "1.f32:addmm" in text
    assert "bf16 or f16" in text
    assert "GEMM M=2048 N=1024 K=1024 bf16" in text
    statuses = {r.root: r.status for r in rep.regions}
    first = next(r for r in rep.regions if r.root == "0.proj:addmm")
    assert first.status in ("fused", "fusable") or first.reason.startswith("no predicted gain"), first.reason
    assert statuses["1.f32:addmm"] == "fallback"


def test_unsupported_ops_fall_back_never_crash():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)
            self.b = torch.nn.Linear(64, 64)

        def forward(self, x, mask):
            h = self.a(x)
            h = torch.where(mask, h, -h)                    # where: outside the domain
            g = self.b(x).clamp(-1, 1).to(torch.int32)      # an integer cast
            t = h * torch.tensor(2.0, dtype=torch.bfloat16)  # a 0-d tensor operand
            return t, g

    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"  # Inductor's own CPU path is covered above; its C++ build of this graph is slow
    x = randn(8, 64)
    mask = torch.rand(8, 64) > 0.5
    out, ref, rep = run(Odd(), x, mask)
    close(out[0], ref[0])
    assert torch.equal(out[1], ref[1])
    reasons = " ".join(e.reason for r in rep.regions for e in r.excluded) + " ".join(r.reason for r in rep.regions)
    assert "outside the fusion domain" in reasons


def test_report_of_the_process():
    comfuse.config.rest = "eager"
    run(M.LinearGelu(64, 128), randn(4, 64))
    assert comfuse.last_report().graphs
    assert "GEMM region" in comfuse.last_report().summary()


class _CacheUpdate(torch.nn.Module):
    """A GEMM + LayerNorm region whose output goes into a buffer in place, as a StaticCache's
    update does."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 512)
        self.norm = torch.nn.LayerNorm(512)
        self.register_buffer("cache", torch.zeros(2, 64, 512, dtype=torch.bfloat16))

    def forward(self, x, pos):
        h = self.norm(self.proj(x))  # [2, 1, 512]
        self.cache.index_copy_(1, pos, h)
        return self.cache.sum(1)


def test_input_mutations_stay_in_the_graph_inductor_gets(inductor_graphs):
    """A buffer the model updates in place stays a copy_ into the graph's input in what Inductor
    gets (AOTAutograd's keep_inference_input_mutations, as Inductor's own backend asks), which
    Inductor turns back into the in-place update. Returned as an extra output instead, the
    AOTAutograd wrapper copied the whole buffer every call: a 256 MB cache on the CPU took 172 ms
    a call against Inductor's 0.1-0.7 (bench/NOTES.md Stop 37)."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "inductor"
    model = _CacheUpdate().to(torch.bfloat16).eval()
    ref_model = _CacheUpdate().to(torch.bfloat16).eval()
    ref_model.load_state_dict(model.state_dict())
    x, pos = randn(2, 1, 256), torch.tensor([5])
    f = torch.compile(model, backend="comfuse")
    with torch.no_grad(), comfuse.collecting() as rep:
        out = f(x, pos)
        ref = ref_model(x, pos)
    close(out, ref)
    close(model.cache, ref_model.cache)  # the update reached the module's own buffer
    (r,) = rep.regions
    assert r.calls == 1, r.reason  # the rewrite path: the region is the custom op's
    (gm,) = inductor_graphs
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    copies = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders]
    assert len(copies) == 1, gm.graph
