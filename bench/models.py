"""Real models end to end: GPT-2, a Llama-style decoder (and Phi-3-mini's widths, `--arch phi3`:
its stacked gate_up_proj; Qwen3-8B's, `--arch qwen3`: its per-head q/k norms) from `transformers` configs with
random weights (bf16, nothing downloaded), checked against eager, then timed on the GPU:

    eager | torch.compile (Inductor default) | torch.compile max-autotune | backend="comfuse"

for prefill (batch x seq tokens, e.g. 8 x 1024) and decode (one token per sequence, batch
1..32, a StaticCache holding the prompt). Times are GPU-only: each variant's forward is
captured once in a CUDA graph and replayed back to back between CUDA events, all variants in
alternating rounds (median of 7), so Python and launch overhead are out of every number alike and
every variant meets the same clocks. max-autotune runs as
"max-autotune-no-cudagraphs" (the capture here is the CUDA graph). ComFuse kernels are built
before capture (a first call), as any kernel that a CUDA graph captures.

Per fused region, the kernel is timed against the same region unfused (its aten ops under
Inductor, and eager), on the tensors the model gave it.

    python bench/models.py [--out DIR] [--quick] [--layers N] [--arch gpt2,llama,phi3,qwen3] [--cases prefill,decode1]
writes DIR/RESULTS.md, DIR/results.json, DIR/speedups.png and prints every fusion report.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from comfuse import gpu_timing  # the GPU-only timing shared by the benchmarks and measure.py


# ---- models ---------------------------------------------------------------------------------
def config_of(arch: str, layers: int, small: bool):
    import transformers as tf

    if arch == "gpt2":
        if small:
            return tf.GPT2Config(n_layer=layers, n_embd=256, n_head=4, n_positions=2048, vocab_size=1024,
                                 bos_token_id=0, eos_token_id=0)
        # GPT-2 medium's width (1024, 16 heads, MLP 4096), a few layers.
        return tf.GPT2Config(n_layer=layers, n_embd=1024, n_head=16, n_positions=2048, vocab_size=50257)
    if arch == "llama":
        if small:
            return tf.LlamaConfig(num_hidden_layers=layers, hidden_size=256, intermediate_size=688,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                  max_position_embeddings=2048, bos_token_id=0, eos_token_id=0)
        # Llama-3-8B's widths (4096, GQA 32/8, SwiGLU 14336), a few layers.
        return tf.LlamaConfig(num_hidden_layers=layers, hidden_size=4096, intermediate_size=14336,
                              num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                              max_position_embeddings=4096, rope_theta=500000.0)
    if arch == "phi3":
        if small:
            return tf.Phi3Config(num_hidden_layers=layers, hidden_size=256, intermediate_size=688,
                                 num_attention_heads=4, num_key_value_heads=4, vocab_size=1024,
                                 max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        # Phi-3-mini's widths (3072, 32 heads, one qkv_proj, one gate_up_proj over the stacked
        # gate and up weights of 8192 each), a few layers.
        return tf.Phi3Config(num_hidden_layers=layers, hidden_size=3072, intermediate_size=8192,
                             num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                             max_position_embeddings=4096, pad_token_id=0)
    if arch == "qwen3":
        if small:
            return tf.Qwen3Config(num_hidden_layers=layers, hidden_size=256, intermediate_size=688,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
                                  max_position_embeddings=2048, bos_token_id=0, eos_token_id=0)
        # Qwen3-8B's widths (4096, GQA 32/8 of head_dim 128 with an RMSNorm on each head of q and
        # k, SwiGLU 12288), a few layers.
        return tf.Qwen3Config(num_hidden_layers=layers, hidden_size=4096, intermediate_size=12288,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                              max_position_embeddings=4096, rope_theta=1000000.0)
    raise ValueError(arch)


_MODELS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "phi3": "Phi3ForCausalLM",
           "qwen3": "Qwen3ForCausalLM"}


def build(arch: str, layers: int = 2, batch: int = 2, seq: int = 128, device="cuda", small: bool = False, seed: int = 0):
    """A model with random weights (bf16, eval) and random token ids [batch, seq]."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = config_of(arch, layers, small)
    cfg._attn_implementation = "sdpa"
    cls = getattr(tf, _MODELS[arch])
    model = cls(cfg).to(dtype=torch.bfloat16, device=device).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    return model, ids


class Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def set_cache_length(cache, length) -> None:
    """Point every layer of a StaticCache at `length` tokens (an int or a 1-element tensor): the next
    step writes slot `length` and attends to slots 0 .. length.

    transformers 5.x takes no `cache_position`: a StaticLayer keeps its own fill counter, a 0-d
    tensor `cumulative_length` (a static address, moved to the cache's device on first use); each
    forward writes its keys/values at slots counter .. counter + q_len - 1, adds q_len to it in place,
    and the model takes its positions (RoPE / wpe) and the causal mask's query offset from it. The
    counter is set in place (a copy_, capturable in a CUDA graph), so a replayed step stays where
    it was put instead of moving one slot on per call (and past max_cache_len)."""
    for layer in cache.layers:
        counter = getattr(layer, "cumulative_length", None)
        if not isinstance(counter, torch.Tensor):
            raise TypeError(f"{type(layer).__name__}: no tensor fill counter (not a full-attention StaticLayer)")
        if isinstance(length, torch.Tensor):
            counter.copy_(length.reshape(()))
        else:
            counter.fill_(length)


class Decode(torch.nn.Module):
    """One decode step at a fixed position of a StaticCache: every call (and every replay of a CUDA
    graph of it) writes the same slot `pos` and attends to slots 0 .. pos."""

    def __init__(self, model, cache):
        super().__init__()
        self.model = model
        self.cache = cache

    def forward(self, tok, pos):
        set_cache_length(self.cache, pos)
        return self.model(input_ids=tok, past_key_values=self.cache, position_ids=pos.view(1, -1),
                          use_cache=True).logits


def prefill_cache(model, cache, prompt) -> None:
    """Run the prompt [batch, seq] through the model into `cache` (positions 0 .. seq - 1)."""
    with torch.no_grad():
        set_cache_length(cache, 0)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)


def static_cache(model, prompt, max_len: int):
    """A StaticCache of `max_len` positions holding the prompt [batch, seq]."""
    import transformers as tf

    cache = tf.StaticCache(config=model.config, max_cache_len=max_len)
    prefill_cache(model, cache, prompt)
    return cache


# ---- timing ---------------------------------------------------------------------------------
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


# comfuse-max-autotune: backend="comfuse" with Inductor's max-autotune for the rest of the graph,
# the like-for-like rival of max-autotune (the target compares against it).
VARIANTS = ("eager", "comfuse", "inductor", "max-autotune", "comfuse-max-autotune")


def compiled(variant: str, module):
    import comfuse

    torch._dynamo.reset()
    if variant == "eager":
        return module
    if variant == "inductor":
        return torch.compile(module)
    if variant == "max-autotune":
        return torch.compile(module, mode="max-autotune-no-cudagraphs")
    if variant == "comfuse-max-autotune":
        return torch.compile(module, backend=comfuse.comfuse_backend, mode="max-autotune-no-cudagraphs")
    return torch.compile(module, backend=comfuse.comfuse_backend)


DEVICE = "cuda"


