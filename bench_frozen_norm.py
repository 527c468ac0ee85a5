"""bench_frozen_norm.py: what freezing saves, and how these kernels compare.

    python bench_frozen_norm.py                  # GPU: the full table (a few minutes on an H200)
    python bench_frozen_norm.py --quick          # GPU: about a minute (no torch.compile column)
    python bench_frozen_norm.py --ops rms,ln --sizes 2048x4096,16x512x64x64:32 --dtype fp16
    python bench_frozen_norm.py --csv out.csv --json out.json
    python bench_frozen_norm.py --kernel-time    # GPU: also the kernels' own time, without the host
    python bench_frozen_norm.py --dce            # what the compiler removes (no GPU needed)
    python bench_frozen_norm.py --plans-json p.json   # compile every code path for sm_90 (no GPU needed)

On a GPU, every op runs forward, backward and forward+backward with its
parameters trainable and frozen, beside PyTorch eager, torch.compile of the
plain-torch reference (compiled per shape) and Liger-Kernel (when importable).
Bandwidth comes from a byte count (`bytes_moved`) and is compared with a
device-to-device copy timed in the same run. Times are medians of
triton.testing.do_bench, which flushes L2 before each call. Below a few
hundred MiB those times measure the host (Python, autograd, launches) as much
as the GPU. Two views leave the host out: the "graph ms" column replays
forward + backward from a CUDA graph (as a training loop captured in CUDA
graphs runs them: kernels and the gaps between them, no Python), and
--kernel-time adds the time CUDA kernels ran during a call (torch.profiler,
CUPTI; kernels that overlap on two streams counted once).

Without a GPU it checks every op through Triton's CPU interpreter (in a child
process), prints the scratch memory freezing saves at the benchmark's sizes,
and the compiled-kernel report. It never prints an interpreter time.
"""

import argparse
import contextlib
import csv
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch

import frozen_norm as fn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OP_NAMES = {"rms": "RMSNorm", "fadd": "FusedAddRMSNorm", "ln": "LayerNorm", "gn": "GroupNorm", "poly": "PolyNorm"}
# The feature request's table (M = 2048), sizes that fill the GPU, a hidden
# size of released models that is no power of two (5120: Llama 2 13B, Qwen2.5
# 14B and 32B), and two hidden sizes far past a register-resident row.
ROW_SIZES = [(2048, n) for n in (1024, 2048, 4096, 8192, 16384, 32768)] + [
    (16384, 4096), (8192, 5120), (8192, 32768), (1024, 65536), (256, 262144)]
# Diffusion-model GroupNorm shapes (B, C, H, W, G), and one with fewer
# (sample, group) rows than an H200 has SMs.
GROUP_SIZES = [(16, 512, 64, 64, 32), (8, 1280, 32, 32, 32), (1, 512, 256, 256, 32)]
QUICK_ROW_SIZES = [(2048, 4096), (16384, 4096)]
QUICK_GROUP_SIZES = [(16, 512, 64, 64, 32)]
H200_SMS = 132   # the SM count assumed by the scratch and launch reports
EPS = 1e-6


# ----------------------------------------------------------------------------
# Inputs, providers and byte counts
# ----------------------------------------------------------------------------

def make_inputs(op, size, dtype, device, trainable):
    """Fresh random inputs (never zeros) for one op and size; x always requires grad."""
    def rnd(*shape, shift=0.0, grad=False):
        return (torch.randn(shape, device=device, dtype=torch.float32) + shift).to(dtype).requires_grad_(grad)
    if op == "gn":
        B, C, H, W, G = size
        return {"x": rnd(B, C, H, W, grad=True), "weight": rnd(C, shift=1.0, grad=trainable),
                "bias": rnd(C, grad=trainable), "groups": G}
    M, N = size
    d = {"x": rnd(M, N, grad=True)}
    if op == "poly":
        d["weight"] = (torch.rand(3, device=device) * 0.5 + 0.2).to(dtype).requires_grad_(trainable)
        d["bias"] = rnd(shift=1.0, grad=trainable)   # shape (): what Liger's PolyNorm accepts
        return d
    d["weight"] = rnd(N, shift=1.0, grad=trainable)
    if op == "ln":
        d["bias"] = rnd(N, grad=trainable)
    if op == "fadd":
        d["residual"] = rnd(M, N, grad=True)
    return d


def ours(op):
    return {
        "rms": lambda d: fn.rms_norm(d["x"], d["x"].shape[-1:], d["weight"], EPS),
        "fadd": lambda d: fn.fused_add_rms_norm(d["x"], d["residual"], d["weight"], EPS),
        "ln": lambda d: fn.layer_norm(d["x"], d["x"].shape[-1:], d["weight"], d["bias"], EPS),
        "gn": lambda d: fn.group_norm(d["x"], d["groups"], d["weight"], d["bias"], EPS),
        "poly": lambda d: fn.poly_norm(d["x"], d["weight"], d["bias"], EPS),
    }[op]


def reference(op):
    """The plain-torch reference: what torch.compile is given."""
    return {
        "rms": lambda d: fn.rms_norm_reference(d["x"], d["x"].shape[-1:], d["weight"], EPS),
        "fadd": lambda d: fn.fused_add_rms_norm_reference(d["x"], d["residual"], d["weight"], EPS),
        "ln": lambda d: fn.layer_norm_reference(d["x"], d["x"].shape[-1:], d["weight"], d["bias"], EPS),
        "gn": lambda d: fn.group_norm_reference(d["x"], d["groups"], d["weight"], d["bias"], EPS),
        "poly": lambda d: fn.poly_norm_reference(d["x"], d["weight"], d["bias"], EPS),
    }[op]


def eager(op):
    """PyTorch eager: torch.nn.functional where it exists (it skips dw itself through
    its output mask), else the plain-torch composition."""
    F = torch.nn.functional

    def fadd(d):
        s = d["x"] + d["residual"]
        return F.rms_norm(s, s.shape[-1:], d["weight"], EPS), s
    return {
        "rms": lambda d: F.rms_norm(d["x"], d["x"].shape[-1:], d["weight"], EPS),
        "fadd": fadd,
        "ln": lambda d: F.layer_norm(d["x"], d["x"].shape[-1:], d["weight"], d["bias"], EPS),
        "gn": lambda d: F.group_norm(d["x"], d["groups"], d["weight"], d["bias"], EPS),
        "poly": reference("poly"),
    }[op]


