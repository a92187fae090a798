"""Running fused regions: the custom op, its fake implementation, and the kernel cache.

Each fused region becomes one call of the custom op

    comfuse::fused(int region, Tensor[] tensors, SymInt[] sizes) -> Tensor[]

`region` keys the in-process registry (REGISTRY) of RuntimeRegion objects; `tensors` are the
region's operands (GEMM A and B, then vectors / residuals), `sizes` the symbolic sizes its views
use under dynamic shapes. The fake (meta) implementation runs the region's aten subgraph on fake
tensors, so shapes, dtypes and symbolic sizes propagate exactly as they would unfused and the
surrounding graph compiles (Inductor) and captures (CUDA graphs) as usual.

The real implementation launches the ComFuse kernel on torch's current stream, outputs from
torch's caching allocator. Where it cannot (no sm_90 GPU, CPU tensors, a tensor that needs
gradients, a kernel that is not built yet during a CUDA graph capture, a launch error), it runs
the same aten subgraph instead and records why (RegionInfo.runtime_fallback, logged once).

Kernels are keyed by shape class: the region's ComFuse graph (canonical names), N, K, the plan
options and M rounded up to a power of two (partition.m_bucket), so a decode loop whose M stays
in one class never recompiles. A bounded LRU (config.kernel_cache_size) keeps them in memory
over the on-disk JIT cache; compile times land in RegionInfo.compiles.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.fx as fx

from . import _core
from .config import config
from .partition import RegionInfo, m_bucket
from .segments import ptile_rows
from .translate import _DTYPES, column_block

log = logging.getLogger("comfuse")

REGISTRY: dict[int, "RuntimeRegion"] = {}
_ids = itertools.count(1)


def next_region_id() -> int:
    return next(_ids)


_NAMES = _DTYPES  # torch dtype -> the kernel's dtype name

_gpu: tuple[bool, str] | None = None


def gpu_status() -> tuple[bool, str]:
    """(True, '') where an sm_90 GPU runs ComFuse kernels, else (False, why)."""
    global _gpu
    if _gpu is None:
        ok, why = _core.gpu_available()
        if ok and not torch.cuda.is_available():
            ok, why = False, "torch has no CUDA"
        _gpu = (bool(ok), "" if ok else f"no sm_90 GPU: {why}")
    return _gpu


class KernelCache:
    """A bounded LRU of compiled kernels; entries used in a CUDA graph capture are pinned."""

    def __init__(self):
        self.entries: OrderedDict = OrderedDict()
        self.pinned: set = set()
        self.lock = threading.Lock()
        self.compiles = 0

    def get(self, key):
        with self.lock:
            k = self.entries.get(key)
            if k is not None:
                self.entries.move_to_end(key)
            return k

    def put(self, key, kernel) -> None:
        with self.lock:
            self.entries[key] = kernel
            self.entries.move_to_end(key)
            self.compiles += 1
            while len(self.entries) > max(1, config.kernel_cache_size):
                victim = next((k for k in self.entries if k not in self.pinned), None)
                if victim is None:
                    break
                del self.entries[victim]

    def pin(self, key) -> None:
        with self.lock:
            self.pinned.add(key)

    @contextlib.contextmanager
    def pins_kept(self):
        """Pins made inside (a measurement's own captures) are dropped on exit; those before stay,
        so the LRU keeps its bound."""
        before = set(self.pinned)
        try:
            yield
        finally:
            with self.lock:
                self.pinned = before

    def clear(self) -> None:
        with self.lock:
            self.entries = OrderedDict((k, v) for k, v in self.entries.items() if k in self.pinned)


CACHE = KernelCache()


def precompile(regions: list[tuple["RuntimeRegion", int]]) -> None:
    """Builds the kernels that the regions of one graph will first run ((region, rows) pairs) all
    at once, one thread per distinct kernel (at most config.compile_threads): NVRTC releases the GIL, so a
    model's kernels take the time of the slowest, not the sum. A kernel that fails to build is
    left for its first call, which falls back (or raises under config.strict) with the reason."""
    todo: dict = {}
    for r, m in regions:
        bucket, key, opts = r.kernel_key(m)
        if CACHE.get(key) is None and key not in todo:
            todo[key] = (r, bucket, opts)
    if len(todo) < 2 or config.compile_threads < 2:
        return  # one kernel: built by its first call, as without precompiling

    def one(item):
        key, (r, bucket, opts) = item
        try:
            CACHE.put(key, r.build(bucket, opts))
        except _core.Error as e:
            log.debug("comfuse: region %d: precompile failed (its first call reports it): %s", r.info.id, e)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(todo), config.compile_threads)) as pool:
        list(pool.map(one, todo.items()))
    log.info("comfuse: %d kernels built in %.1f s (%d threads)", len(todo), time.perf_counter() - t0,
             min(len(todo), config.compile_threads))


class _Fallback(Exception):
    pass


class RuntimeRegion:
    """What the custom op needs to run one region."""

    device_type = "cuda"  # where kernels run (a test emulates them on the CPU)

    def __init__(self, info: RegionInfo, region, roles: list[str], names: list[str], out_names: list[str],
                 subgraph: fx.GraphModule, out_classes: list[str] | None = None,
                 cols: list[tuple[int, int] | None] | None = None, rows: list[tuple | None] | None = None):
        self.info = info
        self.region = region              # _core.Region: its Fusion Spec
        # per kernel input: a, b (b3: a gated region's second), row, col, tile, vec, ptile
        self.roles = roles
        self.names = names                # their ComFuse graph names
        self.cols = cols or [None] * len(roles)  # the block of its tensor's last dim an input reads (translate.py)
        # How an input's tensor is viewed (or expanded) as the kernel's rows (segments.rows_of: RoPE's
        # cos and sin, role ptile [M, D], or tile [M, N] with one head), or None.
        self.rows = rows or [None] * len(roles)
        self.out_names = out_names
        self.out_classes = out_classes or ["tile"] * len(out_names)  # tile [M, N] or col [M, 1]
        self.subgraph = subgraph          # the region's aten ops: fake impl and fallback
        self.key_text = info.graph_text
        self._out_shapes: dict = {}
        self._keys: dict = {}           # M bucket -> kernel cache key
        self._warned: set = set()
        self.last_inputs = None

    def subgraph_args(self, tensors, sizes) -> list:
        """The arguments `subgraph` takes for the kernel's inputs (tensors, sizes): a benchmark
        runs the region's own aten ops on them."""
        return list(tensors) + list(sizes)

    # -- fake / fallback ------------------------------------------------------------------
    def fake(self, tensors, sizes):
        outs = self.subgraph(*tensors, *sizes)
        return [torch.empty(o.shape, dtype=o.dtype, device=o.device) for o in outs]

    def _note_fallback(self, why: str) -> None:
        """Counts a call that runs unfused; each reason is reported and logged once."""
        self.info.fallback_calls += 1
        if why not in self._warned:
            self._warned.add(why)
            self.info.runtime_fallback = why
            log.info("comfuse: %s %d (%s) runs unfused: %s", self._what, self.info.id, self.info.root, why)

    def fallback(self, tensors, sizes, why: str):
        self._note_fallback(why)
        # Outputs of a custom op may alias neither its inputs nor each other (two outputs can be
        # views of one value): each gets storage of its own.
        outs, seen = [], set()
        for o in self.subgraph(*tensors, *sizes):
            o = o.contiguous()
            if _aliases(o, tensors) or o.untyped_storage().data_ptr() in seen:
                o = o.clone()
            seen.add(o.untyped_storage().data_ptr())
            outs.append(o)
        return outs

    # -- the kernel -------------------------------------------------------------------------
    def out_shapes(self, tensors, sizes):
        key = tuple(tuple(t.shape) for t in tensors) + tuple(sizes)
        shapes = self._out_shapes.get(key)
        if shapes is None:
            meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t
                    for t in tensors]
            shapes = [(tuple(o.shape), o.dtype) for o in self.subgraph(*meta, *sizes)]
            self._out_shapes[key] = shapes
        return shapes

    def _dims(self, bucket: int) -> dict:
        return {"M": bucket, "N": self.info.n, "K": self.info.k}

    def kernel_key(self, m: int) -> tuple:
        """(M bucket, kernel cache key, plan options) of the kernel that runs m rows. Every kernel
        may be captured in a CUDA graph and replayed (the L2 row exchange keeps its launch counter
        on the device), so one key serves eager calls and captures alike."""
        bucket = m_bucket(m)
        info = self.info
        key = self._keys.get(bucket)
        if key is None:
            key = self._keys[bucket] = (self.key_text, info.n, info.k, bucket, tuple(sorted(info.plan_options.items())))
        return bucket, key, info.plan_options

    # What build() logs the kernel as, and how it compiles one and summarizes its plan (a B2B
    # pair overrides these three).
    _what = "region"

    def _compile(self, bucket: int, opts: dict):
        return self.region.compile(self._dims(bucket), opts)

    @staticmethod
    def _plan_summary(k) -> dict:
        return k.plan().summary()

    def build(self, bucket: int, opts: dict):
        """Compiles (or loads from the JIT cache) the kernel of an M bucket and records it."""
        info = self.info
        t0 = time.perf_counter()
        k = self._compile(bucket, opts)
        wall = time.perf_counter() - t0
        c = k.compiled()
        info.compiles.append({"m_bucket": bucket, "seconds": wall, "compile_seconds": c["compile_seconds"],
                              "cache_hit": c["cache_hit"], "options": dict(opts), "plan": self._plan_summary(k)})
        log.info("comfuse: %s %d (%s): kernel for M <= %d %s in %.2f s", self._what, info.id, info.root, bucket,
                 "loaded from the JIT cache" if c["cache_hit"] else "compiled", wall)
        return k

    def kernel(self, m: int, capturing: bool):
        bucket, key, opts = self.kernel_key(m)
        k = CACHE.get(key)
        if k is None:
            if capturing:
                raise _Fallback(f"no kernel for M <= {bucket} was built before this CUDA graph capture "
                                "(run the model once before capturing)")
            k = self.build(bucket, opts)
            CACHE.put(key, k)
        if capturing:
            CACHE.pin(key)
        return k

    def run(self, tensors, sizes):
        info = self.info
        info.calls += 1
        if config.record_inputs:
            self.last_inputs = (list(tensors), list(sizes))
        ok, why = gpu_status()
        if not ok:
            return self.fallback(tensors, sizes, why)
        dev = None
        for t, role in zip(tensors, self.roles):  # the kernel's inputs come first
            if role == "scalar":
                continue
            if t.device.type != self.device_type:
                return self.fallback(tensors, sizes, f"tensor on {t.device}: fused kernels run on the GPU")
            dev = dev or t.device
            if t.requires_grad and torch.is_grad_enabled():
                return self.fallback(tensors, sizes, "a tensor requires gradients: the fused kernels are inference only")
        if dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device():
            return self.fallback(tensors, sizes, f"tensors on {dev}, not the current device")
        try:
            return self._launch(tensors, sizes, dev)
        except (_Fallback, _core.Error) as e:
            if config.strict and not isinstance(e, _Fallback):
                raise
            return self.fallback(tensors, sizes, str(e).splitlines()[0])

    def _k(self) -> int:
        return self.info.k  # the columns of A (tensors[0])

    def _launch(self, tensors, sizes, dev):
        m = tensors[0].numel() // self._k()
        capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
        kern = self.kernel(m, capturing)
        args, scalars, outs, views = self.prepare(tensors, sizes, dev, m, capturing)  # views: keeps copies alive
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        kern.run(args, scalars, stream)
        return outs

    def prepare(self, tensors, sizes, dev, m: int, capturing: bool = False):
        """The kernel's arguments: (name -> (pointer, dtype, shape, row stride), scalars, outputs,
        name -> the tensor each pointer belongs to). Operands are viewed as the kernel's 2-D
        matrices and vectors; one that is not packed rows with a 16-byte aligned base and row
        stride is copied (the copies live in the returned views until the launch is enqueued;
        later kernels on the stream are ordered after it, so the allocator may reuse them)."""
        info = self.info
        n, k = info.n, info.k
        args, scalars, views = {}, {}, {}

        def rows(t, r, c):
            """t as an r x c row-major matrix with a 16-byte aligned base and row stride."""
            return _packed_rows(t.reshape(r, c) if t.dim() != 2 or tuple(t.shape) != (r, c) else t, info.id)

        for t, role, name, cols, layout in zip(tensors, self.roles, self.names, self.cols, self.rows):
            t = column_block(t, cols)
            if role == "scalar":
                if t.device.type != "cpu" and capturing:
                    raise _Fallback(f"scalar operand '{name}' lives on the GPU: reading it inside a CUDA graph "
                                    "capture is not possible")
                scalars[name] = float(t.item())
                continue
            dt = _NAMES[t.dtype]
            if role == "a":
                x = rows(t, m, k)
            elif role in ("b", "b3"):  # b3: a gated region's second weight (the gate's), as B
                if info.layout == "nk":   # the GEMM sees [K, N] = W^T of an N x K weight
                    x = rows(t.reshape(k, n).t(), n, k)
                else:
                    x = rows(t, k, n)
            elif role == "row":
                x = rows(t.reshape(1, n), 1, n)
                args[name] = (x.data_ptr(), dt, [n], 0)
                views[name] = x.reshape(n)
                continue
            elif role in ("col", "vec"):  # vec: one segment's length, read periodically (segments.py)
                x = t.reshape(-1).contiguous()
                if x.data_ptr() % 16:
                    x = x.clone()
                args[name] = (x.data_ptr(), dt, [m if role == "col" else x.numel()], 0)
                views[name] = x
                continue
            elif layout is not None:  # RoPE's cos and sin as the model has them (segments.ptile_rows)
                x = _packed_rows(ptile_rows(t, m, layout), info.id)
            else:  # tile
                x = rows(t, m, n)
            args[name] = (x.data_ptr(), dt, list(x.shape), x.stride(0))
            views[name] = x
        outs = []
        for (shape, dtype), name, cls in zip(self.out_shapes(tensors, sizes), self.out_names, self.out_classes):
            o = torch.empty(shape, dtype=dtype, device=dev)
            outs.append(o)
            if cls == "col":  # one value per row
                args[name] = (o.data_ptr(), _NAMES[dtype], [m, 1], 0)
                views[name] = o.view(m, 1)
            else:
                args[name] = (o.data_ptr(), _NAMES[dtype], [m, n], n)
                views[name] = o.view(m, n)
        return args, scalars, outs, views


