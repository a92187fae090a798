"""Capture without compiling: the aten graph of a model, its candidate regions and decisions,
and every FX node's value on the example inputs (for tests and for checking a translation
with comfuse.reference). Nothing is rewritten and no kernel is built."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import attention
from .backend import _boxed
from .kernels import next_region_id
from .pair import PairCandidate, form_pairs
from .partition import Candidate, decide, find_regions


@dataclass
class Capture:
    gm: fx.GraphModule | None = None
    candidates: list[Candidate] = field(default_factory=list)  # fused B2B pairs in place of their members
    pairs: list[PairCandidate] = field(default_factory=list)   # every B2B pair considered, fused or not
    attentions: list[attention.AttentionCandidate] = field(default_factory=list)  # every SDPA op, decided
    values: dict = field(default_factory=dict)   # FX node name -> value on the example inputs

    def by_root(self, needle: str) -> Candidate:
        """The candidate whose root's where() contains `needle` (e.g. a module path)."""
        found = [c for c in self.candidates if needle in c.info.root]
        if len(found) != 1:
            raise KeyError(f"{len(found)} regions match {needle!r}: {[c.info.root for c in self.candidates]}")
        return found[0]

    def pair(self, needle: str) -> PairCandidate:
        """The B2B pair whose first GEMM's where() contains `needle`."""
        found = [p for p in self.pairs if needle in p.info.root]
        if len(found) != 1:
            raise KeyError(f"{len(found)} pairs match {needle!r}: {[p.info.root for p in self.pairs]}")
        return found[0]


def capture(model, *inputs, dynamic: bool = False, **kwargs) -> Capture:
    from torch._dynamo.backends.common import aot_autograd

    cap = Capture()

    def inference(agm: fx.GraphModule, ex):
        cap.gm = agm
        cands = find_regions(agm, next_region_id)
        for c in cands:
            decide(c)
        cap.candidates, cap.pairs = form_pairs(cands, next_region_id)
        cap.attentions = attention.find(agm, next_region_id)

        class Recorder(fx.Interpreter):
            def run_node(self, n):
                v = super().run_node(n)
                cap.values[n.name] = v
                return v

        return _boxed(lambda *args: Recorder(agm).run(*args))

    def backend(gm, ex, **_):
        return aot_autograd(fw_compiler=inference, inference_compiler=inference)(gm, ex)

    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        compiled(*inputs, **kwargs)
    return cap