def bench_case(arch: str, phase: str, batch: int, seq: int, layers: int, variants, small: bool, reps: int,
               results: dict, log, deadline: float = 0) -> None:
    import comfuse

    model, ids = build(arch, layers=layers, batch=batch, seq=seq if phase == "prefill" else 16, small=small,
                       device=DEVICE)
    name = f"{arch} {phase} b{batch}" + (f"x{seq}" if phase == "prefill" else "")
    fresh = lambda: None  # noqa: E731
    if phase == "prefill":
        module, args = Prefill(model), (ids,)
    else:
        cache = static_cache(model, ids, max_len=64)
        tok = ids[:, -1:].contiguous()
        pos = torch.tensor([ids.shape[1]], device=ids.device)
        module, args = Decode(model, cache), (tok, pos)

        def fresh():
            # Each variant starts from the cache as the prompt left it (slot `pos` and the counter
            # are rewritten by every step, so replays see the same state).
            with torch.no_grad():
                cache.reset()
                prefill_cache(model, cache, ids)
    fresh()
    with torch.no_grad():
        ref = module(*args).float()
    row = {"case": name, "arch": arch, "phase": phase, "batch": batch, "seq": seq if phase == "prefill" else 1}
    # Each variant compiled, checked and captured in a CUDA graph; then all of them timed in
    # alternating rounds (gpu_timing: each round replays every graph, the order rotating), so
    # every ratio below compares variants that met the same clocks and power state. Timed one
    # after the other, max-autotune's own step read 0.271-0.293 ms across three runs of Phi-3's
    # decode (H100, bench/NOTES.md Stop 51): as much as the differences being measured.
    graphs, keep = {}, []  # keep: the compiled callables, whose kernels the graphs replay
    for v in variants:
        if deadline and time.time() > deadline:
            log(f"{name:28s} {v:13s} skipped (time budget spent)")
            continue
        comfuse.config.record_inputs = v == "comfuse"
        f = compiled(v, module)
        keep.append(f)
        fresh()
        t0 = time.perf_counter()
        with torch.no_grad(), comfuse.collecting() as rep:
            out = f(*args).float()
            torch.cuda.synchronize()
        row[f"{v}_first_call_s"] = time.perf_counter() - t0
        row[f"{v}_err"] = rel_err(out, ref)
        try:
            with torch.no_grad():
                graphs[v] = gpu_timing.capture(lambda i, f=f: f(*args))
        except Exception as e:  # a variant that cannot be captured is reported, not fatal
            row[f"{v}_ms"] = None
            row[f"{v}_error"] = f"{type(e).__name__}: {e}"[:300]
        if v == "comfuse":
            log(f"--- fusion report: {name}\n{rep}")
            row["regions"] = region_rows(rep, reps)
            row["fused_regions"] = sum(1 for r in rep.regions if r.status == "fused")
            row["region_count"] = len(rep.regions)
    if graphs:
        for v, ms in gpu_timing.alternating_rounds(graphs, rounds=7, reps=reps).items():
            row[f"{v}_ms"] = statistics.median(ms)
            row[f"{v}_ms_range"] = (min(ms), max(ms))
    for v in variants:
        if f"{v}_err" in row:
            log(f"{name:28s} {v:13s} err {row[f'{v}_err']:.2e}  "
                + (f"{row[f'{v}_ms']:.3f} ms" if row.get(f"{v}_ms") else f"FAILED {row.get(f'{v}_error')}"))
    del graphs, keep
    base = row.get("eager_ms")
    for v in variants:
        if row.get(f"{v}_ms") and base:
            row[f"{v}_speedup_vs_eager"] = base / row[f"{v}_ms"]
    for v in ("inductor", "max-autotune"):
        if row.get(f"{v}_ms") and row.get("comfuse_ms"):
            row[f"comfuse_vs_{v}"] = row[f"{v}_ms"] / row["comfuse_ms"]
    if row.get("max-autotune_ms") and row.get("comfuse-max-autotune_ms"):
        row["comfuse-max-autotune_vs_max-autotune"] = row["max-autotune_ms"] / row["comfuse-max-autotune_ms"]
    results["cases"].append(row)
    del model, module
    torch.cuda.empty_cache()


def fused_regions(rep) -> list:
    """(RegionInfo, RuntimeRegion) of each distinct fused region that recorded its inputs
    (identical layers: the first)."""
    from comfuse.kernels import REGISTRY

    out, seen = [], set()
    for info in rep.regions:
        rr = REGISTRY.get(info.id)
        if info.status != "fused" or rr is None or rr.last_inputs is None:
            continue
        key = (info.graph_text, info.n, info.k, str(info.m))
        if key not in seen:
            seen.add(key)
            out.append((info, rr))
    return out