class RuntimePair(RuntimeRegion):
    """A B2B pair (pair.py) run as one B2B kernel: the same custom op, fake implementation and
    fallback (the members' aten ops) as a region, the same shape classes and cache; only the
    kernel (Lowering.compile_b2b) and its arguments differ. Each argument's shape comes from the
    pair graph (dims M, K, N1, N2), so X, W1, W3, W2 and the epilogue operands of both GEMMs are
    viewed as the kernel's matrices and vectors without knowing which GEMM they belong to."""

    def __init__(self, info: RegionInfo, lowering, tr, subgraph: fx.GraphModule, dims: dict):
        super().__init__(info, None, tr.input_roles, tr.input_names, tr.output_names, subgraph, tr.output_classes,
                         tr.input_cols, tr.input_rows)
        self.lowering = lowering
        self.shapes = tr.input_shapes
        self.transposed = tr.input_transposed
        self.fixed = {k: v for k, v in dims.items() if k != "M"}  # K, N1, N2
        self.n_out = dims["N2"]

    def _dims(self, bucket: int) -> dict:
        return {"M": bucket, **self.fixed}

    def kernel_key(self, m: int) -> tuple:
        bucket = m_bucket(m)
        key = self._keys.get(bucket)
        if key is None:
            key = self._keys[bucket] = ("b2b", self.key_text, tuple(sorted(self.fixed.items())), bucket,
                                        tuple(sorted(self.info.plan_options.items())))
        return bucket, key, self.info.plan_options

    _what = "B2B pair"

    def _compile(self, bucket: int, opts: dict):
        return self.lowering.compile_b2b(self._dims(bucket), opts)

    @staticmethod
    def _plan_summary(k) -> dict:
        return {"kind": "b2b"}

    def _k(self) -> int:
        return self.fixed["K"]  # X's columns (tensors[0] is X, role a)

    def prepare(self, tensors, sizes, dev, m: int, capturing: bool = False):
        dims = self._dims(m)
        args, scalars, views = {}, {}, {}
        for t, role, name, shape, tr, cols, layout in zip(tensors, self.roles, self.names, self.shapes, self.transposed,
                                                          self.cols, self.rows):
            t = column_block(t, cols)
            if role == "scalar":
                if t.device.type != "cpu" and capturing:
                    raise _Fallback(f"scalar operand '{name}' lives on the GPU: reading it inside a CUDA graph "
                                    "capture is not possible")
                scalars[name] = float(t.item())
                continue
            want = [dims[d] if isinstance(d, str) else int(d) for d in shape]
            dt = _NAMES[t.dtype]
            if len(want) == 1 or want[-1] == 1:  # a row [N] or a column [M, 1]: packed
                x = t.reshape(-1).contiguous()
                if x.data_ptr() % 16:
                    x = x.clone()
                args[name] = (x.data_ptr(), dt, [want[0]] if len(want) == 1 else want, 0)
                views[name] = x
                continue
            # A B given as N x K reaches the op as its t() ([K, N]): the kernel reads the N x K rows.
            if layout is not None:
                x = ptile_rows(t, m, layout)
            else:
                x = t.reshape(want[1], want[0]).t() if tr else t.reshape(want)
            x = _packed_rows(x, self.info.id)
            args[name] = (x.data_ptr(), dt, list(x.shape), x.stride(0))
            views[name] = x
        outs = []
        for (shape, dtype), name, cls in zip(self.out_shapes(tensors, sizes), self.out_names, self.out_classes):
            o = torch.empty(shape, dtype=dtype, device=dev)
            outs.append(o)
            if cls == "col":
                args[name] = (o.data_ptr(), _NAMES[dtype], [m, 1], 0)
                views[name] = o.view(m, 1)
            else:
                args[name] = (o.data_ptr(), _NAMES[dtype], [m, self.n_out], self.n_out)
                views[name] = o.view(m, self.n_out)
        return args, scalars, outs, views