def liger(op):
    """Liger-Kernel's autograd Functions (in_place=False: dy is not overwritten)."""
    from liger_kernel.ops import (LigerFusedAddRMSNormFunction, LigerGroupNormFunction, LigerLayerNormFunction,
                                  LigerPolyNormFunction, LigerRMSNormFunction)
    return {
        "rms": lambda d: LigerRMSNormFunction.apply(d["x"], d["weight"], EPS, 0.0, "llama", False),
        "fadd": lambda d: LigerFusedAddRMSNormFunction.apply(d["x"], d["residual"], d["weight"], EPS, 0.0,
                                                             "llama", False),
        "ln": lambda d: LigerLayerNormFunction.apply(d["x"], d["weight"], d["bias"], EPS),
        "gn": lambda d: LigerGroupNormFunction.apply(d["x"], d["weight"], d["bias"], d["x"].shape[1],
                                                     d["groups"], EPS),
        "poly": lambda d: LigerPolyNormFunction.apply(d["x"], d["weight"], d["bias"], EPS, False),
    }[op]


def compiled(op):
    torch._dynamo.reset()   # one fresh compilation per op, shape and mode (dynamic=False)
    return torch.compile(reference(op), dynamic=False)


def bytes_moved(op, size, element_size):
    """Bytes the op must move through memory, per pass: the floor of its time.

    Forward: x read, y written (FusedAdd: x and r read, y and s written).
    Backward: x and dy read, dx written (FusedAdd: s, dy, ds read, dx written).
    Parameters and per-row statistics are left out: under 1% at these sizes.
    """
    numel = 1
    for s in (size[:4] if op == "gn" else size):
        numel *= s
    fwd, bwd = (4, 4) if op == "fadd" else (2, 3)
    return fwd * numel * element_size, bwd * numel * element_size


def size_label(op, size):
    if op == "gn":
        B, C, H, W, G = size
        return f"{B}x{C}x{H}x{W}:{G}"
    return f"{size[0]}x{size[1]}"


# ----------------------------------------------------------------------------
# Timing on a GPU
# ----------------------------------------------------------------------------

@dataclass
class Row:
    op: str
    provider: str
    size: str
    mode: str
    fwd_ms: float = float("nan")
    bwd_ms: float = float("nan")
    full_ms: float = float("nan")
    fwd_GBps: float = float("nan")
    bwd_GBps: float = float("nan")
    fwd_pct_copy: float = float("nan")
    bwd_pct_copy: float = float("nan")
    bwd_extra_MiB: float = float("nan")
    graph_ms: float = float("nan")        # forward + backward replayed from a CUDA graph
    fwd_kernel_us: float = float("nan")   # --kernel-time: CUDA kernel durations per call
    bwd_kernel_us: float = float("nan")
    fwd_kernel_pct_copy: float = float("nan")
    bwd_kernel_pct_copy: float = float("nan")
    note: str = ""


def copy_bandwidth(device, rep):
    """GB/s of a 1 GiB device-to-device copy, bytes read plus bytes written."""
    import triton.testing
    src = torch.randn(2**29, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=rep, return_mode="median")
    return 2 * src.numel() * src.element_size() / ms / 1e6


def kernel_time_us(f, calls=20):
    """Microseconds of CUDA kernels per call of f: the time some kernel ran
    (CUPTI, through torch.profiler; kernels that overlap, on two streams,
    counted once) over `calls` calls after 3 warm-ups, divided by `calls`.
    Host time is left out; L2 is not flushed between calls, which matters
    little from 64 MiB on."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            f()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:   # the union of the kernels' intervals
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy / calls


def as_tuple(outs):
    """An op's outputs as a tuple (FusedAddRMSNorm returns two, the others one)."""
    return outs if isinstance(outs, tuple) else (outs,)


def grads_wanted(d):
    return [v for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad]


