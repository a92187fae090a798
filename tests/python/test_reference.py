"""The translated ComFuse graph on the C++ fp64 reference executor (and through Φ's Fusion
Specs) against the region's aten ops in torch float64 on the CPU, on random inputs (never
zeros), at ragged shapes (M, N not multiples of any tile)."""
import pytest
import torch

from comfuse import reference as R
from comfuse.capture import capture

from conftest import randn
import modules as M

CASES = {
    "bias_gelu": (lambda: M.LinearGelu(72, 520), (3, 101, 72)),
    "bias_gelu_tanh": (lambda: M.LinearGelu(64, 264, "tanh"), (303, 64)),
    "layer_norm": (lambda: M.LinearLayerNorm(72, 520), (3, 101, 72)),
    "softmax": (lambda: M.LinearSoftmax(136, 392), (5, 37, 136)),
    "log_softmax_f32": (lambda: M.LinearLogSoftmax(64, 200), (2, 77, 64)),
    "rms_norm": (lambda: M.LinearRMSNorm(96, 344), (299, 96)),
    "gpt2_mlp": (lambda: M.GPT2MLP(64, 256), (3, 45, 64)),
    "elementwise": (lambda: M.Elementwise(64, 136), (2, 61, 64)),
}


def _check(c, values):
    got = R.comfuse_fp64(c, values)
    lowered = R.lowered_fp64(c, values)
    ref = R.eager_fp64(c, values)
    assert set(got) == set(ref) and got
    for name, r in ref.items():
        dtype = c.translator.outputs[[o.name for o in c.translator.outputs].index(name)].meta["val"].dtype
        assert r.abs().max() > 0 and torch.isfinite(r).all()
        for what, x in (("graph executor", got[name]), ("lowered (Fusion Spec) executor", lowered[name])):
            diff = (x - r).abs()
            # fp64 on both sides, rounded at the same casts and outputs: equal up to a rounding
            # flipped by reassociation (one unit in the last place of the stored dtype).
            tol = R.ulp(dtype, r) * 1.01 + 1e-12
            assert (diff <= tol).all(), f"{name} ({what}): max diff {diff.max().item()}"
            assert (diff > 1e-9).float().mean() < 0.01, f"{name} ({what}): too many rounding differences"


@pytest.mark.parametrize("case", sorted(CASES))
def test_translation_matches_torch_fp64(case):
    make, shape = CASES[case]
    torch.manual_seed(hash(case) % 1000)
    model = make().to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():  # random, nonzero weights and vectors
            p.copy_(randn(*p.shape, scale=0.2 if p.dim() > 1 else 1.0, offset=0.0 if p.dim() > 1 else 0.3,
                          seed=p.numel() % 997))
    cap = capture(model, randn(*shape, offset=0.1, seed=7))
    checked = 0
    for c in cap.candidates:
        if c.translator is None or len(c.nodes) < 2:
            continue
        _check(c, cap.values)
        checked += 1
    assert checked >= 1


def test_residual_translation_when_phi_takes_it():
    """A residual add translates as an [M, N] graph input; the graph executor runs it whatever
    Φ decides (so the translation itself is checked today)."""
    model = M.LinearResidualLayerNorm(136).to(torch.bfloat16).eval()
    cap = capture(model, randn(3, 41, 136, offset=0.2))
    c = cap.by_root("proj")
    from comfuse.capture import Candidate
    from comfuse.translate import Translator, descendants_of

    full = [n for n in cap.gm.graph.nodes if n.name in ("addmm", "view_1", "add", "native_layer_norm", "getitem")]
    tr = Translator(c.root, full, descendants_of(c.root))
    tr.translate()
    assert "input in3: bf16[M, N]" in tr.g.text() or "bf16[M, N]" in tr.g.text()
    _check(Candidate(c.root, full, tr, None, c.info), cap.values)
