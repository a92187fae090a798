"""transformers models (random weights from a config, tiny widths) through the backend on the
CPU: prefill and a StaticCache decode step match eager, and the report names the regions by
the model's module paths (GPT-2's MLP: Conv1D = addmm with a K x N weight, then gelu_new)."""
import pytest
import torch

import comfuse

transformers = pytest.importorskip("transformers")
import bench_models  # noqa: E402


@pytest.mark.parametrize("arch", ["gpt2", "llama", "phi3"])
def test_prefill_and_decode_match_eager(arch):
    comfuse.config.force_regions = True  # fusable regions go through the custom op (its aten fallback here)
    comfuse.config.rest = "eager"
    mod, model, ids, rep = bench_models.compiled_prefill_matches_eager(arch)
    roots = [r.root for r in rep.regions]
    if arch == "gpt2":
        fc = next(r for r in rep.regions if r.root == "model.transformer.h.0.mlp.c_fc:addmm")
        assert fc.layout == "kn"
        assert [o.split(":")[-1] for o in fc.ops[1:]] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
        assert "model.transformer.h.1.attn.c_attn:addmm" in roots
    elif arch == "phi3":
        # One projection over the stacked gate and up weights, chunk(2, -1): its two halves are
        # one gated GEMM (translate.Halves), silu(gate) * up its epilogue.
        gu = next(r for r in rep.regions if r.root == "model.model.layers.0.mlp.gate_up_proj:mm")
        assert [o.split(":")[-1] for o in gu.ops[1:]] == ["split", "silu", "mul"], gu.ops
        assert gu.status == "fusable" and "GEMM of 1376 columns" in gu.reason, gu.reason
        assert "input b3" in gu.graph_text
    else:
        assert "model.model.layers.0.mlp.gate_proj:mm" in roots
        gate = next(r for r in rep.regions if r.root == "model.model.layers.0.mlp.gate_proj:mm")
        assert any("silu" in o for o in gate.ops)
    text = str(rep)
    assert "lm_head" in text

    torch._dynamo.reset()
    cache = mod.static_cache(model, ids, 64)
    tok, pos = ids[:, -1:].contiguous(), torch.tensor([ids.shape[1]])
    dec = mod.Decode(model, cache)

    def fresh():
        cache.reset()
        mod.prefill_cache(model, cache, ids)

    with torch.no_grad():
        fresh()
        ref = dec(tok, pos)
        fresh()
        with comfuse.collecting() as rep:
            f = torch.compile(dec, backend="comfuse")
            out = f(tok, pos)
            f(tok, pos)
    assert mod.rel_err(out, ref) < 1e-6
    assert len(rep.graphs) == 1


def test_llama_norm_stored_once():
    """Llama's residual + RMSNorm regions (o_proj, down_proj) store the normed value once, though
    q/k/v (gate/up) each read it through a view of its own: one output per value, the views run
    again on the kernel's output (each extra tile output took SMEM from the mainloop's ring and
    priced the fused 8192 x 4096 x 14336 kernel at 2.3x the unfused path)."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    comfuse.config.min_gain = -100.0  # every region through the custom op (its aten fallback here)
    rep = bench_models.compiled_prefill_matches_eager("llama")[3]
    for root in ("layers.0.self_attn.o_proj:mm", "layers.0.mlp.down_proj:mm", "layers.1.self_attn.o_proj:mm"):
        r = next(r for r in rep.regions if r.root == "model.model." + root)
        assert r.status == "fusable", (root, r.status, r.reason)
        assert r.graph_text.count("\noutput ") == 2, r.graph_text  # h and the normed h, once each
