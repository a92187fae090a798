"""What fused, what fell back and why, by the user's module paths and op names."""
from __future__ import annotations

from dataclasses import dataclass, field

from .partition import RegionInfo


@dataclass
class GraphReport:
    """One graph torch.compile handed to the backend."""
    index: int
    regions: list[RegionInfo] = field(default_factory=list)
    note: str = ""          # e.g. why the graph was not partitioned at all
    mode: str | None = None
    dynamic: bool = False


@dataclass
class FusionReport:
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def regions(self) -> list[RegionInfo]:
        return [r for g in self.graphs for r in g.regions]

    def fused(self) -> list[RegionInfo]:
        return [r for r in self.regions if r.status == "fused"]

    def fusable(self) -> list[RegionInfo]:
        return [r for r in self.regions if r.status in ("fused", "fusable")]

    def fallbacks(self) -> list[RegionInfo]:
        return [r for r in self.regions if r.status == "fallback"]

    def summary(self) -> str:
        rs = self.regions
        n = {s: sum(1 for r in rs if r.status == s) for s in ("fused", "fusable", "fallback")}
        parts = [f"{n['fused']} fused"]
        if n["fusable"]:
            parts.append(f"{n['fusable']} fusable but not fused here")
        parts.append(f"{n['fallback']} left to Inductor")
        att = sum(1 for r in rs if r.layout == "attention")
        what = f"{len(rs) - att} GEMM region(s)" + (f" and {att} attention(s)" if att else "")
        return f"comfuse: {len(self.graphs)} graph(s), {what}: " + ", ".join(parts)

    def __str__(self) -> str:
        lines = [self.summary()]
        for g in self.graphs:
            head = f"graph {g.index}" + (f" (mode={g.mode})" if g.mode else "") + (" dynamic" if g.dynamic else "")
            lines.append(head + (f": {g.note}" if g.note else ""))
            for r in g.regions:
                lines.extend("  " + l for l in format_region(r))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def format_region(r: RegionInfo) -> list[str]:
    ops = r.ops[1:]
    head = f"[{r.status}] {r.root}"
    if ops:
        head += " + " + ", ".join(ops)
    out = [head]
    if r.plan.get("kind") == "attention":
        d = r.plan["dims"]
        out.append(f"    attention: batch x heads {d['B']}, M={d['M']} N={d['N']} head dims {d['K']}/{d['DV']} {r.dtype}")
    elif r.plan.get("kind") == "b2b":
        d = r.plan["dims"]
        out.append(f"    GEMMs M={r.m} K={d['K']} N1={d['N1']} N2={d['N2']} {r.dtype} B {r.layout}")
    elif r.n:
        out.append(f"    GEMM M={r.m} N={r.n} K={r.k} {r.dtype} B {r.layout}")
    if r.reason:
        out.append(f"    {r.reason}")
    if r.measured and r.status != "fallback":  # a measured fallback's reason has these numbers
        x = r.measured
        against = (f"Inductor's kernels for the region {x['inductor_us']:.1f} us" +
                   (f" (cuBLAS GEMM alone {x['gemm_us']:.1f} us)" if "gemm_us" in x else "")
                   if x.get("inductor_us") is not None else
                   f"cuBLAS GEMM {x['gemm_us']:.1f} us + epilogue {x['epilogue_us']:.1f} us (modeled)")
        out.append(f"    measured on {x['device']}: fused {x['fused_us']:.1f} us, {against}")
    if r.b2b:
        out.append(f"    {r.b2b}")
    if r.plan.get("kind") in ("b2b", "attention"):
        if r.status != "fallback":
            first = next((l.strip() for l in r.plan.get("explain", "").splitlines() if l.strip().startswith("tiles")), "")
            first = " ".join(first.split())
            out.append(f"    plan: B2B kernel{' (gated)' if r.plan.get('gated') else ''}" + (f", {first}" if first else ""))
    elif r.plan and r.status != "fallback":
        p = r.plan
        out.append(f"    plan: tile {p['tile_m']}x{p['tile_n']}x{p['tile_k']}, cluster {p['cluster_m']}x{p['cluster_n']}, "
                   f"row group {p['row_group']}, {p['n_tiles_per_cta']} N-tile(s)/CTA, "
                   + (f"split-K {p['k_splits']}, " if p.get("k_splits", 1) > 1 else "") + f"{p['strategy']}, "
                   f"{p['aggregation'].split(' ')[0]}" + (f" (options {r.plan_options})" if r.plan_options else ""))
    for e in r.excluded:
        out.append(f"    not fused: {e.node}: {e.reason}")
    for c in r.compiles:
        out.append(f"    kernel M<={c['m_bucket']}: {'JIT cache hit' if c['cache_hit'] else 'compiled'} in {c['seconds']:.2f} s"
                   + (f" (compiler {c['compile_seconds']:.2f} s)" if not c["cache_hit"] else ""))
    if r.calls:
        out.append(f"    calls {r.calls}, unfused at run time {r.fallback_calls}"
                   + (f" ({r.runtime_fallback})" if r.runtime_fallback else ""))
    return out
