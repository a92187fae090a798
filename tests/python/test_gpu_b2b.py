"""GPU tests of B2B pairs from the frontend (an sm_90 GPU; each skips with the reason elsewhere):
MLPs under torch.compile(backend="comfuse") with comfuse.config.b2b = "force" run ONE B2B kernel
for the pair (config.strict: a kernel error fails the test instead of falling back) and match
eager and the float32 module within bf16 tolerance; under "auto" whatever the core decides
matches too; a forced pair is captured and replayed in CUDA graphs (reduce-overhead).

    TEST_ARGS="-k b2b" bash scripts/gpu_python.sh build test
"""
import pytest
import torch

import comfuse

from conftest import randn, replay_in_user_graph
from test_gpu import assert_bf16_close, compiled_run, reference_f32
import modules as M

PAIRS = {
    "llama_mlp": (lambda: M.LlamaMLP(1024, 2816), (4, 256, 1024)),
    "llama_mlp_decode": (lambda: M.LlamaMLP(1024, 2816), (8, 1, 1024)),
    "geglu_bias": (lambda: M.LlamaMLP(1024, 2048, bias=True, act="gelu"), (2, 200, 1024)),
    "gpt2_mlp": (lambda: M.GPT2MLP(768, 3072), (4, 256, 768)),
    "linear_mlp_2d": (lambda: M.LinearMLP(1024, 4096), (600, 1024)),
}


def _model(make, dev):
    torch.manual_seed(0)
    return make().to(dev, torch.bfloat16).eval()


def the_pair(rep, built=True):
    """The report's one B2B pair, fused and called without fallback; `built`: its kernel was
    built (or loaded from the JIT cache) here, not served by the process's kernel cache."""
    pairs = [r for r in rep.regions if r.plan.get("kind") == "b2b"]
    assert len(pairs) == 1, str(rep)
    p = pairs[0]
    assert p.status == "fused", p.reason
    assert p.calls >= 1 and p.fallback_calls == 0, p.runtime_fallback
    if built:
        assert p.compiles, "no B2B kernel was built"
    return p


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_b2b_forced_pair_runs_one_kernel(gpu, case):
    make, shape = PAIRS[case]
    comfuse.config.b2b = "force"
    model = _model(make, gpu)
    x = randn(*shape, device=gpu, scale=0.5)
    out, rep = compiled_run(model, x)
    p = the_pair(rep)
    assert "b2b force" in p.reason
    with torch.no_grad():
        eager = model(x)
    assert_bf16_close(out, reference_f32(model, x))
    assert_bf16_close(out, eager)


@pytest.mark.parametrize("case", ["llama_mlp", "gpt2_mlp"])
def test_b2b_auto_matches_eager(gpu, case):
    """Whatever the core decides (one B2B kernel or the per-region path), the result is eager's."""
    make, shape = PAIRS[case]
    comfuse.config.b2b = "auto"
    model = _model(make, gpu)
    x = randn(*shape, device=gpu, scale=0.5)
    out, rep = compiled_run(model, x, always_fuse=False)
    with torch.no_grad():
        eager = model(x)
    assert_bf16_close(out, eager)
    first = next(r for r in rep.regions if "gate_proj" in r.root or "c_fc" in r.root)
    assert first.b2b, str(rep)  # the report says which and why


def test_b2b_forced_pair_under_cuda_graphs(gpu):
    """reduce-overhead (Inductor's CUDA graphs) and a user's torch.cuda.CUDAGraph: the B2B kernel
    built before capture is captured and replayed with new inputs."""
    comfuse.config.b2b = "force"
    comfuse.config.strict = True
    make, shape = PAIRS["llama_mlp"]
    model = _model(make, gpu)
    f = torch.compile(model, backend="comfuse", mode="reduce-overhead")
    with torch.no_grad(), comfuse.collecting() as rep:
        for step in range(4):  # warm-up (builds the kernel), record, replays
            x = randn(*shape, device=gpu, scale=0.5, seed=10 + step)
            out = f(x).clone()
            assert_bf16_close(out, model(x))
    the_pair(rep, built=False)  # an earlier test in this process may have built this kernel

    torch._dynamo.reset()
    comfuse.config.rest = "eager"
    f = torch.compile(model, backend="comfuse")
    x = randn(*shape, device=gpu, scale=0.5)
    replay_in_user_graph(f, x, [randn(*shape, device=gpu, scale=0.5, seed=seed) for seed in (1, 2)],
                         lambda y, x: assert_bf16_close(y, model(x)))
