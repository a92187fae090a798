"""More transformers architectures on the CPU (tiny configs, random weights, bf16): BERT (a
post-norm encoder), OPT, GPT-NeoX (parallel residual), Gemma (GeGLU, RMSNorm with
1 + w), Qwen2 and Mistral (Llama-style), T5's encoder (RMSNorm without mean, ReLU MLP), Phi-3
(stacked gate_up_proj), and the decoders listed at ARCHS' second half (sandwich norms, q/k norms
over the whole projection or per head, scaled residuals, parallel residuals). Under backend="comfuse" with the single-GEMM kernels emulated on the fp64
executor (test_runtime_glue's `emulate`: the translated graphs compute, not the aten fallback),
each model's output matches eager within bf16 noise, nothing raises, and the regions named below
(the projection that closes each residual branch, with its norm, the MLP's first GEMM with its
activation, q_proj and k_proj with their per-head norms: PER_HEAD_NORMS, and with their rotary
embeddings: ROPE) run through the kernel path in every layer; where RoPE stays out (partial rotary,
OLMo 2's whole-row q/k norms), the reason says why (ROPE_REFUSED). Attention stays unfused here
(its kernel is not emulated; test_attention.py covers its translation)."""
import re

import pytest
import torch

import comfuse

from conftest import close
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)

tf = pytest.importorskip("transformers")

H, I, L = 128, 344, 2


def _llama_like(config, **kw):
    """A decoder config of the shared Llama-style fields at the tiny widths."""
    return config(**{**dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=2,
                            intermediate_size=I, vocab_size=512, pad_token_id=0, bos_token_id=0, eos_token_id=0), **kw})