def region_rows(rep, reps: int) -> list[dict]:
    """Each fused region: its kernel against its own aten ops, unfused (Inductor and eager)."""
    from comfuse.measure import inductor_region

    rows = []
    for info, rr in fused_regions(rep):
        tensors, sizes = rr.last_inputs
        ops = [o.split(":")[-1] for o in info.ops[1:]]
        row = {"region": info.root + (" + " + ", ".join(ops) if ops else ""),
               "m": tensors[0].numel() // info.k, "n": info.n, "k": info.k,
               "fused_est_us": info.fused_us, "unfused_est_us": info.unfused_us}
        sub = rr.subgraph
        try:
            # Inductor on the region's own aten graph (compile_fx, as the comfuse backend hands
            # Inductor the rest of a model), not torch.compile(sub): that counted no compiled graph
            # on the GPU (Dynamo's unique_graphs unchanged) and timed eager's kernels.
            args = rr.subgraph_args([t.detach() for t in tensors], sizes)
            ind = inductor_region(sub, args)
            # The three in alternating rounds (one power state each round): timed one after the
            # other, c_fc + gelu_new read 136 us fused against Inductor's 130, alternating 133
            # against 138 (bench/region_timing.py, bench/NOTES.md Stop 26).
            calls = {"fused": lambda: rr.run(tensors, sizes), "inductor": lambda: ind(*args),
                     "eager": lambda: sub(*args)}
            with torch.no_grad():
                graphs = {k: gpu_timing.capture(lambda i, f=f: f()) for k, f in calls.items()}
                for k, ms in gpu_timing.alternating_rounds(graphs, rounds=7, reps=reps).items():
                    row[f"{k}_us"] = 1e3 * statistics.median(ms)
            row["speedup_vs_inductor"] = row["inductor_us"] / row["fused_us"]
            row["speedup_vs_eager"] = row["eager_us"] / row["fused_us"]
            with torch.no_grad():  # weights require grad: outside no_grad the region runs unfused
                fused_out = rr.run(tensors, sizes)
                unfused_out = sub(*args)
                inductor_out = ind(*args)
            row["err_vs_eager"] = max(rel_err(a, b) for a, b in zip(fused_out, unfused_out))
            row["inductor_err_vs_eager"] = max(rel_err(a, b) for a, b in zip(inductor_out, unfused_out))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
    return rows