def capture_graph(step, warmups=3):
    """step() captured in a CUDA graph: (graph, what the captured step
    returned, in the graph's memory). The warm-ups (which compile the
    kernels) run on a side stream, as torch.cuda.graph's documentation asks.
    Leaves that step() differentiates must be fresh (`detach().requires_grad_()`):
    autograd remembers the stream a leaf was first used on, and the capture
    must not wait on another one (pytorch/pytorch#164302)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def graph_replay_ms(f, d, dys, rep):
    """Forward + backward of f captured once in a CUDA graph (on fresh leaves,
    `capture_graph`), then the median of its replays (do_bench, L2 flushed):
    the GPU's time for the call with no host in it, as a training loop under
    CUDA graphs sees it."""
    import triton.testing
    d = {k: v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    wanted = grads_wanted(d)

    def step():
        outs = f(d)
        return torch.autograd.grad(as_tuple(outs), wanted, dys)
    graph, _ = capture_graph(step)
    return triton.testing.do_bench(graph.replay, rep=rep, return_mode="median")


def measure(op, provider, size, dtype, mode, copy_GBps, rep, kernel_time=False):
    import triton.testing
    bench = lambda f: triton.testing.do_bench(f, rep=rep, return_mode="median")  # noqa: E731
    row = Row(op, provider, size_label(op, size), mode)
    d = make_inputs(op, size, dtype, "cuda", mode == "train")
    f = {"ours": ours, "eager": eager, "compile": compiled, "liger": liger}[provider](op)
    outs = as_tuple(f(d))
    wanted = grads_wanted(d)
    dys = [torch.randn_like(o) for o in outs]
    row.fwd_ms = bench(lambda: f(d))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(outs, wanted, dys, retain_graph=True)
    torch.cuda.synchronize()
    row.bwd_extra_MiB = (torch.cuda.max_memory_allocated() - base) / 2**20
    del grads
    row.bwd_ms = bench(lambda: torch.autograd.grad(outs, wanted, dys, retain_graph=True))
    row.full_ms = bench(lambda: torch.autograd.grad(f(d), wanted, dys))
    try:
        row.graph_ms = graph_replay_ms(f, d, dys, rep)
    except Exception as e:   # printed beside the row's other columns
        row.note = f"no CUDA graph: {type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"
    fwd_bytes, bwd_bytes = bytes_moved(op, size, dtype.itemsize)
    row.fwd_GBps, row.bwd_GBps = fwd_bytes / row.fwd_ms / 1e6, bwd_bytes / row.bwd_ms / 1e6
    row.fwd_pct_copy, row.bwd_pct_copy = 100 * row.fwd_GBps / copy_GBps, 100 * row.bwd_GBps / copy_GBps
    if kernel_time:
        row.fwd_kernel_us = kernel_time_us(lambda: f(d))
        row.bwd_kernel_us = kernel_time_us(lambda: torch.autograd.grad(outs, wanted, dys, retain_graph=True))
        row.fwd_kernel_pct_copy = 100 * fwd_bytes / row.fwd_kernel_us / 1e3 / copy_GBps
        row.bwd_kernel_pct_copy = 100 * bwd_bytes / row.bwd_kernel_us / 1e3 / copy_GBps
    return row


def validate(op, size, dtype):
    """Our output and gradients against eager, once per size, before timing."""
    d = make_inputs(op, size, dtype, "cuda", True)
    got, want = ours(op)(d), eager(op)(d)
    got, want = as_tuple(got), as_tuple(want)
    dys = [torch.randn_like(o) for o in got]
    pairs = list(zip(got, want)) + list(zip(torch.autograd.grad(got, grads_wanted(d), dys),
                                            torch.autograd.grad(want, grads_wanted(d), dys)))
    worst = max((torch.linalg.vector_norm((a - b).float()) / torch.linalg.vector_norm(b.float())).item()
                for a, b in pairs)
    limit = 1e-4 if dtype == torch.float32 else 5e-2
    if not worst < limit:
        raise AssertionError(f"{op} {size}: relative difference to eager {worst:.2e} > {limit}")


def lora_case(dtype, rep, M=8192, H=4096, rank=16, device="cuda", compile_block=True):
    """An RMSNorm feeding a LoRA linear: base weight frozen, rank-16 A and B
    trained. The block is timed eagerly, replayed from a CUDA graph, and (with
    `compile_block`) under torch.compile(mode="reduce-overhead"), which
    compiles it as one graph with ours too (frozen_norm.py, section 9) and
    replays it from CUDA graphs."""
    import triton.testing
    F = torch.nn.functional
    rows = []
    x = torch.randn(M, H, device=device, dtype=dtype, requires_grad=True)
    base = (torch.randn(H, H, device=device) / H**0.5).to(dtype)
    A = (torch.randn(rank, H, device=device) / H**0.5).to(dtype).requires_grad_()
    B = (torch.randn(H, rank, device=device) / rank**0.5).to(dtype).requires_grad_()
    dy = torch.randn(M, H, device=device, dtype=dtype)
    norms = {"ours": lambda h, w: fn.rms_norm(h, (H,), w, EPS), "eager": lambda h, w: F.rms_norm(h, (H,), w, EPS)}
    for provider, norm in norms.items():
        for mode in ("train", "frozen"):
            w = (torch.randn(H, device=device) + 1).to(dtype).requires_grad_(mode == "train")

            def block_out(d):   # on leaves d, as graph_replay_ms makes them afresh
                h = norm(d["x"], d["w"])
                return F.linear(h, base) + F.linear(F.linear(h, d["A"]), d["B"])

            def norm_out(d):
                return norm(d["x"], d["w"])

            def fwd_bwd_ms(out, leaves):
                wanted = grads_wanted(leaves)
                return triton.testing.do_bench(lambda: torch.autograd.grad(out(leaves), wanted, dy),
                                               rep=rep, return_mode="median")

            block = {"x": x, "w": w, "A": A, "B": B}
            row = {"provider": provider, "mode": mode, "block_ms": fwd_bwd_ms(block_out, block),
                   "norm_ms": fwd_bwd_ms(norm_out, {"x": x, "w": w}),
                   "block_graph_ms": graph_replay_ms(block_out, block, [dy], rep),
                   "norm_graph_ms": graph_replay_ms(norm_out, {"x": x, "w": w}, [dy], rep)}
            row["norm_share_pct"] = 100 * row["norm_ms"] / row["block_ms"]
            if compile_block:
                torch._dynamo.reset()
                row["block_compiled_ms"] = fwd_bwd_ms(torch.compile(block_out, mode="reduce-overhead"), block)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------
# Recording what a wrapper launches and allocates, without running it
# ----------------------------------------------------------------------------

KERNELS = ["_row_norm_fwd_kernel", "_row_norm_bwd_kernel", "_long_row_norm_fwd_kernel", "_long_row_norm_bwd_kernel",
           "_group_norm_fwd_kernel", "_group_norm_bwd_kernel", "_group_rows_fwd_kernel", "_group_rows_bwd_kernel",
           "_poly_norm_fwd_kernel", "_long_poly_norm_fwd_kernel",
           "_poly_norm_bwd_kernel", "_long_poly_norm_bwd_kernel", "_row_norm_dwdb_kernel", "_sum_partials_kernel"]


@dataclass
class Launch:
    kernel: object
    name: str
    grid: tuple
    args: tuple
    constexprs: dict
    num_warps: int
    maxnreg: Optional[int] = None   # ptxas register cap, where the launch sets one
    enable_fp_fusion: Optional[bool] = None   # as the launch passes it (fn.FP_FUSION)

    @property
    def options(self) -> dict:
        """The launch options as the launch passed them: num_warps, and maxnreg
        and enable_fp_fusion where it set them (else Triton's defaults)."""
        options = dict(num_warps=self.num_warps, maxnreg=self.maxnreg, enable_fp_fusion=self.enable_fp_fusion)
        return {name: value for name, value in options.items() if value is not None}


@dataclass
class Recording:
    launches: list = field(default_factory=list)
    allocations: list = field(default_factory=list)   # (shape, dtype, bytes) of every tensor created

    @property
    def allocated_bytes(self):
        return sum(b for _, _, b in self.allocations)


class _Recorder:
    def __init__(self, kernel, name, launches):
        self.kernel, self.name, self.launches = kernel, name, launches

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, maxnreg=None, enable_fp_fusion=None, **constexprs):
            self.launches.append(Launch(self.kernel, self.name, tuple(grid), args, constexprs, num_warps, maxnreg,
                                        enable_fp_fusion))
        return launch