def _packed_rows(x: torch.Tensor, region: int) -> torch.Tensor:
    """x (2-D) with a contiguous last dim and a 16-byte aligned base and row stride (TMA), copied
    where it has not (logged at DEBUG, as RuntimeRegion.prepare does)."""
    es = x.element_size()
    r, c = x.shape
    if (x.stride(1) != 1 and c > 1) or (x.stride(0) < c and r > 1) or (x.stride(0) * es) % 16 or x.data_ptr() % 16:
        log.debug("comfuse: region %d copies a %s operand to packed rows", region, tuple(x.shape))
        x = x.contiguous()
        if x.data_ptr() % 16:
            x = x.clone()
    return x


def _aliases(o: torch.Tensor, tensors) -> bool:
    try:
        p = o.untyped_storage().data_ptr()
        return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == p for t in tensors)
    except Exception:
        return False


# ---- the custom op --------------------------------------------------------------------------
# Inputs keep the strides the graph gave them (a t() of a weight stays a view: no copy).
@torch.library.custom_op("comfuse::fused", mutates_args=(), tags=(torch.Tag.needs_exact_strides,))
def fused(region: int, tensors: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    r = REGISTRY.get(region)
    if r is None:
        raise RuntimeError(f"comfuse: region {region} is not registered in this process (a graph compiled by "
                           "another process? ComFuse regions live in memory only)")
    return r.run(list(tensors), list(sizes))


@fused.register_fake
def _fused_fake(region: int, tensors: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    r = REGISTRY.get(region)
    if r is None:
        raise RuntimeError(f"comfuse: region {region} is not registered in this process")
    return r.fake(list(tensors), list(sizes))


# ---- the direct API: one ComFuse graph, torch tensors in and out ------------------------------
_TORCH = {name: dt for dt, name in _DTYPES.items()}


class Kernel:
    """A compiled ComFuse graph (one fused region, or a B2B pair: two GEMMs in one kernel, e.g.
    attention) called on torch CUDA tensors. A batched graph ([B, M, K] inputs) takes 3-D
    tensors, or 4-D [B', H, M, K] ones with B' x H = B (attention's batch and heads; all the 4-D
    arguments of a call share H): their last dim contiguous, the other strides any multiples of 16
    bytes under which no two elements overlap, so q, k and v sliced out of one projection's output
    ([B, S, 3, H, D] viewed as [B, H, S, D]) and an output viewed as [B, H, S, D] of a
    [B, S, H, D] tensor run without copies.

    Every argument is checked against the kernel before launch, with an error naming it: a
    CPU tensor, a dtype or shape that differs from the graph's, a last dimension that is not
    contiguous, a row stride or base address that is not 16-byte aligned (TMA). Nothing is
    copied behind the caller's back here (the torch.compile path copies, and logs it).
    Outputs not passed are allocated with torch's caching allocator; the launch goes on
    torch.cuda.current_stream()."""

    def __init__(self, graph: "_core.Graph", dims: dict, plan_options: dict | None = None):
        low = _core.lower(graph)
        regions = low.regions()
        self.dims = dict(dims)
        if low.is_b2b():  # two GEMMs, S in registers: one B2B kernel
            self.region = None
            self.kernel = low.compile_b2b(self.dims, dict(plan_options or {}))
        elif len(regions) != 1 or low.fallbacks():
            raise _core.Error("the graph does not lower to one fused kernel:\n" + low.describe())
        else:
            self.region = regions[0]
            self.kernel = self.region.compile(self.dims, dict(plan_options or {}))
        self.args = self.kernel.args()

    def plan(self) -> dict:
        if self.kernel.is_b2b():
            return {"kind": "b2b", "explain": self.kernel.b2b_explain()}
        return self.kernel.plan().summary()

    def explain(self) -> str:
        return self.kernel.b2b_explain() if self.kernel.is_b2b() else self.kernel.plan().explain()

    def compiled(self) -> dict:
        return self.kernel.compiled()

    def _shape(self, shape) -> list[int]:
        return [d if isinstance(d, int) else self.dims[d] for d in shape]

    def __call__(self, scalars: dict | None = None, **tensors):
        args, outs, batch_strides = {}, {}, {}
        for a in self.args:
            name, role = a["name"], a["role"]
            if role == "scalar":
                continue
            want = self._shape(a["shape"])
            if role == "output" and name not in tensors:
                t = torch.empty(want, dtype=_TORCH[a["dtype"]], device="cuda")
            elif name not in tensors:
                raise ValueError(f"missing tensor argument '{name}' ({role})")
            else:
                t = tensors[name]
            check_tensor(name, t, _TORCH[a["dtype"]], want)
            if role == "output":
                outs[name] = t
            if len(want) == 3:  # a batch of matrices [B, rows, cols], or [B', H, rows, cols] (batch x heads)
                ld = t.stride(-2) if want[2] != 1 else 0
                batch_strides[name] = list(t.stride()[:-2])
            else:
                ld = t.stride(0) if _is_matrix(want) else 0  # vectors and [M, 1] columns are packed
            args[name] = (t.data_ptr(), a["dtype"], list(t.shape), ld)
        unknown = set(tensors) - {a["name"] for a in self.args}
        if unknown:
            raise ValueError(f"unknown argument(s) {sorted(unknown)}; the kernel takes {[a['name'] for a in self.args]}")
        self.kernel.run(args, {k: float(v) for k, v in (scalars or {}).items()},
                        torch.cuda.current_stream().cuda_stream, batch_strides)
        return outs


def _is_matrix(shape: list[int]) -> bool:
    """An [M, K] / [N, K] operand, an [M, N] tile (or a batch of them, [B, M, N]); else a row [N]
    or a column [M, 1] (packed; [B, M, 1] too)."""
    return len(shape) in (2, 3) and shape[-1] != 1


def check_tensor(name: str, t, dtype: torch.dtype, shape: list[int]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"argument '{name}' is a {type(t).__name__}, not a tensor")
    if t.device.type != "cuda":
        raise ValueError(f"argument '{name}' is on {t.device}: ComFuse kernels take CUDA tensors")
    if t.dtype != dtype:
        raise ValueError(f"argument '{name}' is {t.dtype}, the kernel was built for {dtype}")
    matrix = _is_matrix(shape)
    # A batch of B matrices may come as [B', H, rows, cols] with B' x H = B.
    heads = matrix and len(shape) == 3 and t.dim() == 4 and t.shape[0] * t.shape[1] == shape[0] \
        and list(t.shape[2:]) == list(shape[1:])
    if (list(t.shape) != list(shape) and not heads) if matrix else (t.numel() != math.prod(shape)):
        raise ValueError(f"argument '{name}' has shape {list(t.shape)}, the kernel expects {shape}" +
                         (f" (or [B', H, {shape[1]}, {shape[2]}] with B' x H = {shape[0]})" if matrix and len(shape) == 3
                          else ""))
    if t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"argument '{name}' has strides {t.stride()}: its last dimension must be contiguous "
                         "(pass .contiguous())")
    if not matrix and not t.is_contiguous():
        raise ValueError(f"argument '{name}' (a vector) is not contiguous")
    if t.data_ptr() % 16:
        raise ValueError(f"argument '{name}' starts at an address that is not 16-byte aligned (a view at an offset? "
                         "pass .clone())")
    row = -2 if matrix else 0
    if matrix and (t.stride(row) * t.element_size()) % 16:
        raise ValueError(f"argument '{name}' has a row stride of {t.stride(row) * t.element_size()} bytes: TMA needs a "
                         "multiple of 16")
    for d, what in ((0, "batch"), (1, "head")) if matrix and len(shape) == 3 else ():
        if d < t.dim() - 2 and (t.stride(d) * t.element_size()) % 16:
            raise ValueError(f"argument '{name}' has a {what} stride of {t.stride(d) * t.element_size()} bytes: TMA "
                             "needs a multiple of 16")


def compile_graph(graph, dims: dict, **plan_options) -> Kernel:
    """Compile a ComFuse graph (comfuse.Graph or its text) for `dims` (e.g. {"M": 4096, ...})."""
    if isinstance(graph, str):
        graph = _core.parse_graph(graph)
    return Kernel(graph, dims, plan_options)