# ---- output ---------------------------------------------------------------------------------
def write_results(results: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    lines = ["# ComFuse on real models (bench/models.py)", "",
             f"GPU: {results['gpu']}; torch {results['torch']}; transformers {results['transformers']}; "
             f"{results['layers']} layer(s); GPU-only times (CUDA graph replay), median of rounds.", "",
             "## Whole model", "",
             "| case | eager ms | inductor ms | max-autotune ms | comfuse ms | comfuse vs eager | vs inductor | vs max-autotune | "
             "comfuse + max-autotune ms | its vs max-autotune | fused / regions (GEMM, attention) | max rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, p=3):
        return "-" if v is None else f"{v:.{p}f}"

    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    for r in results["cases"]:
        errs = [r.get(f"{v}_err") for v in VARIANTS if r.get(f"{v}_err") is not None]
        lines.append(f"| {r['case']} | {f(r.get('eager_ms'))} | {f(r.get('inductor_ms'))} | {f(r.get('max-autotune_ms'))} | "
                     f"{f(r.get('comfuse_ms'))} | {x(r.get('comfuse_speedup_vs_eager'))} | "
                     f"{x(r.get('comfuse_vs_inductor'))} | {x(r.get('comfuse_vs_max-autotune'))} | "
                     f"{f(r.get('comfuse-max-autotune_ms'))} | {x(r.get('comfuse-max-autotune_vs_max-autotune'))} | "
                     f"{r.get('fused_regions', '-')}/{r.get('region_count', '-')} | "
                     + (f"{max(errs):.2e}" if errs else "-") + " |")
    lines += ["", "## Fused regions (kernel vs the same ops unfused)", "",
              "| case | region | M x N x K | fused us | inductor us | eager us | vs inductor | vs eager | planner fused/unfused us | note |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["cases"]:
        for g in r.get("regions", []):
            lines.append(f"| {r['case']} | {g['region']} | {g['m']}x{g['n']}x{g['k']} | {f(g.get('fused_us'), 1)} | "
                         f"{f(g.get('inductor_us'), 1)} | {f(g.get('eager_us'), 1)} | {x(g.get('speedup_vs_inductor'))} | "
                         f"{x(g.get('speedup_vs_eager'))} | {f(g.get('fused_est_us'), 1)}/{f(g.get('unfused_est_us'), 1)} | "
                         f"{g.get('error', '')} |")
    with open(os.path.join(out, "RESULTS.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    try:
        plot(results, os.path.join(out, "speedups.png"))
    except Exception as e:  # matplotlib missing: the numbers still stand
        print(f"plot skipped: {e}")


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    regions = [(r["case"], g) for r in cases for g in r.get("regions", []) if g.get("speedup_vs_inductor")]
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [max(2, len(cases)), max(1, len(regions))]})
    ax = axes[0]
    width = 0.27
    xs = range(len(cases))
    for i, (v, label) in enumerate((("comfuse_speedup_vs_eager", "vs eager"), ("comfuse_vs_inductor", "vs Inductor"),
                                    ("comfuse_vs_max-autotune", "vs max-autotune"))):
        ax.bar([x + (i - 1) * width for x in xs], [r.get(v) or 0 for r in cases], width, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["case"] for r in cases], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("speedup of backend=comfuse (x)")
    ax.set_title("whole model")
    ax.legend()
    ax = axes[1]
    if regions:
        xs = range(len(regions))
        ax.bar([x - 0.2 for x in xs], [g["speedup_vs_inductor"] for _, g in regions], 0.4, label="vs Inductor")
        ax.bar([x + 0.2 for x in xs], [g["speedup_vs_eager"] for _, g in regions], 0.4, label="vs eager")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{c}\n{g['region'][:40]}\n{g['m']}x{g['n']}x{g['k']}" for c, g in regions],
                           rotation=45, ha="right", fontsize=6)
        ax.legend()
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_title("fused regions (kernel vs the same ops unfused)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--arch", default="gpt2,llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="one prefill and two decode batches per model")
    ap.add_argument("--small", action="store_true", help="tiny widths (a smoke test of the script)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=0, help="start no new case after this many seconds (0: no limit)")
    ap.add_argument("--cases", default="", help="only these cases, e.g. prefill,decode1 (default: all)")
    args = ap.parse_args(argv)
    start = time.time()

    import comfuse
    import transformers

    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "models.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    if not torch.cuda.is_available() or not comfuse.gpu_available()[0]:
        log(f"bench/models.py needs an sm_90 GPU: {comfuse.gpu_available()[1]}")
        return 2
    comfuse.config.strict = False

    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
               "layers": args.layers, "cases": []}
    variants = args.variants.split(",")
    decode_batches = (1, 32) if args.quick else (1, 4, 16, 32)
    archs = args.arch.split(",")
    for ai, arch in enumerate(archs):
        cases = [("prefill", 8, 1024)] + [("decode", b, 0) for b in decode_batches]
        if args.cases:
            wanted = set(args.cases.split(","))
            cases = [c for c in cases if (c[0] if c[0] == "prefill" else f"decode{c[1]}") in wanted]
        # Each model gets its share of what is left of the budget.
        arch_start = time.time()
        left = args.budget_s - (arch_start - start)
        deadline = arch_start + left / (len(archs) - ai) if args.budget_s else 0
        for phase, batch, seq in cases:
            if deadline and time.time() > deadline:
                log(f"{arch} {phase} b{batch}: skipped (time budget of {args.budget_s:.0f} s spent)")
                continue
            try:
                bench_case(arch, phase, batch, seq, args.layers, variants, args.small, args.reps, results, log, deadline)
            except Exception as e:
                import traceback

                log(f"{arch} {phase} b{batch}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")
            write_results(results, args.out)
    log(open(os.path.join(args.out, "RESULTS.md")).read() if os.path.exists(os.path.join(args.out, "RESULTS.md")) else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