ARCHS = {
    # name: (model factory, the roots (module paths) whose region runs fused in every layer)
    "bert": (lambda: tf.BertModel(tf.BertConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                intermediate_size=I, vocab_size=512)),
             ["attention.output.dense", "intermediate.dense", "output.dense"]),
    "opt": (lambda: tf.OPTForCausalLM(tf.OPTConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                   ffn_dim=I, vocab_size=512, word_embed_proj_dim=H)),
            ["self_attn.out_proj", "fc1", "fc2"]),
    "gpt_neox": (lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=H, num_hidden_layers=L,
                                                                num_attention_heads=2, intermediate_size=I,
                                                                vocab_size=512)),
                 ["attention.dense", "mlp.dense_h_to_4h"]),
    "gemma": (lambda: tf.GemmaForCausalLM(tf.GemmaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                         num_key_value_heads=1, head_dim=64, intermediate_size=I,
                                                         vocab_size=512)),
              ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "qwen2": (lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                         num_key_value_heads=1, intermediate_size=I,
                                                         vocab_size=512)),
              ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "mistral": (lambda: tf.MistralForCausalLM(tf.MistralConfig(hidden_size=H, num_hidden_layers=L,
                                                               num_attention_heads=2, num_key_value_heads=1,
                                                               intermediate_size=I, vocab_size=512)),
                ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "t5_encoder": (lambda: tf.T5EncoderModel(tf.T5Config(d_model=H, num_layers=L, num_heads=2, d_ff=I, d_kv=64,
                                                         vocab_size=512)),
                   ["SelfAttention.o", "DenseReluDense.wi", "DenseReluDense.wo"]),
    # Sandwich norms (Gemma 2 and 3, OLMo 2: the norm after each branch, before the residual add),
    # OLMo 2's q/k norms over the whole projection, Qwen 3, Granite (scaled residuals), StableLM
    # and Starcoder 2 (LayerNorm), and the parallel residual of Falcon, GPT-J and Phi (the MLP's
    # output and the attention's meet in one add after the attention's projection). Qwen 3's and
    # Gemma 3's per-head q/k norms (over each head's columns: segmented reductions, Gemma 3's after
    # the transpose of the heads) join q_proj and k_proj (PER_HEAD_NORMS), as Cohere's per-head LayerNorms do.
    "gemma2": (lambda: tf.Gemma2ForCausalLM(_llama_like(tf.Gemma2Config, head_dim=64)),
               ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "gemma3": (lambda: tf.Gemma3ForCausalLM(_llama_like(tf.Gemma3TextConfig, head_dim=64)),
               ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "olmo2": (lambda: tf.Olmo2ForCausalLM(_llama_like(tf.Olmo2Config)),
              ["self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "qwen3": (lambda: tf.Qwen3ForCausalLM(_llama_like(tf.Qwen3Config, head_dim=64)),
              ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "granite": (lambda: tf.GraniteForCausalLM(_llama_like(tf.GraniteConfig)),
                ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "stablelm": (lambda: tf.StableLmForCausalLM(_llama_like(tf.StableLmConfig)),
                 ["self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]),
    "starcoder2": (lambda: tf.Starcoder2ForCausalLM(_llama_like(tf.Starcoder2Config)),
                   ["self_attn.o_proj", "mlp.c_fc", "mlp.c_proj"]),
    "falcon": (lambda: tf.FalconForCausalLM(tf.FalconConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                            vocab_size=512, new_decoder_architecture=False)),
               ["self_attention.dense", "mlp.dense_h_to_4h"]),
    "gptj": (lambda: tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=H, n_layer=L, n_head=2, vocab_size=512, rotary_dim=32,
                                                      n_inner=I)),
             ["attn.out_proj", "mlp.fc_in"]),
    "phi": (lambda: tf.PhiForCausalLM(_llama_like(tf.PhiConfig)), ["self_attn.dense", "mlp.fc1"]),
    # Cohere: the parallel residual, LayerNorm without bias, per-head q/k LayerNorms (use_qk_norm).
    "cohere": (lambda: tf.CohereForCausalLM(_llama_like(tf.CohereConfig, use_qk_norm=True)), ["mlp.gate_proj"]),
    "phi3": (lambda: tf.Phi3ForCausalLM(tf.Phi3Config(hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                                                      num_key_value_heads=2, intermediate_size=I, vocab_size=512,
                                                      pad_token_id=0, bos_token_id=0, eos_token_id=0)),
             ["self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]),
}


# The projections whose per-head norm (per-segment reductions: segments.py) fuses with them;
# Cohere's is a LayerNorm over each head with a weight per head ([H, D]: a row of N).
PER_HEAD_NORMS = {"cohere": ["self_attn.q_proj", "self_attn.k_proj"], "qwen3": ["self_attn.q_proj", "self_attn.k_proj"], "gemma3": ["self_attn.q_proj", "self_attn.k_proj"]}

# The projections whose rotary embeddings (transformers' apply_rotary_pos_emb: rotate_half over each
# head and cos/sin read periodically, segments.py) fuse with them, after the per-head norm in Qwen 3
# and Gemma 3; k_proj with one key head (Gemma, Qwen 2, Mistral here) rotates its whole row. Cohere's
# interleaved pairs (its rotate_half: stack((-x2, x1), -1).flatten(-2), in float32) are one
# rotate_pairs, after its per-head LayerNorm (weight [H, D]: a row of N).
ROPE = {arch: ["self_attn.q_proj", "self_attn.k_proj"]
        for arch in ("cohere", "gemma", "gemma2", "gemma3", "granite", "mistral", "qwen2", "qwen3", "starcoder2")}
INTERLEAVED = {"cohere"}  # rotate_pairs (slices, neg, stack and its flattening view) in place of rotate_half
# Where RoPE stays out of q_proj's region, the reason's words: partial rotary (Phi's, StableLM's,
# GPT-J's rotary_dim: a part of each head rotates; GPT-J's pairs are interleaved, as Cohere's), OLMo
# 2's norm over the whole projection.
ROPE_REFUSED = {"phi": ("self_attn.q_proj", "partial rotary"), "stablelm": ("self_attn.q_proj", "partial rotary"),
                "gptj": ("attn.q_proj", "partial rotary"), "olmo2": ("self_attn.q_proj", "reduces whole rows")}


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_architecture_runs_its_regions_fused_and_matches_eager(emulate, arch, monkeypatch):
    from comfuse import attention

    monkeypatch.setattr(attention, "find", lambda gm, next_id: [])
    make, roots = ARCHS[arch]
    roots = list(dict.fromkeys(roots + PER_HEAD_NORMS.get(arch, []) + ROPE.get(arch, [])))
    torch.manual_seed(0)
    model = Logits(make()).to(torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 24))
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(ids)
        out = torch.compile(model, backend="comfuse")(ids)
    close(out, ref, tol=5e-2)
    ran = {r.root.split(":")[0] for r in rep.regions if r.calls}
    for layer in range(L):
        for root in roots:
            pattern = rf"\.{layer}\.(layer\.\d+\.)?{re.escape(root)}$"  # T5: block.<layer>.layer.<k>.<root>
            assert any(re.search(pattern, r) for r in ran), (root, layer, sorted(ran), str(rep))
    assert all(r.fallback_calls == 0 for r in rep.regions), str(rep)
    for r in rep.regions:  # the per-head norm in its projection's region, where that runs
        if r.calls and any(r.root.split(":")[0].endswith(p) for p in PER_HEAD_NORMS.get(arch, [])):
            assert {"mean", "rsqrt"} <= {op.split(":")[-1].split(" ")[0] for op in r.ops}, (r.root, r.ops)
    rope = [r for r in rep.regions if r.calls and any(r.root.split(":")[0].endswith(p) for p in ROPE.get(arch, []))]
    assert len(rope) == (2 * L if arch in ROPE else 0), str(rep)
    kind, other, join = ("rotate_pairs", "rotate_half", "stack") if arch in INTERLEAVED else \
        ("rotate_half", "rotate_pairs", "cat")
    for r in rope:  # RoPE in the projection's region: one rotate_half (or rotate_pairs), cos and sin multiplied
        ops = {op.split(":")[-1].split(" ")[0] for op in r.ops}
        assert {"slice", "neg", join, "mul", "add"} <= ops, (r.root, r.ops)
        g = comfuse._core.parse_graph(r.graph_text)
        kinds = [g.node(i)["kind"] for i in range(len(g))]
        assert kinds.count(kind) == 1 and other not in kinds, r.graph_text
    if arch in ROPE_REFUSED:
        proj, why = ROPE_REFUSED[arch]
        qs = [r for r in rep.regions if r.root.split(":")[0].endswith(proj)]
        assert qs and all(any(why in e.reason for e in r.excluded) for r in qs), \
            [(r.root, [e.reason for e in r.excluded]) for r in qs]