FACTORY_OPS = {"empty", "empty_strided", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
               "full_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "clone"}


class FactoryOpMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Hands every tensor that a factory op (empty, zeros, ...) or a clone
    creates to `created(op name, tensor)`, whose result the caller gets instead."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        return self.created(name, out) if name in FACTORY_OPS and isinstance(out, torch.Tensor) else out

    def created(self, name, out):
        return out


class AllocationRecorder(FactoryOpMode):
    """Records every tensor that a factory op (empty, zeros, ...) or a clone creates."""

    def __init__(self, allocations):
        super().__init__()
        self.allocations = allocations

    def created(self, name, out):
        self.allocations.append((tuple(out.shape), out.dtype, out.numel() * out.element_size()))
        return out


@contextlib.contextmanager
def recording(num_sms=H200_SMS, launch=False):
    """Record the launches (unless `launch`, run them too) and allocations of frozen_norm calls.

    With launch=False the kernels are replaced by recorders, so tensors may live
    on the 'meta' device, and the SM count is taken to be `num_sms`.
    """
    rec = Recording()
    saved = {name: getattr(fn, name) for name in KERNELS + ["_num_sms"]}
    try:
        if not launch:
            for name in KERNELS:
                setattr(fn, name, _Recorder(saved[name], name, rec.launches))
            fn._num_sms = lambda device: num_sms
        with AllocationRecorder(rec.allocations):
            yield rec
    finally:
        for name, value in saved.items():
            setattr(fn, name, value)


# ----------------------------------------------------------------------------
# What the compiler removes (--dce)
# ----------------------------------------------------------------------------

# Backward variants per op: which gradients are asked for.
VARIANTS = {
    "rms": {"trainable": dict(dx=1, dw=1), "frozen w": dict(dx=1, dw=0), "no dx": dict(dx=0, dw=1)},
    "fadd": {"trainable": dict(dx=1, dw=1), "frozen w": dict(dx=1, dw=0), "no dx": dict(dx=0, dw=1)},
    "ln": {"trainable": dict(dx=1, dw=1, db=1), "frozen w": dict(dx=1, dw=0, db=1),
           "frozen b": dict(dx=1, dw=1, db=0), "all frozen": dict(dx=1, dw=0, db=0), "no dx": dict(dx=0, dw=1, db=1)},
}
VARIANTS["gn"] = VARIANTS["poly"] = VARIANTS["ln"]
DCE_SIZES = {"rms": (8192, 4096), "fadd": (8192, 4096), "ln": (8192, 4096), "poly": (8192, 4096),
             "gn": (16, 512, 64, 64, 32)}
# The report's entries: each op at its DCE_SIZES, and GroupNorm's short-row
# kernels too (rows of 2 channels of 8 x 8), under their own name.
DCE_CASES = {op: (op, size) for op, size in DCE_SIZES.items()}
DCE_CASES["gn-short"] = ("gn", (1024, 64, 8, 8, 32))
# The flag that each backward kernel takes for each gradient.
FLAGS = {"dx": "COMPUTE_DX", "dw": "COMPUTE_DW", "db": "COMPUTE_DB"}


def scratch_pointer(op, flag):
    """The kernel argument that a flag's gradient partials are stored through."""
    return "Partial" if op == "poly" else {"COMPUTE_DW": "DWp", "COMPUTE_DB": "DBp"}[flag]


def record_backward(op, size, want, dtype=torch.bfloat16, num_sms=H200_SMS):
    """Launches and allocations of one backward call at `size`, on meta tensors."""
    meta = dict(device="meta", dtype=dtype)
    f32 = dict(device="meta", dtype=torch.float32)
    flags = [bool(want[k]) for k in ("dx", "dw", "db") if k in want]
    if op == "gn":
        B, C, H, W, G = size
        x, dy, w = torch.empty(B, C, H, W, **meta), torch.empty(B, C, H, W, **meta), torch.empty(C, **meta)
        with recording(num_sms):   # the forward sizes the statistics tensor
            _, stats = fn.group_norm_forward(x, G, w, w)
        call = lambda: fn.group_norm_backward(dy, x, G, w, w, stats, *flags)  # noqa: E731
    else:
        M, N = size
        x, dy, ds = (torch.empty(M, N, **meta) for _ in range(3))
        w, mean, rstd = torch.empty(N, **meta), torch.empty(M, **f32), torch.empty(M, **f32)
        w3, b1, rstd3 = torch.empty(3, **meta), torch.empty(1, **meta), torch.empty(M, 3, **f32)
        call = {
            "rms": lambda: fn.rms_norm_backward(dy, x, w, rstd, 0.0, *flags),
            "fadd": lambda: fn.fused_add_rms_norm_backward(dy, ds, x, w, rstd, 0.0, *flags),
            "ln": lambda: fn.layer_norm_backward(dy, x, w, w, mean, rstd, *flags),
            "poly": lambda: fn.poly_norm_backward(dy, x, w3, b1, rstd3, *flags),
        }[op]
    with recording(num_sms) as rec:
        call()
    return rec


def ptx_stats(ptx):
    """Counts in PTX text: global loads and stores, atomics, and all instructions."""
    body = [ln.strip() for ln in ptx.splitlines()]
    instr = [ln for ln in body if ln and not ln.startswith(("//", ".", "$", "{", "}", "@!", ")")) and ln.endswith(";")]
    count = lambda pat: sum(1 for ln in instr if re.search(pat, ln))  # noqa: E731
    return {"ld_global": count(r"\bld\.global"), "st_global": count(r"\bst\.global"),
            "atomics": count(r"\b(atom|red)\."), "instructions": len(instr)}


def ptxas_usage(ptx, arch="sm_90a"):
    """Registers and spill bytes that ptxas reports for the PTX: the ptxas that
    Triton itself assembles it with (from Triton 3.9 a CUDA 13 one for sm_90
    and newer, whose PTX the older ptxas beside it rejects). Raises if ptxas
    fails, rather than leave the table's columns empty."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except Exception:   # no CUDA backend
        return {}
    target = re.search(r"\.target\s+(\w+)", ptx)
    arch = target.group(1) if target else arch
    ptxas = get_ptxas(int(re.search(r"\d+", arch).group(0))).path
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", path, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{ptxas} failed on {arch}: {run.stderr.strip()[:500]}")
    out = run.stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill_st = re.search(r"(\d+) bytes spill stores", out)
    spill_ld = re.search(r"(\d+) bytes spill loads", out)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": (int(spill_st.group(1)) + int(spill_ld.group(1))) if spill_st and spill_ld else None}


def stores_by_argument(ttir, arg_names):
    """For each kernel argument, how many tt.store / tt.atomic ops write through it.

    Follows each store's pointer back through tt.addptr / tt.splat /
    tt.broadcast to the function argument it comes from. `arg_names` are the
    non-constexpr arguments, in order. MLIR reuses value names in sibling
    regions, so a name means its latest definition above the store.
    """
    defs, counts = {}, Counter()
    for line in ttir.splitlines():
        m = re.match(r"\s*(%[\w#.]+)(?::\d+)?\s*=\s*\"?([\w.]+)\"?\s*(.*)", line)
        if m:
            defs[m.group(1)] = (m.group(2), re.findall(r"%[\w#.]+", m.group(3)))
            continue
        m = re.match(r"\s*(tt\.store|tt\.atomic_\w+)\s+(%[\w#.]+)", line)
        if not m:
            continue
        value, seen = m.group(2), set()
        while value in defs and value not in seen:
            seen.add(value)
            op, operands = defs[value]
            if op not in ("tt.addptr", "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape") or not operands:
                break
            value = operands[0]
        # Triton 3.8 names the arguments (%DWp); earlier versions number them (%arg5).
        arg = re.fullmatch(r"%arg(\d+)", value)
        if arg and int(arg.group(1)) < len(arg_names):
            value = "%" + arg_names[int(arg.group(1))]
        counts[value[1:] if value[1:] in arg_names else "?"] += 1
    return dict(counts)


def compile_launch(launch, arch=90, **flag_overrides):
    """Compile a recorded launch for sm_<arch> (optionally with some constexprs changed)."""
    constexprs = dict(launch.constexprs, **flag_overrides)
    kernel = launch.kernel
    compiled_kernel = fn.compile_for_gpu(kernel, launch.args, constexprs, arch=arch, **launch.options)
    runtime_args = [p for p, a in zip([p for p in kernel.arg_names if p not in constexprs], launch.args)
                    if not (a is None or (isinstance(a, int) and not isinstance(a, bool) and a == 1))]
    return compiled_kernel, runtime_args


def main_backward_launch(rec):
    """The launch that does the backward's work (not the partial-sum reduction)."""
    return [lc for lc in rec.launches if lc.name != "_sum_partials_kernel"][-1]


def dce_report(ops, arch=90, with_ptxas=True):
    """Per op and backward variant: what the compiled kernel contains, and the flag tests' data."""
    report = {"triton": __import__("triton").__version__, "arch": arch, "ops": {}}
    for name, (op, size) in DCE_CASES.items():
        if op not in ops:
            continue
        entry = {"size": size_label(op, size), "variants": {}, "flips": {}}
        for variant, want in VARIANTS[op].items():
            rec = record_backward(op, size, want)
            main = main_backward_launch(rec)
            ck, names = compile_launch(main, arch)
            stats = ptx_stats(ck.asm["ptx"])
            stats.update(ptxas_usage(ck.asm["ptx"]) if with_ptxas else {})
            stats.update(kernel=main.name, launches=len(rec.launches),
                         grad_bytes=_grad_bytes(op, size, want),
                         scratch_bytes=rec.allocated_bytes - _grad_bytes(op, size, want),
                         stores_by_arg=stores_by_argument(ck.asm["ttir"], names),
                         any_atomics=sum(ptx_stats(compile_launch(lc, arch)[0].asm["ptx"])["atomics"]
                                         for lc in rec.launches))
            entry["variants"][variant] = stats
        # The flag itself: the trainable launch recompiled with one flag off and its
        # scratch pointer still passed. No store may reach that pointer.
        trainable = main_backward_launch(record_backward(op, size, VARIANTS[op]["trainable"]))
        for grad in ("dw", "db"):
            if grad not in VARIANTS[op]["trainable"]:
                continue
            ck, names = compile_launch(trainable, arch, **{FLAGS[grad]: False})
            entry["flips"][FLAGS[grad]] = {"pointer": scratch_pointer(op, FLAGS[grad]),
                                           "stores_by_arg": stores_by_argument(ck.asm["ttir"], names),
                                           **ptx_stats(ck.asm["ptx"])}
        report["ops"][name] = entry
    return report


# Sizes that take each of the planners' paths on a 132-SM GPU: rows in a
# tile, padded rows (in a tile, or on the long-row plan; the forwards' tiles
# in 4- and 8-byte vectors at 4608 and 5120), RMSNorm's rows of whole chunks
# under the higher register cap, the piped (in 16- and 8-byte vectors) and
# RELOAD's trained rows, LayerNorm's trained rows as a tile and a tail
# (9216, TWO_ACC_TAIL_MAX), long rows with the dw/db kernel, wide chunks;
# GroupNorm's long rows, one launch, two launches, statistics in pieces and
# runs of tiles.
PLAN_SIZES = {op: [(64, 512), (64, 1024), (64, 1280), (64, 4608), (64, 5120), (8, 12288), (8, 13312), (8, 14336),
                   (8, 16384), (8, 20480), (4, 65536)]
              for op in ("rms", "fadd", "ln", "poly")}
PLAN_SIZES["ln"].insert(5, (8, 9216))
PLAN_SIZES["gn"] = [(2, 6, 5, 7, 3), (16, 512, 64, 64, 32), (8, 1280, 32, 32, 32), (1, 512, 256, 256, 32),
                    (1, 32, 1024, 1024, 32), (1, 96, 512, 512, 32), (64, 128, 64, 64, 32), (8, 64, 33, 33, 32),
                    (1024, 64, 8, 8, 32)]


def record_forward(op, size, dtype=torch.bfloat16, num_sms=H200_SMS):
    """Launches and allocations of one forward call at `size`, on meta tensors."""
    meta = dict(device="meta", dtype=dtype)
    if op == "gn":
        B, C, H, W, G = size
        x, w = torch.empty(B, C, H, W, **meta), torch.empty(C, **meta)
        call = lambda: fn.group_norm_forward(x, G, w, w)  # noqa: E731
    else:
        M, N = size
        x, r, w = torch.empty(M, N, **meta), torch.empty(M, N, **meta), torch.empty(N, **meta)
        call = {
            "rms": lambda: fn.rms_norm_forward(x, (N,), w),
            "fadd": lambda: fn.fused_add_rms_norm_forward(x, r, w),
            "ln": lambda: fn.layer_norm_forward(x, (N,), w, w),
            "poly": lambda: fn.poly_norm_forward(x, torch.empty(3, **meta), torch.empty(1, **meta)),
        }[op]
    with recording(num_sms) as rec:
        call()
    return rec


def _code_path(value):
    """What of a launch argument shapes a kernel's code, roughly: a flag's
    value, whether an integer is 0, 1 (Triton makes it a constant) or more,
    a tensor's dtype, None. Block sizes and lengths only size the code."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return min(value, 2)
    return str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__


@contextlib.contextmanager
def planned_for(version):
    """The module plans as under Triton `version` (major, minor) inside the
    block, whatever Triton runs (see PIPED_ALL_TRITON)."""
    saved, fn._TRITON_VERSION = fn._TRITON_VERSION, version
    try:
        yield
    finally:
        fn._TRITON_VERSION = saved


# The Triton versions whose plans the module tells apart by code path: one
# before PIPED_ALL_TRITON, and that one. (CUDA13_PTXAS_TRITON changes register
# caps only, which `_code_path` does not tell apart.)
PLAN_TRITON_VERSIONS = ((fn.PIPED_ALL_TRITON[0], fn.PIPED_ALL_TRITON[1] - 1), fn.PIPED_ALL_TRITON)


def planned_launches(op):
    """One launch of each code path (`_code_path` of every argument) that the
    forward and each backward variant of `op` take at PLAN_SIZES, in bf16 and
    fp32, the backward as planned for each of PLAN_TRITON_VERSIONS."""
    seen = set()
    for size, dtype in itertools.product(PLAN_SIZES[op], (torch.bfloat16, torch.float32)):
        records = [record_forward(op, size, dtype)]
        for version in PLAN_TRITON_VERSIONS:
            with planned_for(version):
                records += [record_backward(op, size, want, dtype) for want in VARIANTS[op].values()]
        for launch in (lc for rec in records for lc in rec.launches):
            key = (launch.name, tuple(sorted((k, _code_path(v)) for k, v in launch.constexprs.items())),
                   tuple(map(_code_path, launch.args)))
            if key not in seen:
                seen.add(key)
                yield launch


class _CompileOnlyDriver:
    """As much of Triton's CUDA driver as `JITFunction.warmup` asks for: an
    sm_<arch> GPU as the current device. warmup compiles and launches nothing."""

    def __init__(self, arch):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("meta")


@contextlib.contextmanager
def compile_only_driver(arch):
    """Inside the block, Triton's launcher compiles for sm_<arch>, GPU or not.
    Afterwards the driver before it is back and the kernels forget the binders
    they built for it."""
    from triton.runtime import driver
    saved = driver._active   # reset_active() would look for a real GPU
    driver.set_active(_CompileOnlyDriver(arch))
    try:
        yield
    finally:
        driver._active = saved
        for name in KERNELS:
            getattr(fn, name).device_caches.clear()


def compile_plans(ops, arch=90):
    """Compile for sm_<arch> each of `planned_launches`, through Triton's own
    launcher (`JITFunction.warmup` under `compile_only_driver`): its binder
    takes each launch's keyword arguments as it does on a GPU. The interpreter
    runs the kernels' code but not Triton's compiler, whose checks (a
    loop-carried value must keep its type, say) only a compile makes, and it
    drops launch options it does not know, which the launcher rejects.
    Returns {op: {kernel: launches compiled}}."""
    compiled = {}
    with compile_only_driver(arch):
        for op in ops:
            counts = compiled.setdefault(op, Counter())
            for launch in planned_launches(op):
                launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.constexprs, **launch.options)
                counts[launch.name] += 1
    return {op: dict(c) for op, c in compiled.items()}


def _grad_bytes(op, size, want, element_size=2):
    """Bytes of the gradients a backward returns (bf16): dx, and dw/db if asked."""
    if op == "gn":
        B, C, H, W, _ = size
        numel, params = B * C * H * W, C
    else:
        numel, params = size[0] * size[1], (3 if op == "poly" else size[1])
    total = want["dx"] * numel * element_size + want["dw"] * params * element_size
    return total + want.get("db", 0) * (1 if op == "poly" else params) * element_size


REMOVED = {
    "COMPUTE_DW": "the dy*xhat accumulator and its FMAs, the (P x N) fp32 scratch, its stores and the partial-sum launch",
    "COMPUTE_DB": "the dy accumulator, the (P x N) fp32 scratch for db, its stores (and the launch when dw is frozen too)",
    "COMPUTE_DX": "the c1/c2 row reductions, the dx arithmetic and the dx stores (for long rows, the dx launch)",
}


def print_dce(report, short=False):
    print(f"\nWhat the compiler removes (Triton {report['triton']}, sm_{report['arch']}, bf16; scratch and launches "
          f"at the stated size with {H200_SMS} SMs)")
    head = f"{'op':8} {'size':16} {'variant':11} {'ld.glb':>6} {'st.glb':>6} {'atom':>4} {'instr':>6} " \
           f"{'regs':>4} {'spill':>5} {'launch':>6} {'scratch MiB':>11}"
    print(head)
    print("-" * len(head))
    for op, entry in report["ops"].items():
        for variant, s in entry["variants"].items():
            if short and variant not in ("trainable", "all frozen", "frozen w"):
                continue
            if short and op in ("ln", "gn", "gn-short", "poly") and variant == "frozen w":
                continue
            print(f"{op:8} {entry['size']:16} {variant:11} {s['ld_global']:>6} {s['st_global']:>6} "
                  f"{s['any_atomics']:>4} {s['instructions']:>6} {str(s.get('registers', '-')):>4} "
                  f"{str(s.get('spill_bytes', '-')):>5} {s['launches']:>6} {s['scratch_bytes'] / 2**20:>11.2f}")
    print("Each flag alone, trainable -> flag off with its scratch pointer still passed (TTIR stores through it):")
    for op, entry in report["ops"].items():
        base = entry["variants"]["trainable"]
        for flag, s in entry["flips"].items():
            pointer = s["pointer"]
            print(f"  {op:8} {flag}=False: {base['st_global']} -> {s['st_global']} PTX global stores, "
                  f"{base['instructions']} -> {s['instructions']} instructions, stores into {pointer} "
                  f"{base['stores_by_arg'].get(pointer, 0)} -> {s['stores_by_arg'].get(pointer, 0)}")
    for flag, what in REMOVED.items():
        print(f"  {flag}=False removes {what}.")


# ----------------------------------------------------------------------------
# Without a GPU
# ----------------------------------------------------------------------------

def interpreter_check():
    """Every op at a small size through the interpreter, against float64 (run with TRITON_INTERPRET=1)."""
    limits = {torch.float32: 1e-4, torch.bfloat16: 2e-2}   # fp32 arithmetic; one bf16 rounding
    ok = True
    for op in OP_NAMES:
        size = (2, 8, 5, 7, 4) if op == "gn" else (37, 300)
        for dtype in (torch.float32, torch.bfloat16):
            d = make_inputs(op, size, dtype, "cpu", True)
            outs = as_tuple(ours(op)(d))
            d64 = {k: (v.detach().double().requires_grad_() if isinstance(v, torch.Tensor) else v)
                   for k, v in d.items()}
            refs = as_tuple(reference(op)(d64))
            dys = [torch.randn_like(o) for o in outs]
            got = list(outs) + list(torch.autograd.grad(outs, grads_wanted(d), dys))
            want = list(refs) + list(torch.autograd.grad(refs, grads_wanted(d64), [g.double() for g in dys]))
            worst = max((torch.linalg.vector_norm(a.double() - b) / torch.linalg.vector_norm(b)).item()
                        for a, b in zip(got, want))
            ok = ok and worst < limits[dtype]
            print(f"  {OP_NAMES[op]:16} {str(dtype).replace('torch.', ''):9} forward and all gradients: "
                  f"max relative error vs float64 {worst:.1e}" + ("" if worst < limits[dtype] else "  FAILED"))
    return ok


def scratch_table(dtype=torch.bfloat16):
    """Bytes each backward allocates beyond the gradients it returns, trainable vs frozen."""
    print(f"\nScratch a backward allocates besides its gradients ({H200_SMS}-SM GPU, bf16):")
    print(f"  {'op':5} {'size':18} {'trainable MiB':>13} {'frozen MiB':>10}  launches trainable / frozen")
    for op in OP_NAMES:
        sizes = GROUP_SIZES if op == "gn" else ROW_SIZES
        for size in sizes:
            train = VARIANTS[op]["trainable"]
            frozen = {k: (1 if k == "dx" else 0) for k in train}
            r_t, r_f = record_backward(op, size, train, dtype), record_backward(op, size, frozen, dtype)
            s_t = r_t.allocated_bytes - _grad_bytes(op, size, train)
            s_f = r_f.allocated_bytes - _grad_bytes(op, size, frozen)
            print(f"  {op:5} {size_label(op, size):18} {s_t / 2**20:>13.2f} {s_f / 2**20:>10.2f}  "
                  f"{len(r_t.launches)} / {len(r_f.launches)}")


def has_cuda_backend():
    try:
        import triton.backends
        return "nvidia" in triton.backends.backends
    except Exception:
        return False


def run_without_gpu(args):
    print("No CUDA GPU found: checking every op through Triton's CPU interpreter at a small size, then showing "
          "what freezing saves (scratch memory, launches, compiled code). No timings: an interpreter time is not "
          "a speed.")
    env = dict(os.environ, TRITON_INTERPRET="1")
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--check"], env=env)
    ok = child.returncode == 0
    scratch_table()
    if has_cuda_backend():
        print_dce(dce_report(list(OP_NAMES)), short=not args.dce)
    else:
        print("\n(This Triton has no CUDA backend: no compiled-kernel report.)")
    return 0 if ok else 1


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def fmt(v, spec):
    return "-" if v != v else format(v, spec)


def print_table(rows, dtype_name, copy_GBps):
    by_op = {}
    for r in rows:
        by_op.setdefault(r.op, []).append(r)
    for op, op_rows in by_op.items():
        print(f"\n== {OP_NAMES[op]} ({dtype_name}) " + "=" * 90)
        print(f"{'size':18} {'provider':8} {'params':7} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} {'graph ms':>8} "
              f"{'fwd GB/s':>9} {'%copy':>6} {'bwd GB/s':>9} {'%copy':>6} {'bwd MiB':>8} {'frozen x':>8}")
        for r in op_rows:
            speedup = ""
            if r.mode == "frozen":
                twin = [t for t in op_rows if t.size == r.size and t.provider == r.provider and t.mode == "train"]
                if twin and r.bwd_ms == r.bwd_ms:
                    speedup = f"{twin[0].bwd_ms / r.bwd_ms:.2f}"
            line = (f"{r.size:18} {r.provider:8} {r.mode:7} {fmt(r.fwd_ms, '8.4f')} {fmt(r.bwd_ms, '8.4f')} "
                    f"{fmt(r.full_ms, '8.4f')} {fmt(r.graph_ms, '8.4f')} {fmt(r.fwd_GBps, '9.0f')} "
                    f"{fmt(r.fwd_pct_copy, '6.1f')} {fmt(r.bwd_GBps, '9.0f')} {fmt(r.bwd_pct_copy, '6.1f')} "
                    f"{fmt(r.bwd_extra_MiB, '8.1f')} {speedup:>8}")
            print(line + (f"  {r.note}" if r.note else ""))
    print(f"\nBandwidth: bytes_moved() over the median time; %copy: of the {copy_GBps:.0f} GB/s device-to-device "
          "copy measured in this run. 'frozen x': trainable bwd time / frozen bwd time. 'graph ms': forward + "
          "backward replayed from a CUDA graph, the host left out (graph_replay_ms).")


def print_kernel_table(rows, dtype_name, copy_GBps):
    """--kernel-time: what the GPU spends per call, and its bandwidth."""
    timed = [r for r in rows if r.fwd_kernel_us == r.fwd_kernel_us]
    if not timed:
        return
    print(f"\nKernel time per call ({dtype_name}): the time CUDA kernels ran in one call (CUPTI), host left out; "
          f"%copy of the {copy_GBps:.0f} GB/s copy")
    print(f"{'op':5} {'size':18} {'provider':8} {'params':7} {'fwd us':>8} {'%copy':>6} {'bwd us':>8} {'%copy':>6}")
    for r in timed:
        print(f"{r.op:5} {r.size:18} {r.provider:8} {r.mode:7} {r.fwd_kernel_us:8.1f} {r.fwd_kernel_pct_copy:6.1f} "
              f"{r.bwd_kernel_us:8.1f} {r.bwd_kernel_pct_copy:6.1f}")


def parse_sizes(text):
    rows, groups = [], []
    for item in text.split(","):
        if ":" in item:
            dims, g = item.split(":")
            groups.append(tuple(int(v) for v in dims.split("x")) + (int(g),))
        else:
            rows.append(tuple(int(v) for v in item.split("x")))
    return rows, groups


def commit():
    """The commit whose code runs, for the report: BENCH_COMMIT when set (a copy
    of the tree without its git history), else git's HEAD, marked when tracked
    files differ from it (a copy of a newer tree over an old checkout)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        if not head:
            return "unknown"
        changed = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    return f"{head} with uncommitted changes" if changed else head


def run_on_gpu(args):
    import triton
    dtype = DTYPES[args.dtype]
    ops = args.ops.split(",")
    row_sizes, group_sizes = (QUICK_ROW_SIZES, QUICK_GROUP_SIZES) if args.quick else (ROW_SIZES, GROUP_SIZES)
    if args.sizes:
        row_sizes, group_sizes = parse_sizes(args.sizes)
    rep = 40 if args.quick else 60   # ms of timed calls per median: 60+ samples at 1 ms a call
    providers = [p for p in args.providers.split(",") if not (p == "compile" and (args.quick or args.no_compile))]
    try:
        import importlib.metadata
        import liger_kernel  # noqa: F401
        liger_note = f"Liger-Kernel {importlib.metadata.version('liger-kernel')}"
    except ImportError:
        providers = [p for p in providers if p != "liger"]
        liger_note = "Liger-Kernel not importable: its column is skipped"
    if args.set:
        liger_note += "; tuning overrides: " + " ".join(args.set)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"commit {commit()}, {args.dtype}; {liger_note}")
    copy_GBps = copy_bandwidth("cuda", rep)
    print(f"device-to-device copy: {copy_GBps:.0f} GB/s (read + write)", flush=True)
    rows = []
    csv_file = open(args.csv, "w", newline="") if args.csv else None
    writer = csv.DictWriter(csv_file, fieldnames=list(Row.__dataclass_fields__)) if csv_file else None
    if writer:
        writer.writeheader()
    for op in ops:
        for size in (group_sizes if op == "gn" else row_sizes):
            try:
                validate(op, size, dtype)
            except Exception as e:   # a wrong result is reported, not timed
                rows.append(Row(op, "ours", size_label(op, size), "-", note=f"NOT TIMED: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:100] if str(e) else ''}"))
                continue
            for provider in providers:
                for mode in ("train", "frozen"):
                    try:
                        rows.append(measure(op, provider, size, dtype, mode, copy_GBps, rep, args.kernel_time))
                    except Exception as e:   # a competitor that cannot run this case gets a note
                        rows.append(Row(op, provider, size_label(op, size), mode, note=f"{type(e).__name__}: "
                                        f"{str(e).splitlines()[0][:80] if str(e) else ''}"))
                    torch.cuda.empty_cache()
            if writer:   # written as we go: a cut-short run keeps what it measured
                writer.writerows(r.__dict__ for r in rows if r.op == op and r.size == size_label(op, size))
                csv_file.flush()
            print(f"  done {op} {size_label(op, size)}", file=sys.stderr, flush=True)
    print_table(rows, args.dtype, copy_GBps)
    print_kernel_table(rows, args.dtype, copy_GBps)
    lora = [] if args.quick or "eager" not in providers else lora_case(dtype, rep, compile_block=not args.no_compile)
    if lora:
        print("\nRMSNorm feeding a LoRA linear (8192 x 4096, base weight frozen, rank-16 A and B trained), "
              "forward + backward:")
        for r in lora:
            compiled = r.get("block_compiled_ms")
            compiled_ms = "" if compiled is None else f"; compiled (reduce-overhead) {compiled:.3f} ms"
            print(f"  {r['provider']:6} norm weight {r['mode']:6}: block {r['block_ms']:.3f} ms, "
                  f"norm alone {r['norm_ms']:.3f} ms ({r['norm_share_pct']:.1f}% of the block); in a CUDA graph: "
                  f"block {r['block_graph_ms']:.3f} ms, norm alone {r['norm_graph_ms']:.3f} ms{compiled_ms}")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit(), "dtype": args.dtype, "copy_GBps": copy_GBps}
    if csv_file:
        csv_file.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [r.__dict__ for r in rows], "lora": lora}, f, indent=1)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OP_NAMES), help="comma-separated: rms,fadd,ln,gn,poly")
    p.add_argument("--sizes", help="comma-separated MxN for row ops and BxCxHxW:G for GroupNorm")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--quick", action="store_true", help="a few sizes, no torch.compile (about a minute)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument("--csv", help="write the raw rows to this CSV file")
    p.add_argument("--json", help="write the raw rows (and the LoRA case) to this JSON file")
    p.add_argument("--kernel-time", action="store_true",
                   help="also time the CUDA kernels of each call (torch.profiler), without the host")
    p.add_argument("--dce", action="store_true", help="print the full compiled-kernel report and exit")
    p.add_argument("--dce-json", help="write the compiled-kernel report as JSON to this file and exit")
    p.add_argument("--arch", type=int, default=90, help="compute capability for --dce: 90 (Hopper), 80 (Ampere)")
    p.add_argument("--plans-json", help="compile every code path the wrappers take (compile_plans) for --arch, "
                                        "write what was compiled as JSON to this file and exit")
    p.add_argument("--providers", default="ours,eager,compile,liger", help="comma-separated subset")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a tuning constant of frozen_norm for this run, e.g. --set ROW_BLOCK_MAX=8192")
    p.add_argument("--check", action="store_true", help=argparse.SUPPRESS)   # the interpreter check (child)
    args = p.parse_args(argv)
    for item in args.set:
        name, value = item.split("=")
        if not name.isupper() or not hasattr(fn, name):
            p.error(f"--set: frozen_norm has no tuning constant {name}")
        setattr(fn, name, float(value) if "." in value else int(value))
    if args.check:
        return 0 if interpreter_check() else 1
    if args.plans_json:
        if not has_cuda_backend():
            print("This Triton has no CUDA backend: nothing to compile.")
            return 0
        with open(args.plans_json, "w") as f:
            json.dump(compile_plans(args.ops.split(","), args.arch), f, indent=1)
        return 0
    if args.dce or args.dce_json:
        if not has_cuda_backend():
            print("This Triton has no CUDA backend: nothing to compile.")
            return 0
        report = dce_report(args.ops.split(","), args.arch)
        if args.dce_json:
            with open(args.dce_json, "w") as f:
                json.dump(report, f, indent=1)
        else:
            print_dce(report)
        return 0
    if not torch.cuda.is_available():
        return run_without_gpu(args)
    return run_on_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
