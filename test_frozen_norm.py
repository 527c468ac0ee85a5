"""Tests for frozen_norm: every op x dtype x shape x freeze pattern against float64.

Run: python -m pytest -q -n auto --dist worksteal test_frozen_norm.py (pytest-xdist: a worker a core)
Without a CUDA device the kernels run on the CPU through Triton's interpreter
(TRITON_INTERPRET=1 is set below, before frozen_norm imports triton's jit).
Tests marked `gpu` need a CUDA device and are skipped, with that reason, without one.
"""

import itertools
import json
import math
import os
import random
import subprocess
import sys
import zlib

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import frozen_norm as fn  # noqa: E402  (after TRITON_INTERPRET is decided)
from bench_frozen_norm import PLAN_TRITON_VERSIONS, FactoryOpMode  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")

# Relative L2 error allowed against the float64 reference, by the dtype of x.
# fp32: the kernels' fp32 arithmetic; bf16 / fp16: one rounding of the output
# (2^-9 and 2^-12 relative), with headroom for the rounding of the inputs to
# the parameter update and of mixed-dtype parameters.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
DTYPES = list(TOLERANCE)
DTYPE_IDS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

TRAIN, FROZEN, ABSENT = "train", "frozen", "absent"


def _fold_reduce(op, inputs):
    """A `tl.reduce` with a combine function of its own, for Triton's
    interpreter: the axis folded in halves, the combine function applied to
    whole arrays, log2(length) calls. The interpreter's own
    (`ReduceOps.generic_reduce`) calls it once per element, in Python:
    PolyNorm's triple sum (`_add3`) took 7.5 of the 7.6 s of a backward of
    1031 x 33 on the CPU here, and about a fifth of the suite. The sums come
    in another order, as the GPU's shuffle tree's do. What the kernels do not
    ask for (no axis, keep_dims, a length that is not a power of two) goes to
    the interpreter's own."""
    length = None if op.axis is None else inputs[0].handle.data.shape[op.axis]
    if length is None or op.keep_dims or length & (length - 1):
        return _INTERPRETER_REDUCE(op, inputs)
    arrays, dtypes = [t.handle.data for t in inputs], [t.dtype for t in inputs]
    while arrays[0].shape[op.axis] > 1:
        halves = [[op.to_tensor(h, d) for h in np.split(a, 2, axis=op.axis)] for a, d in zip(arrays, dtypes)]
        out = op.combine_fn.fn(*(lo for lo, _ in halves), *(hi for _, hi in halves))
        arrays = [t.handle.data for t in (out if isinstance(out, tuple) else (out,))]
    return [op.to_tensor(np.squeeze(a, axis=op.axis), d) for a, d in zip(arrays, dtypes)]


_INTERPRETER_REDUCE = _INTERPRETER_PATCH_LANG = _INTERPRETER_NP_DTYPE = _INTERPRETER_CONVERT = None
if not HAS_GPU:
    import numpy as np   # the interpreter's arrays
    import triton.language as tl
    from triton.runtime import interpreter
    _INTERPRETER_REDUCE = getattr(getattr(interpreter, "ReduceOps", None), "generic_reduce", None)
    _INTERPRETER_PATCH_LANG = getattr(interpreter, "_patch_lang", None)
    _INTERPRETER_NP_DTYPE = getattr(interpreter, "_get_np_dtype", None)
    _INTERPRETER_CONVERT = getattr(interpreter, "_convert_float", None)


class _LaunchPatch:
    """The interpreter's patch of `triton.language` for a launch, undone by
    `restore` when the launch ends. The interpreter patches the language
    again at every call of a `@triton.jit` helper inside the kernel (about a
    millisecond each, and our kernels make hundreds of such calls per row):
    `_patch_lang_once` does it once per launch for each module the helpers
    come from (ours, Triton's `standard`), as the interpreter's own calls
    would leave it."""
    patched = None   # while a launch runs: the globals of the modules done

    def __init__(self, fn):
        self.scope = _INTERPRETER_PATCH_LANG(fn)
        _LaunchPatch.patched = {id(fn.__globals__)}

    def restore(self):
        _LaunchPatch.patched = None
        self.scope.restore()


def _patch_lang_once(fn):
    """`_patch_lang` in place of the interpreter's: a launch's patch as
    before; a helper's only the first time its module is met in the launch
    (the interpreter never undoes a helper's patch either)."""
    done = _LaunchPatch.patched
    if done is None:
        return _LaunchPatch(fn)
    if id(fn.__globals__) not in done:
        done.add(id(fn.__globals__))
        return _INTERPRETER_PATCH_LANG(fn)
    return None


_NP_DTYPES = {}   # the interpreter's numpy dtype of each Triton scalar type, by its name


def _np_dtype_once(tt_dtype):
    """`_get_np_dtype` in place of the interpreter's, which builds a dict of
    every Triton type at each call (several calls an op): the answer for a
    scalar type (or a block's element type) asked for once, then kept."""
    element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
    np_dtype = _NP_DTYPES.get(element.name)
    if np_dtype is None:
        np_dtype = _NP_DTYPES[element.name] = _INTERPRETER_NP_DTYPE(element)
    return np_dtype


def _subnormal(bits):
    """Which fp32 bit patterns (uint32) are subnormal: exponent 0, significand not."""
    return ((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)


def _shift_convert(data, src_dtype, dst_dtype, rounding_mode):
    """`_convert_float` in place of the interpreter's, for its casts between
    fp32 and bf16 without a rounding mode (a kernel's `.to()`). Its bit
    arithmetic there (sign, exponent and significand apart, a dozen numpy
    passes) comes to a shift for every input but a subnormal: bf16 is the
    top half of fp32's bits (truncated: the interpreter does not round to
    nearest, as a GPU does). Arrays that hold a subnormal, other types and
    rounding modes go to the interpreter's own. `test_interpreter_casts`
    checks that the two agree bit for bit."""
    if rounding_mode is None and (src_dtype, dst_dtype) in ((tl.float32, tl.bfloat16), (tl.bfloat16, tl.float32)):
        # fp32's bits either way (a bf16 value's in the top half): the subnormals show alike.
        bits = data.view(np.uint32) if src_dtype == tl.float32 else data.view(np.uint16).astype(np.uint32) << 16
        if not _subnormal(bits).any():
            # np.asarray: a 0-d array stays one (numpy's shift of it is a scalar)
            return np.asarray((bits >> 16).astype(np.uint16) if dst_dtype == tl.bfloat16 else bits)
    return _INTERPRETER_CONVERT(data, src_dtype, dst_dtype, rounding_mode)


@pytest.fixture(autouse=True, scope="session")
def _fast_interpreter():
    """For the session, `_fold_reduce` in place of the interpreter's reduce,
    `_patch_lang_once` of its `_patch_lang`, `_np_dtype_once` of its
    `_get_np_dtype` and `_shift_convert` of its `_convert_float`, each where
    the interpreter has it (on a GPU nothing changes). `_patch_lang_once`
    halved the suite's time on the CPU here; the kernels' arithmetic is the
    interpreter's either way."""
    with pytest.MonkeyPatch.context() as patch:
        if _INTERPRETER_REDUCE is not None:
            patch.setattr(interpreter.ReduceOps, "generic_reduce", _fold_reduce)
        if _INTERPRETER_PATCH_LANG is not None:
            patch.setattr(interpreter, "_patch_lang", _patch_lang_once)
        if _INTERPRETER_NP_DTYPE is not None:
            patch.setattr(interpreter, "_get_np_dtype", _np_dtype_once)
        if _INTERPRETER_CONVERT is not None:
            patch.setattr(interpreter, "_convert_float", _shift_convert)
        yield


@pytest.mark.skipif(HAS_GPU, reason="checks a patch of Triton's CPU interpreter, made only without a CUDA device")
def test_interpreter_casts():
    """`_shift_convert` gives the interpreter's own `_convert_float` bits:
    every bf16 bit pattern to fp32, and fp32 to bf16 on random bit patterns
    with infinities, NaNs, zeros and the bounds of the normal range;
    without subnormals (the shift) and with them (the interpreter's own)."""
    def same(data, src, dst):
        ours, theirs = _shift_convert(data, src, dst, None), _INTERPRETER_CONVERT(data, src, dst, None)
        assert type(ours) is type(theirs) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert np.array_equal(ours, theirs), f"{src} to {dst}"

    bf16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    subnormal = _subnormal(bf16.astype(np.uint32) << 16)
    same(bf16[~subnormal].reshape(-1, 2), tl.bfloat16, tl.float32)
    same(bf16, tl.bfloat16, tl.float32)
    same(np.array(0x3F80, dtype=np.uint16), tl.bfloat16, tl.float32)   # a scalar's 0-d array
    edges = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
             0x7F7FFFFF, 0x00800000, 0x0080FFFF, 0x3F808000, 0xBF7FFFFF]
    bits = np.concatenate([np.array(edges, dtype=np.uint32),
                           np.random.default_rng(0).integers(0, 1 << 32, size=1 << 20, dtype=np.uint32)])
    subnormal = _subnormal(bits)
    same(bits[~subnormal].view(np.float32), tl.float32, tl.bfloat16)
    same(bits[:4096].view(np.float32).reshape(64, 64), tl.float32, tl.bfloat16)
    assert subnormal[:4096].any()
    same(np.array(-1.5, dtype=np.float32), tl.float32, tl.bfloat16)


def _bool_mask(method, position, what):
    """The interpreter builder's `method` (a masked load or store), which
    first checks that the mask at argument `position` holds bools. Triton
    3.9's interpreter rejects any other ("mask has unsupported dtype"); 3.6's
    and 3.8's take an int32 mask too, so without this check a kernel that
    makes one (a scalar comparison or-ed into a block: `_skew_edges`) would
    pass here and fail on a newer Triton."""
    def checked(self, *args):
        mask = args[position].data
        assert mask.dtype == np.bool_, f"a masked {what}'s mask holds {mask.dtype}, not bool"
        return method(self, *args)
    return checked


@pytest.fixture(autouse=True, scope="session")
def _bool_masks():
    """For the session, the interpreter's masked loads and stores check that
    their masks are bools (`_bool_mask`); on a GPU nothing changes."""
    with pytest.MonkeyPatch.context() as patch:
        if not HAS_GPU:
            builder = interpreter.InterpreterBuilder
            patch.setattr(builder, "create_masked_load", _bool_mask(builder.create_masked_load, 1, "load"))
            patch.setattr(builder, "create_masked_store", _bool_mask(builder.create_masked_store, 2, "store"))
        yield


@pytest.fixture(autouse=True)
def _seed(request):
    """Fresh random inputs for every test, reproducible from its name."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def rel_error(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "non-finite values"
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def elementwise_error(out, ref):
    """The largest error of one element, against its reference's size plus
    the mean size: one wrong element among thousands fails it, where
    `rel_error` would average it away."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(out).all(), "non-finite values"
    return ((out - ref).abs() / (ref.abs() + ref.abs().mean())).max().item()


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale + shift).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------
# One description per op: how to make inputs, call the kernel and the reference
# ----------------------------------------------------------------------------

class Op:
    """Inputs, the op under test and its float64 reference, for one norm."""

    def __init__(self, name, params, absent_ok, make, run, reference):
        self.name, self.params, self.absent_ok = name, params, absent_ok
        self.make, self.run, self.reference = make, run, reference


def _rms_make(shape, dtype):
    N = shape[-1]
    return {"x": randn(*shape, dtype=dtype, shift=0.5), "weight": randn(N, dtype=dtype, shift=1.0)}


def _fadd_make(shape, dtype):
    d = _rms_make(shape, dtype)
    d["residual"] = randn(*shape, dtype=dtype)
    return d


def _ln_make(shape, dtype):
    N = shape[-1]
    return {"x": randn(*shape, dtype=dtype, scale=2.0, shift=3.0), "weight": randn(N, dtype=dtype, shift=1.0),
            "bias": randn(N, dtype=dtype)}


def _gn_make(shape, dtype):
    C = shape[1]
    return {"x": randn(*shape, dtype=dtype, scale=2.0, shift=1.0), "weight": randn(C, dtype=dtype, shift=1.0),
            "bias": randn(C, dtype=dtype)}


def _poly_make(shape, dtype):
    return {"x": randn(*shape, dtype=dtype), "weight": randn(3, dtype=dtype, scale=0.5, shift=0.3),
            "bias": randn(1, dtype=dtype)}


OPS = {
    "rms": Op("rms", ["weight"], True, _rms_make,
              lambda d, **k: fn.rms_norm(d["x"], d["x"].shape[-1:], d["weight"], 1e-5, **k),
              lambda d, **k: fn.rms_norm_reference(d["x"], d["x"].shape[-1:], d["weight"], 1e-5, **k)),
    "fadd": Op("fadd", ["weight"], True, _fadd_make,
               lambda d, **k: fn.fused_add_rms_norm(d["x"], d["residual"], d["weight"], 1e-5, **k),
               lambda d, **k: _fadd_reference(d, **k)),
    "ln": Op("ln", ["weight", "bias"], True, _ln_make,
             lambda d: fn.layer_norm(d["x"], d["x"].shape[-1:], d["weight"], d["bias"]),
             lambda d: fn.layer_norm_reference(d["x"], d["x"].shape[-1:], d["weight"], d["bias"])),
    "gn": Op("gn", ["weight", "bias"], True, _gn_make,
             lambda d: fn.group_norm(d["x"], d["groups"], d["weight"], d["bias"]),
             lambda d: fn.group_norm_reference(d["x"], d["groups"], d["weight"], d["bias"])),
    "poly": Op("poly", ["weight", "bias"], False, _poly_make,
               lambda d: fn.poly_norm(d["x"], d["weight"], d["bias"]),
               lambda d: fn.poly_norm_reference(d["x"], d["weight"], d["bias"])),
}


def _fadd_reference(d, offset=0.0):
    # s is rounded to x's dtype, as the kernel (and a transformer block) does.
    s = (d["x"] + d["residual"]).to(d["dtype"]).to(torch.float64)
    return fn.rms_norm_reference(s, s.shape[-1:], d["weight"], 1e-5, offset), s


def input_names(op):
    return ["x", "residual"] if op.name == "fadd" else ["x"]


def freeze_patterns(op):
    """Every combination: each parameter trained, frozen or absent; each input with or without grad."""
    param_states = [TRAIN, FROZEN] + ([ABSENT] if op.absent_ok else [])
    for params in itertools.product(param_states, repeat=len(op.params)):
        for inputs in itertools.product([True, False], repeat=len(input_names(op))):
            yield dict(zip(op.params, params)), dict(zip(input_names(op), inputs))


def pattern_id(params, inputs):
    p = "-".join(f"{k[0]}:{v}" for k, v in params.items())
    i = "-".join(f"d{k[0]}" if v else f"no-d{k[0]}" for k, v in inputs.items())
    return f"{p}-{i}"


def small_case(name):
    """(shape, groups) of a small call of op `name`: 37 rows of 100, or for
    GroupNorm 2 x 6 x 5 x 7 in 3 groups; masks not all true in either."""
    return ((2, 6, 5, 7), 3) if name == "gn" else ((37, 100), None)


def prepare(op, shape, dtype, params, inputs, groups=None, param_dtype=None):
    """Inputs for one test: leaves with the requested requires_grad, absent params None."""
    d = op.make(shape, dtype)
    for name in op.params:
        if params[name] == ABSENT:
            d[name] = None
        else:
            if param_dtype is not None:
                d[name] = d[name].to(param_dtype)
            d[name].requires_grad_(params[name] == TRAIN)
    for name, needs in inputs.items():
        d[name].requires_grad_(needs)
    d["groups"], d["dtype"] = groups, dtype
    return d


def as_tuple(outs):
    """An op's outputs as a tuple (FusedAddRMSNorm returns two, the others one)."""
    return outs if isinstance(outs, tuple) else (outs,)


def reference_of(op, d, **kw):
    """Float64 copies of the inputs and the reference outputs computed from them."""
    d64 = dict(d)
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            d64[k] = v.detach().to("cpu", torch.float64).requires_grad_(v.requires_grad)
    out = op.reference(d64, **kw)
    return d64, as_tuple(out)


def grad_outputs(outs):
    # A small nonzero mean keeps the reference's sums (db, PolyNorm's scalar dw and
    # db) away from cancellation, where a relative error would measure the condition
    # number; 0.1 keeps PolyNorm's db over 2 x 70001 elements inside fp16's range.
    return [randn(*o.shape, dtype=o.dtype, shift=0.1) for o in outs]


def check_op(op, shape, dtype, params, inputs, groups=None, param_dtype=None, layout=None, along_y=False,
             elementwise=False, twice=False, **kw):
    """Forward and backward of one configuration against float64; returns the
    inputs used. `layout`, if given, makes each input a differently laid out
    tensor of the same values (`LAYOUTS`). `along_y`: each output's gradient
    is the output plus noise, not noise alone, so that a row's sum of xhat * g
    (c1) is large and an error in it shows in dx (with dy independent of y, c1
    is about N^-1/2 of g and hides under 16-bit tolerances). `elementwise`:
    the outputs and the inputs' gradients also element by element
    (`elementwise_error`). `twice`: then one more run with the same dys
    (`_outputs_and_grads`), bitwise the same outputs and gradients."""
    d = prepare(op, shape, dtype, params, inputs, groups, param_dtype)
    if layout is not None:
        for k in input_names(op):
            d[k] = layout(d[k].detach()).requires_grad_(inputs[k])
    outs = as_tuple(op.run(d, **kw))
    d64, refs = reference_of(op, d, **kw)
    tol = TOLERANCE[dtype]
    for out, ref in zip(outs, refs):
        assert out.dtype == dtype and out.shape == d["x"].shape
        assert rel_error(out, ref) < tol, f"output error {rel_error(out, ref):.2e}"
        if elementwise:
            assert elementwise_error(out, ref) < tol, f"output error {elementwise_error(out, ref):.2e} (an element)"
    leaves = [k for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    if not leaves:
        assert not any(o.requires_grad for o in outs)
        return d
    assert [o.requires_grad for o in outs] == [r.requires_grad for r in refs]
    all_outs = outs
    outs, refs = zip(*[(o, r) for o, r in zip(outs, refs) if o.requires_grad])
    dys = grad_outputs(outs)
    if along_y:
        dys = [(o.detach().float() + dy.float()).to(o.dtype) for o, dy in zip(outs, dys)]
    torch.autograd.backward(outs, dys)
    torch.autograd.backward(refs, [dy.to("cpu", torch.float64) for dy in dys])
    for k, v in d.items():
        if not isinstance(v, torch.Tensor) or k == "groups":
            continue
        if v.requires_grad:
            assert v.grad is not None, f"{k}.grad missing"
            assert v.grad.dtype == v.dtype and v.grad.shape == v.shape
            err = rel_error(v.grad, d64[k].grad)
            # a gradient is rounded to its own dtype, which may be coarser than x's
            assert err < 2 * max(tol, TOLERANCE[v.dtype]), f"d{k} error {err:.2e}"
            if elementwise and v.shape == d["x"].shape:
                err = elementwise_error(v.grad, d64[k].grad)
                assert err < 2 * tol, f"d{k} error {err:.2e} (an element)"
        else:
            assert v.grad is None, f"frozen {k} got a gradient"
    if twice:
        assert not kw, "the second run (`_outputs_and_grads`) takes no keywords"
        grads = [v.grad for v in d.values() if isinstance(v, torch.Tensor) and v.requires_grad]
        _assert_same_bits(list(all_outs) + grads, _outputs_and_grads(op, d, dys))
    return d


# ----------------------------------------------------------------------------
# Correctness: op x dtype x shape x every freeze pattern
# ----------------------------------------------------------------------------

# Shapes for the full freeze-pattern sweep: rows that are no multiple of any
# tile, a 3-D input, and (GroupNorm) no spatial dims, and a row split over
# programs (B * G below the interpreter's SM count).
ROW_SHAPES = [(37, 100), (3, 5, 129)]
GROUP_SHAPES = [((2, 6, 5, 7), 3), ((1, 8, 9), 2), ((5, 24), 3)]


def _sweep():
    for name, op in OPS.items():
        shapes = GROUP_SHAPES if name == "gn" else [(s, None) for s in ROW_SHAPES]
        for (shape, groups), dtype, (params, inputs) in itertools.product(shapes, DTYPES, freeze_patterns(op)):
            yield pytest.param(name, shape, groups, dtype, params, inputs,
                               id=f"{name}-{DTYPE_IDS[dtype]}-{'x'.join(map(str, shape))}-{pattern_id(params, inputs)}")


@pytest.mark.parametrize("name, shape, groups, dtype, params, inputs", list(_sweep()))
def test_freeze_patterns(name, shape, groups, dtype, params, inputs):
    check_op(OPS[name], shape, dtype, params, inputs, groups)


ALL_TRAIN = {"rms": {"weight": TRAIN}, "fadd": {"weight": TRAIN}, "ln": {"weight": TRAIN, "bias": TRAIN},
             "gn": {"weight": TRAIN, "bias": TRAIN}, "poly": {"weight": TRAIN, "bias": TRAIN}}
ALL_FROZEN = {k: {p: FROZEN for p in v} for k, v in ALL_TRAIN.items()}


def _with_grads(name):
    return {k: True for k in input_names(OPS[name])}


# Larger and odd shapes, with all parameters trained and all frozen: rows far
# past ROW_BLOCK_MAX (the long-row kernels), 4-D, one row, many short rows.
BIG_ROW_SHAPES = [(2, 70001), (2, 3, 4, 64), (1, 7), (1031, 33)]
BIG_GROUP_SHAPES = [((2, 4, 130, 131), 2), ((2, 4, 3, 4, 5), 2), ((1, 64, 3, 3), 1)]
# The long odd row trained costs the interpreter most (the dw/db kernel over
# 70001 columns): one dtype an op, each dtype in some op; frozen in every one.
BIG_ROW_TRAINED_DTYPE = {"rms": torch.bfloat16, "fadd": torch.float16, "ln": torch.float32, "poly": torch.bfloat16}


def _big():
    for name in OPS:
        shapes = BIG_GROUP_SHAPES if name == "gn" else [(s, None) for s in BIG_ROW_SHAPES]
        for (shape, groups), dtype, mode in itertools.product(shapes, DTYPES, ["train", "frozen"]):
            if shape == (2, 70001) and mode == "train" and dtype != BIG_ROW_TRAINED_DTYPE[name]:
                continue
            yield pytest.param(name, shape, groups, dtype, mode,
                               id=f"{name}-{DTYPE_IDS[dtype]}-{'x'.join(map(str, shape))}-{mode}")


@pytest.mark.parametrize("name, shape, groups, dtype, mode", list(_big()))
def test_shapes(name, shape, groups, dtype, mode):
    params = (ALL_TRAIN if mode == "train" else ALL_FROZEN)[name]
    check_op(OPS[name], shape, dtype, params, _with_grads(name), groups)


def _long_rows_from(n, monkeypatch, presum=False):
    """Rows longer than n take the long-row kernels (PolyNorm's too, forward
    and backward); with `presum`, their forwards pre-sum (LONG_FWD_PRESUM_AFTER)."""
    monkeypatch.setattr(fn, "ROW_BLOCK_MAX", n)
    monkeypatch.setattr(fn, "RESIDUAL_ROW_BLOCK_MAX", n)
    monkeypatch.setattr(fn, "POLY_ROW_BLOCK_MAX", n)
    monkeypatch.setattr(fn, "POLY_FWD_ROW_BLOCK_MAX", n)
    if presum:
        monkeypatch.setattr(fn, "LONG_FWD_PRESUM_AFTER", n)


def _rows_for(row_block_max, N):
    """Rows for a test of rows of N: 37, but 13 where they are longer than
    row_block_max (`_long_rows_from`): the long-row kernels run a program per
    row, which the interpreter pays for."""
    return 37 if N <= row_block_max else 13


@pytest.mark.parametrize("name, presum", [("rms", False), ("fadd", False), ("ln", False), ("ln", True),
                                          ("poly", False), ("poly", True)])
@pytest.mark.parametrize("mode", ["train", "frozen"])
def test_long_rows(name, mode, presum, monkeypatch):
    """The long-row path (rows longer than ROW_BLOCK_MAX; PolyNorm's backward
    past POLY_ROW_BLOCK_MAX, its forward past POLY_FWD_ROW_BLOCK_MAX) at a
    small, cheap size: 13 rows of 200 columns in chunks of 32 (the half chunk
    pads less than 64), the last one partial; the forwards with per-lane
    sums, and with pre-sums where they take them (LayerNorm, PolyNorm)."""
    _long_rows_from(64, monkeypatch, presum)
    tiling = fn._row_tiling(13, 200)
    assert not tiling.one_pass and tiling.block_n == 32
    params = (ALL_TRAIN if mode == "train" else ALL_FROZEN)[name]
    check_op(OPS[name], (13, 200), torch.float32, params, _with_grads(name))


def _columns_cases():
    for name in ("rms", "fadd", "ln"):
        for params, inputs in freeze_patterns(OPS[name]):
            yield pytest.param(name, params, inputs, torch.bfloat16, id=f"{name}-bf16-{pattern_id(params, inputs)}")
        trained = {p: TRAIN for p in OPS[name].params}
        yield pytest.param(name, trained, _with_grads(name), torch.float32, id=f"{name}-fp32-trained")


# The columns path's launches, as `_columns_flags` gives them.
COLUMNS_PAIR = [("_long_row_norm_bwd_kernel", True, None), ("_row_norm_dwdb_kernel", None, True)]


def _columns_flags(name, constexprs):
    """(name, CONSTANTS_ONLY, COMPUTE_DX) of a launch (None: not its flag)."""
    return name, constexprs.get("CONSTANTS_ONLY"), constexprs.get("COMPUTE_DX")


@pytest.mark.parametrize("name, params, inputs, dtype", list(_columns_cases()))
def test_columns_dx(name, params, inputs, dtype, monkeypatch):
    """Trained rows past COLUMNS_DX_ROW_BYTES (here 256 bytes: 13 rows of
    200, in chunks of 32 past a ROW_BLOCK_MAX of 64), dx asked: the long-row
    kernel's pass 1 alone (CONSTANTS_ONLY, k1 and k0 stored) and the dw/db
    kernel with COMPUTE_DX for dx with dw/db, against float64, under
    every freeze pattern; the pair exactly where a parameter trains and dx
    is asked, else the usual launches. Gradients along y, so that an error in
    k1 shows in dx; on the columns path, bitwise the same on one more run,
    which takes the pair again."""
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "RELOAD_ROW_BLOCK_MAX", 64)   # no row a tile either
    monkeypatch.setattr(fn, "COLUMNS_DX_ROW_BYTES", 256)
    launches = _spied(monkeypatch, ["_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"])
    columns = TRAIN in params.values() and (inputs["x"] or inputs.get("residual", False))
    check_op(OPS[name], (13, 200), dtype, params, inputs, along_y=True, twice=columns)
    got = [_columns_flags(name, constexprs) for name, constexprs in launches]
    if columns:
        assert got == COLUMNS_PAIR * 2, got
    else:
        assert not set(COLUMNS_PAIR) & set(got), got


@pytest.mark.parametrize("name", ["rms", "ln"])
def test_columns_dx_limit(name, monkeypatch):
    """COLUMNS_DX_ROW_BYTES by the launches (recorded, fp32 rows of 100: 400
    bytes), trained with dx: rows longer than the limit take the columns
    path in every call; rows of exactly the limit only where the dw/db
    kernel would not run beside (here DW_BESIDE_EAGER off), else beside;
    shorter rows never."""
    from bench_frozen_norm import record_backward
    _long_rows_from(64, monkeypatch)
    want = {"dx": True, "dw": True, "db": True} if name == "ln" else {"dx": True, "dw": True}
    columns = COLUMNS_PAIR
    after = [("_long_row_norm_bwd_kernel", False, None), ("_row_norm_dwdb_kernel", None, False)]
    for limit, beside, expected in [(399, False, columns), (399, True, columns), (400, False, columns),
                                    (400, True, after), (401, False, after), (401, True, after)]:
        monkeypatch.setattr(fn, "COLUMNS_DX_ROW_BYTES", limit)
        monkeypatch.setattr(fn, "DW_BESIDE_EAGER", beside)
        rec = record_backward(name, (11, 100), want, torch.float32, fn.INTERPRETER_SMS)
        got = [_columns_flags(lc.name, lc.constexprs) for lc in rec.launches]
        assert got == expected, (limit, beside, got)
        if expected is after:
            assert rec.launches[-1].constexprs["LAST_FIRST"] is not beside


def _spied(monkeypatch, names):
    """The launches of fn's kernels `names`, run as usual and recorded as
    (name, constexprs), in order."""
    launches = []

    class Spy:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(fn, name)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.name, kwargs))
                return self.kernel[grid](*args, **kwargs)
            return launch
    for name in names:
        monkeypatch.setattr(fn, name, Spy(name))
    return launches


def _poly_patterns():
    for params, inputs in freeze_patterns(OPS["poly"]):
        yield pytest.param(params, inputs, id=pattern_id(params, inputs))


@pytest.mark.parametrize("params, inputs", list(_poly_patterns()))
def test_poly_long_rows_freeze_patterns(params, inputs, monkeypatch):
    """PolyNorm's long-row backward (`_long_poly_norm_bwd_kernel`, past a
    POLY_ROW_BLOCK_MAX of 64) under every freeze pattern: dw or db alone, with
    and without dx (no pass 2), 13 bf16 rows of 200 in chunks of 32."""
    _long_rows_from(64, monkeypatch)
    check_op(OPS["poly"], (13, 200), torch.bfloat16, params, inputs)


@pytest.mark.parametrize("P, n_a, n_b, fold, bands", [
    (37, 3, 1, 64, []),          # no fold: one launch
    (37, 3, 1, 8, [5]),          # 37 rows in 5 bands of 8, then those 5
    (37, 3, 1, 4, [10, 3]),      # folded twice: 37 -> 10 -> 3
    (300, 70, 0, 128, [3]),      # one wide partial: 3 column blocks a band
])
def test_reduce_partials_fold(P, n_a, n_b, fold, bands, monkeypatch):
    """`_reduce_partials` on fp32 partials (views with a row stride, as
    PolyNorm's (P, 4) scratch) against float64 sums: partials taller than
    PARTIAL_FOLD_ROWS fold in bands of that many rows first, once per fold."""
    monkeypatch.setattr(fn, "PARTIAL_FOLD_ROWS", fold)
    launches, launch = [], fn._launch_sum_partials

    def recorded(pairs, band_rows, n):
        launches.append(n)
        launch(pairs, band_rows, n)
    monkeypatch.setattr(fn, "_launch_sum_partials", recorded)
    scratch = randn(P, n_a + n_b, shift=1.0)
    outs = [torch.empty(n, dtype=dtype, device=DEVICE) for n, dtype in ((n_a, torch.float32), (n_b, torch.bfloat16))]
    fn._reduce_partials((scratch[:, :n_a], outs[0]), (scratch[:, n_a:] if n_b else None, outs[1]))
    assert launches == bands + [1]
    ref = scratch.double().sum(0).cpu()
    assert rel_error(outs[0], ref[:n_a]) < 1e-6
    if n_b:
        assert rel_error(outs[1], ref[n_a:]) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("dtype, N, warps", [(torch.bfloat16, 1536, 1), (torch.bfloat16, 2304, 1),
                                             (torch.bfloat16, 2048, fn.MIN_WARPS), (torch.bfloat16, 2560, fn.MIN_WARPS),
                                             (torch.float32, 1536, fn.MIN_WARPS), (torch.float32, 2304, fn.MIN_WARPS)])
def test_poly_warp_rows_plan(dtype, N, warps):
    """PolyNorm's long-row kernels on one warp for 16-bit rows up to
    POLY_WARP_ROW_MAX (real limits) but powers of two; fp32 rows, 2048 and
    longer rows keep MIN_WARPS. The forward's first launch, and the
    backward's where the row is padded (2048 is in a tile there)."""
    x = torch.empty(3, N, device="meta", dtype=dtype)
    w3, b1 = torch.empty(3, device="meta"), torch.empty(1, device="meta")
    calls = {"forward": lambda: fn.poly_norm_forward(x, w3, b1)}
    if N != fn._pow2(N):
        calls["backward"] = lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3].float())
    for what, launch in _first_launches(calls).items():
        assert launch.name.startswith("_long_poly") and launch.num_warps == warps, (what, launch.name)


def _first_launch(name, call, size, dtype):
    """The first launch of op `name`'s `call` ("forward", or a backward
    variant of VARIANTS) at `size` (as the benchmark's), on meta tensors,
    recorded, not run."""
    from bench_frozen_norm import VARIANTS, record_backward, record_forward
    if call == "forward":
        return record_forward(name, size, dtype).launches[0]
    return record_backward(name, size, VARIANTS[name][call], dtype).launches[0]


# (op, the first launch of: "forward" or a backward variant, N, dtype, its chunk)
# WHOLE_MAX_CHUNKS: halving further where that leaves at most that many whole
# chunks, but not where UNROLL unrolls the plan's partial last chunk.
WHOLE_CHUNK_CASES = [
    ("poly", "forward", 18432, torch.bfloat16, 2048), ("ln", "forward", 18432, torch.float16, 2048),   # 9 whole
    ("ln", "all frozen", 18432, torch.bfloat16, 2048), ("rms", "frozen w", 18432, torch.bfloat16, 2048),
    ("poly", "all frozen", 18432, torch.bfloat16, 2048), ("rms", "trainable", 18432, torch.float16, 2048),
    ("poly", "trainable", 18432, torch.bfloat16, 2048),
    ("poly", "forward", 4608, torch.bfloat16, 1024),     # 4.5 x 1024, unrolled: not 9 x 512
    ("poly", "forward", 9216, torch.float16, 2048),      # 4.5 x 2048, unrolled: not 9 x 1024
    ("ln", "forward", 9216, torch.bfloat16, 2048), ("ln", "all frozen", 9216, torch.bfloat16, 2048),
    ("ln", "trainable", 9216, torch.float32, 2048),      # (16-bit: a tile and a tail, TWO_ACC_TAIL_MAX)
    ("poly", "forward", 6656, torch.bfloat16, 1024),     # 13 x 512 would be whole: more than WHOLE_MAX_CHUNKS
    ("ln", "all frozen", 13312, torch.bfloat16, 2048),   # 13 x 1024
    ("poly", "forward", 12800, torch.bfloat16, 2048),    # no halving makes whole chunks (25 x 512)
    ("rms", "forward", 9216, torch.bfloat16, 2048),      # RMSNorm's forward (one sum) keeps one halving
    ("fadd", "frozen w", 18432, torch.bfloat16, 4096),   # and so does FusedAdd's backward (ds)
    ("poly", "forward", 4608, torch.float32, 1024),      # and fp32 rows
    ("ln", "forward", 9216, torch.float32, 2048), ("rms", "frozen w", 18432, torch.float32, 4096)]
# LONG_WIDE_CHUNK_MAX: chunks of 16384 where they fit whole, in the forwards
# with one row sum and the backwards with several (GroupNorm's: below).
WIDE_CHUNK_CASES = [
    ("rms", "forward", 65536, torch.bfloat16, 16384), ("fadd", "forward", 49152, torch.bfloat16, 16384),
    ("poly", "all frozen", 65536, torch.bfloat16, 16384), ("poly", "trainable", 65536, torch.bfloat16, 16384),
    ("poly", "trainable", 98304, torch.float16, 16384),
    ("ln", "all frozen", 65536, torch.bfloat16, 16384), ("ln", "trainable", 49152, torch.float16, 16384),
    ("rms", "forward", 36864, torch.bfloat16, 4096),     # chunks of 16384 would leave a partial one
    ("rms", "forward", 65536, torch.float32, 8192),      # fp32 rows keep LONG_CHUNK_MAX
    ("ln", "forward", 65536, torch.bfloat16, 8192),      # and so do the forwards with several sums,
    ("poly", "forward", 65536, torch.bfloat16, 8192),
    ("rms", "frozen w", 65536, torch.bfloat16, 8192),    # and the backwards with one sum
    ("fadd", "frozen w", 65536, torch.bfloat16, 8192)]


# LONG_MIN_CHUNKS: the backwards with several row sums take six chunks of
# 4096 where a quarter rounded up leaves three of 8192 (20481 to 24576).
MIN_CHUNK_CASES = [
    ("ln", "all frozen", 24576, torch.bfloat16, 4096), ("ln", "trainable", 24576, torch.float16, 4096),
    ("poly", "all frozen", 24576, torch.bfloat16, 4096), ("poly", "trainable", 24576, torch.bfloat16, 4096),
    ("ln", "frozen w", 20488, torch.bfloat16, 4096),     # the last chunks partial: still six
    ("poly", "trainable", 22528, torch.bfloat16, 4096),
    ("ln", "forward", 24576, torch.bfloat16, 8192),      # not the forwards,
    ("poly", "forward", 24576, torch.bfloat16, 8192),
    ("rms", "frozen w", 24576, torch.bfloat16, 8192),    # nor the backwards with one sum,
    ("fadd", "trainable", 24576, torch.bfloat16, 8192),
    ("ln", "all frozen", 24576, torch.float32, 8192),    # nor fp32 rows;
    ("ln", "all frozen", 32768, torch.bfloat16, 8192),   # four chunks of 8192 stay,
    ("ln", "all frozen", 12288, torch.bfloat16, 4096)]   # and three of 4096


# HALVED_MAX_CHUNKS: the kernels with one row sum on 16-bit rows (RMSNorm's
# forward, its and FusedAdd's dx backward on rows in 16-byte vectors), and the
# forwards of fp32 rows, keep chunks of 4096 where halving would make more
# than that many.
HALVED_CHUNK_CASES = [
    ("rms", "forward", 13312, torch.bfloat16, 4096), ("rms", "forward", 12544, torch.float16, 4096),
    ("ln", "forward", 13312, torch.float32, 4096), ("poly", "forward", 14336, torch.float32, 4096),
    ("rms", "frozen w", 13312, torch.bfloat16, 4096),   # not 13 x 1024 (LONG_BWD_SPILL_CHUNK_MIN)
    ("rms", "frozen w", 14336, torch.float16, 4096),    # not 7 x 2048 (WHOLE_MAX_CHUNKS)
    ("fadd", "frozen w", 12544, torch.bfloat16, 4096),
    ("rms", "trainable", 12289, torch.bfloat16, 2048),  # rows not in 16-byte vectors keep the halving:
    ("fadd", "trainable", 14335, torch.float16, 2048),  # the dx launch of a trained backward
    ("fadd", "frozen w", 12801, torch.bfloat16, 2048),
    ("rms", "forward", 10240, torch.bfloat16, 2048),    # five chunks of 2048
    ("fadd", "frozen w", 10240, torch.bfloat16, 2048),
    ("ln", "forward", 13312, torch.bfloat16, 2048),     # 16-bit rows with several sums: halved
    ("poly", "forward", 12800, torch.float16, 2048), ("ln", "all frozen", 12800, torch.bfloat16, 2048),
    ("rms", "frozen w", 12800, torch.float32, 2048),    # and the backwards of fp32 rows
    ("fadd", "trainable", 14335, torch.float32, 2048)]


@pytest.mark.parametrize("name, call, N, dtype, chunk",
                         WHOLE_CHUNK_CASES + WIDE_CHUNK_CASES + MIN_CHUNK_CASES + HALVED_CHUNK_CASES)
def test_chunk_rules(name, call, N, dtype, chunk):
    """The long-row plans' chunk rules on 16-bit rows. WHOLE_MAX_CHUNKS: the
    forwards of LayerNorm and PolyNorm and the backwards of RMSNorm,
    LayerNorm and PolyNorm, frozen or trained, halve their chunks further
    where that leaves at most that many whole ones, but not where UNROLL
    unrolls the partial last chunk of the plan before; else one halving
    (the last chunk partial). LONG_WIDE_CHUNK_MAX: the forwards with one row
    sum (RMSNorm's, FusedAdd's) and the backwards with several (LayerNorm's,
    PolyNorm's) take chunks of that length where they fit the row whole; the
    others keep LONG_CHUNK_MAX. LONG_MIN_CHUNKS: the backwards with several
    row sums halve chunks of LONG_CHUNK_MAX where a row has fewer than that
    many (the others keep them). fp32 rows keep their plans, but
    HALVED_MAX_CHUNKS: RMSNorm's forward, its and FusedAdd's dx backward of
    16-bit rows in 16-byte vectors, and the forwards of fp32 rows keep chunks
    of 4096 where halving would make more than that many. The first launch,
    on meta tensors; some of these plans (bf16 and fp32) then run against
    float64."""
    launch = _first_launch(name, call, (3, N), dtype)
    assert launch.name.startswith("_long_") and launch.constexprs["BLOCK_N"] == chunk, launch.name
    runs = {("poly", "forward", 4608): ALL_FROZEN, ("ln", "all frozen", 9216): ALL_FROZEN,
            ("poly", "trainable", 18432): ALL_TRAIN, ("rms", "forward", 65536): ALL_FROZEN,
            ("poly", "trainable", 65536): ALL_TRAIN, ("ln", "all frozen", 65536): ALL_FROZEN,
            ("poly", "trainable", 22528): ALL_TRAIN, ("rms", "forward", 13312): ALL_FROZEN,
            ("ln", "forward", 13312): ALL_TRAIN, ("poly", "forward", 14336): ALL_TRAIN,
            ("rms", "frozen w", 13312): ALL_FROZEN, ("rms", "trainable", 12289): ALL_TRAIN}
    if dtype in (torch.bfloat16, torch.float32) and (name, call, N) in runs:
        check_op(OPS[name], (3, N), dtype, runs[name, call, N][name], _with_grads(name))


@pytest.mark.parametrize("call, dtype, chunk", [("all frozen", torch.bfloat16, 16384),
                                                ("trainable", torch.bfloat16, 8192),
                                                ("all frozen", torch.float32, 8192)])
def test_wide_chunks_group_norm(call, dtype, chunk):
    """GroupNorm's backward on the long-row kernel takes chunks of
    LONG_WIDE_CHUNK_MAX with w and b frozen (per-lane sums), not with them
    trained (per-channel sums), on 16-bit rows (16 x 512 x 64 x 64 in 32
    groups, rows of 65536, on meta tensors); then rows of 65536 (2 x 4 x 128
    x 128, one group) against float64."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward("gn", (16, 512, 64, 64, 32), VARIANTS["gn"][call], dtype).launches[0]
    assert launch.name.startswith("_long_row") and launch.constexprs["BLOCK_N"] == chunk, launch.name
    if dtype == torch.bfloat16:
        params = (ALL_FROZEN if call == "all frozen" else ALL_TRAIN)["gn"]
        check_op(OPS["gn"], (2, 4, 128, 128), dtype, params, _with_grads("gn"), groups=1)


# GroupNorm's long-row backward: (size, first launch, dtype, its chunk).
GROUP_MIN_CHUNK_CASES = [
    ((64, 192, 64, 64, 32), "all frozen", torch.bfloat16, 4096),   # rows of 6 x 4096: halved (LONG_MIN_CHUNKS),
    ((64, 192, 64, 64, 32), "trainable", torch.bfloat16, 4096),
    ((64, 192, 64, 64, 32), "all frozen", torch.float32, 8192),    # not in fp32,
    ((64, 192, 64, 64, 32), "forward", torch.bfloat16, 8192),      # nor in the forward;
    ((64, 256, 64, 64, 32), "trainable", torch.bfloat16, 4096),    # trained, 8 of 4096 too,
    ((64, 320, 64, 64, 32), "trainable", torch.bfloat16, 4096),    # and 10 of 4096 (GROUP_TRAINED_MIN_CHUNKS),
    ((64, 384, 64, 64, 32), "trainable", torch.bfloat16, 8192),    # not 12 of 4096,
    ((64, 1024, 32, 32, 32), "trainable", torch.bfloat16, 8192),   # nor channels of 1024 (GROUP_TRAINED_MIN_HW),
    ((64, 256, 64, 64, 32), "all frozen", torch.bfloat16, 8192)]   # nor 8 of 4096 with w and b frozen


@pytest.mark.parametrize("size, call, dtype, chunk", GROUP_MIN_CHUNK_CASES)
def test_min_chunks_group_norm(size, call, dtype, chunk):
    """GroupNorm's backward on the long-row kernel, frozen or trained, takes
    six chunks of 4096 on 16-bit rows of three chunks of 8192
    (LONG_MIN_CHUNKS); with w or b trained also on rows of four or five,
    where a channel has GROUP_TRAINED_MIN_HW positions or more
    (GROUP_TRAINED_MIN_CHUNKS); its forward and fp32 rows keep 8192. The
    first launch, on meta tensors (32 groups). Then rows of 6 and 8 channels
    of 4096 (one group), so planned, against float64."""
    launch = _first_launch("gn", call, size, dtype)
    assert launch.name.startswith("_long_row") and launch.constexprs["BLOCK_N"] == chunk, launch.name
    runs = {((64, 192, 64, 64, 32), "all frozen"): (2, 6, 64, 64),
            ((64, 192, 64, 64, 32), "trainable"): (2, 6, 64, 64),
            ((64, 256, 64, 64, 32), "trainable"): (2, 8, 64, 64)}
    if dtype == torch.bfloat16 and (size, call) in runs:
        params = (ALL_FROZEN if call == "all frozen" else ALL_TRAIN)["gn"]
        check_op(OPS["gn"], runs[size, call], dtype, params, _with_grads("gn"), groups=1)


@pytest.mark.parametrize("warp_row_max, warps, tail", [(fn.POLY_WARP_ROW_MAX, 1, 8), (100, fn.MIN_WARPS, 32)],
                         ids=["one-warp-tail-block", "masked"])
def test_poly_long_rows_tail(warp_row_max, warps, tail, monkeypatch):
    """PolyNorm's long-row kernels on rows of 200 in chunks of 32, the last
    one partial (8 elements): in one-warp programs (rows up to
    POLY_WARP_ROW_MAX) as a block of 8 of its own; past it (here 100, with
    a LONG_CHUNK_MIN of 32) on MIN_WARPS warps, masked in a chunk of 32
    (TAIL, as launched); both against float64."""
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "POLY_WARP_ROW_MAX", warp_row_max)
    monkeypatch.setattr(fn, "LONG_CHUNK_MIN", 32)
    x, _, _, w3, b1 = _meta_rows(200)
    first = _first_launches({"forward": lambda: fn.poly_norm_forward(x, w3, b1),
                             "backward": lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3])})
    for launch in first.values():
        assert launch.name.startswith("_long_poly") and launch.num_warps == warps, launch.name
        assert (launch.constexprs["BLOCK_N"], launch.constexprs["TAIL"]) == (32, tail)
    check_op(OPS["poly"], (37, 200), torch.float32, ALL_TRAIN["poly"], _with_grads("poly"))
    check_op(OPS["poly"], (37, 200), torch.bfloat16, ALL_FROZEN["poly"], _with_grads("poly"))


def test_poly_long_rows_folded(monkeypatch):
    """PolyNorm's long-row backward leaves one partial row per row (37 here):
    with PARTIAL_FOLD_ROWS = 8 its dw and db fold in bands before the final
    sum, against float64."""
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "PARTIAL_FOLD_ROWS", 8)
    check_op(OPS["poly"], (37, 200), torch.float32, ALL_TRAIN["poly"], _with_grads("poly"))


@pytest.mark.parametrize("name", ["rms", "fadd", "ln", "poly"])
def test_long_row_chunk_past_the_row(name, monkeypatch):
    """The long-row kernels with LONG_MIN_CHUNKS = 1 (a tuning override): the
    first chunk is wider than the row, so lanes past N hold no element."""
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "LONG_MIN_CHUNKS", 1)
    tiling = fn._row_tiling(37, 100)
    assert not tiling.one_pass and tiling.block_n == 128
    check_op(OPS[name], (37, 100), torch.float32, ALL_TRAIN[name], _with_grads(name))


# Backward patterns with one trained parameter, hence one accumulator (the
# condition of the piped rows and of RELOAD).
ONE_TRAINED = [("rms", {"weight": TRAIN}), ("fadd", {"weight": TRAIN}), ("ln", {"weight": TRAIN, "bias": FROZEN}),
               ("ln", {"weight": FROZEN, "bias": TRAIN})]


# Triton versions as the planner reads them: one before PIPED_ALL_TRITON (as
# 3.6, on the H200 of NOTES.md) and that one (3.8). CUDA13_PTXAS_TRITON's caps
# have their own test (test_long_row_backward_ptxas_cap).
TRITON_VERSIONS = PLAN_TRITON_VERSIONS
VERSION_IDS = ["triton%d.%d" % v for v in TRITON_VERSIONS]


def _one_acc_limits(monkeypatch, version):
    """Small limits for the rows past a tile that train one parameter: tiles
    up to 64, piped rows up to 192 (3/4 of their tile of 256) and of 256 (the
    whole tile), between them RELOAD for the variants that take it there, w
    held up to 144 from PIPED_ALL_TRITON on (W_HELD_ROW_MAX), LayerNorm's
    with dw and db at 192 (TWO_ACC_FOLDED_ROW), and from PIPED_ALL_TRITON on
    past 160 (TWO_ACC_TAIL_MAX 96) up to it; the planner told that Triton is
    at `version` (PIPED_ALL_TRITON)."""
    monkeypatch.setattr(fn, "ROW_BLOCK_MAX", 64)
    monkeypatch.setattr(fn, "PIPED_ROW_MAX", 192)
    monkeypatch.setattr(fn, "TWO_ACC_FOLDED_ROW", 192)
    monkeypatch.setattr(fn, "TWO_ACC_TAIL_MAX", 96)
    monkeypatch.setattr(fn, "W_HELD_ROW_MAX", 144)
    monkeypatch.setattr(fn, "RELOAD_ROW_BLOCK_MAX", 256)
    monkeypatch.setattr(fn, "_TRITON_VERSION", version)


def _reloads(name, want, N, version):
    """Whether a one-parameter row of N (16-bit, not in narrow vectors) takes
    RELOAD by the rule of PIPED_ALL_TRITON: before it, RMSNorm's and
    LayerNorm's rows that train w (not FusedAdd's with ds) past PIPED_ROW_MAX
    and short of RELOAD_ROW_BLOCK_MAX."""
    return (version < fn.PIPED_ALL_TRITON and name != "fadd" and want["dw"]
            and fn.PIPED_ROW_MAX < N < fn.RELOAD_ROW_BLOCK_MAX)


def _one_acc_plan(name, N, want, dtype=torch.bfloat16):
    """How one recorded backward call of 37 rows of N runs, and whether it
    loads w per tile (W_PER_TILE): in the tile kernel, "piped" (a row per
    tile, N a compile-time constant), "reload" (a row per tile, x and dy
    loaded twice) or "tile" (whole tiles as always); (None, None) where it
    takes the long-row kernels instead."""
    from bench_frozen_norm import record_backward
    launches = record_backward(name, (37, N), want, dtype).launches
    names = [lc.name for lc in launches]
    if "_row_norm_bwd_kernel" not in names:
        assert {"_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"} & set(names), names
        return None, None
    assert names[1:] in ([], ["_sum_partials_kernel"]), names
    c = launches[0].constexprs
    if c["N_CONST"]:
        assert (c["N_CONST"], c["RELOAD"]) == (N, False)
        return "piped", c["W_PER_TILE"]
    return ("reload" if c["RELOAD"] else "tile"), c["W_PER_TILE"]


def _launch_key(recording):
    """What the interpreter runs of a recorded call: each launch's kernel,
    grid, compile-time constants and options."""
    return [(lc.name, lc.grid, sorted(lc.constexprs.items()), sorted(lc.options.items()))
            for lc in recording.launches]


@pytest.mark.parametrize("N", [128, 176, 208, 256])
@pytest.mark.parametrize("name, params", ONE_TRAINED, ids=lambda v: v if isinstance(v, str) else pattern_id(v, {}))
def test_one_acc_backward(name, params, N, monkeypatch):
    """Rows past ROW_BLOCK_MAX, up to RELOAD_ROW_BLOCK_MAX, whose backward
    trains one parameter take the tile kernel, a row per tile: piped (dw or
    db added before the row reductions, N a compile-time constant; in a
    full tile, masked lanes' xhat not zeroed), or with RELOAD (x and dy
    loaded a second time for dx and dw) where `_reloads` says, at small
    limits: 128, 176, 208 and 256 columns (multiples of 16) in tiles of
    256, 37 rows looping over the programs (the last tiles past M), under
    the plans of both Triton versions, run once where both launch the same
    kernels; FusedAdd with both outputs used (ds); fp16, as both take
    16-bit inputs only. Bitwise the same outputs and gradients on a second
    run."""
    from bench_frozen_norm import record_backward, record_forward
    want = {"dx": 1, "dw": params["weight"] == TRAIN}
    if "bias" in params:
        want["db"] = params["bias"] == TRAIN
    ran = []
    for version in TRITON_VERSIONS:
        _one_acc_limits(monkeypatch, version)
        assert _one_acc_plan(name, N, want, torch.float16)[0] == (
            "reload" if _reloads(name, want, N, version) else "piped"), version
        plan = (_launch_key(record_forward(name, (37, N), torch.float16, fn.INTERPRETER_SMS)),
                _launch_key(record_backward(name, (37, N), want, torch.float16, fn.INTERPRETER_SMS)))
        if plan not in ran:
            ran.append(plan)
            _check_twice(name, (37, N), torch.float16, params)


OLD_TRITON, NEW_TRITON = TRITON_VERSIONS   # before PIPED_ALL_TRITON, and from it on


@pytest.mark.parametrize("version, name, want, N, plan, per_tile", [
    (OLD_TRITON, "rms", dict(dx=1, dw=1), 176, "piped", True), (OLD_TRITON, "rms", dict(dx=1, dw=1), 192, "piped", True),
    (OLD_TRITON, "ln", dict(dx=1, dw=0, db=1), 96, "piped", True), (OLD_TRITON, "ln", dict(dx=1, dw=0, db=1), 176, "piped", True),
    (OLD_TRITON, "fadd", dict(dx=1, dw=1), 176, "piped", True),
    # past PIPED_ROW_MAX: RELOAD where w trains without ds, LayerNorm's loading w per tile
    (OLD_TRITON, "rms", dict(dx=1, dw=1), 208, "reload", False), (OLD_TRITON, "ln", dict(dx=1, dw=1, db=0), 208, "reload", True),
    (OLD_TRITON, "fadd", dict(dx=1, dw=1), 208, "piped", True), (OLD_TRITON, "ln", dict(dx=1, dw=0, db=1), 208, "piped", True),
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 208, "piped", True), (NEW_TRITON, "ln", dict(dx=1, dw=1, db=0), 208, "piped", True),
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 176, "piped", True), (NEW_TRITON, "fadd", dict(dx=1, dw=1), 176, "piped", True),
    # up to W_HELD_ROW_MAX from PIPED_ALL_TRITON on: w held, whatever the depth
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 144, "piped", False), (NEW_TRITON, "fadd", dict(dx=1, dw=1), 128, "piped", False),
    (NEW_TRITON, "ln", dict(dx=1, dw=1, db=0), 128, "piped", False), (NEW_TRITON, "ln", dict(dx=1, dw=0, db=1), 96, "piped", False),
    (OLD_TRITON, "ln", dict(dx=1, dw=1, db=0), 128, "piped", True),
    (OLD_TRITON, "rms", dict(dx=1, dw=1, dtype=torch.float32), 208, None, None),   # fp32: twice the registers, it spills
    (NEW_TRITON, "rms", dict(dx=1, dw=1, dtype=torch.float32), 176, None, None),
    (OLD_TRITON, "ln", dict(dx=1, dw=1, db=1), 176, None, None),     # two accumulators: the long-row kernels here
    # (at the real limits a tile and a tail: `test_layer_norm_two_acc_tail`), but at TWO_ACC_FOLDED_ROW,
    # and from PIPED_ALL_TRITON on past ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX up to it
    (NEW_TRITON, "ln", dict(dx=1, dw=1, db=1), 192, "piped", True), (OLD_TRITON, "ln", dict(dx=1, dw=1, db=1), 192, "piped", True),
    (NEW_TRITON, "ln", dict(dx=1, dw=1, db=1), 176, "piped", True), (NEW_TRITON, "ln", dict(dx=1, dw=1, db=1), 160, None, None),
    (NEW_TRITON, "ln", dict(dx=1, dw=1, db=1), 208, None, None), (NEW_TRITON, "ln", dict(dx=0, dw=1, db=1), 192, None, None),
    (NEW_TRITON, "rms", dict(dx=1, dw=0), 176, None, None),          # nothing trained: the long-row dx kernel alone
    (NEW_TRITON, "rms", dict(dx=0, dw=1), 176, None, None),          # no dx: the dw/db kernel reads x and dy once
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 201, None, None),          # odd: the loads would not vectorize
    (OLD_TRITON, "rms", dict(dx=1, dw=1), 169, None, None),
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 200, "piped", True),       # 8 x 25: 16-byte vectors (ALIGN)
    (OLD_TRITON, "rms", dict(dx=1, dw=1), 256, "piped", True),       # RELOAD_ROW_BLOCK_MAX: the row fills its tile
    (OLD_TRITON, "fadd", dict(dx=1, dw=1), 256, "piped", True), (OLD_TRITON, "ln", dict(dx=1, dw=1, db=0), 256, "piped", True),
    (OLD_TRITON, "ln", dict(dx=1, dw=0, db=1), 256, "piped", True), (NEW_TRITON, "ln", dict(dx=1, dw=1, db=0), 256, "piped", True),
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 272, None, None),          # past RELOAD_ROW_BLOCK_MAX
    (NEW_TRITON, "rms", dict(dx=1, dw=1), 48, "tile", False),        # within ROW_BLOCK_MAX: the tile kernel as always
    (OLD_TRITON, "fadd", dict(dx=1, dw=1), 48, "tile", False),
    # w's buffers short of the full depth (FusedAdd's with ds in a tile of 16384 on an H200):
    (OLD_TRITON, "fadd", dict(dx=1, dw=1, shallow=True), 176, "piped", False),   # held
    (NEW_TRITON, "fadd", dict(dx=1, dw=1, shallow=True), 176, "piped", False),
    (OLD_TRITON, "fadd", dict(dx=1, dw=1, shallow=True), 208, "piped", True),    # past PIPED_ROW_MAX per tile all the same
    (NEW_TRITON, "rms", dict(dx=1, dw=1, shallow=True), 256, "piped", True),
])
def test_one_acc_plan_is_chosen(version, name, want, N, plan, per_tile, monkeypatch):
    """Which rows the backward pipes or reloads, at small limits (64, 192 and
    256) and the plans of both Triton versions (PIPED_ALL_TRITON), and which
    load w per tile (W_PER_TILE): LayerNorm's RELOAD with dw, which spills
    holding w through the loop, and the piped rows past PIPED_ROW_MAX
    always, up to it where w's pipeline buffers fit at full depth (no GPU
    here: they do, but in the `shallow` cases, where the depth is made one
    less; the buffers: `test_pipeline_buffers_fit_shared_memory`), but from
    PIPED_ALL_TRITON on not up to W_HELD_ROW_MAX; every other launch holds
    it. Their results: `test_one_acc_backward`."""
    _one_acc_limits(monkeypatch, version)
    want = dict(want)
    if want.pop("shallow", False):
        monkeypatch.setattr(fn, "_pipeline_stages", lambda *args, **kwargs: fn.PIPELINE_STAGES - 1)
    assert _one_acc_plan(name, N, want, want.pop("dtype", torch.bfloat16)) == (plan, per_tile)


@pytest.mark.parametrize("version", TRITON_VERSIONS, ids=VERSION_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_acc_plan_at_real_limits(dtype, version, monkeypatch):
    """The one-parameter rows at the real limits, in a tile of 16384 on 16
    warps, by the rule of PIPED_ALL_TRITON. From it on every row piped, in
    16-byte vectors, w held up to W_HELD_ROW_MAX and per tile past it (the
    buffers fit at full depth here). Before it, RELOAD where `_reloads`
    says but at 14336, and narrow vectors (VEC = PIPED_VEC_ELEMENTS, w
    held) on RMSNorm's and FusedAdd's piped rows that end in the first half
    of a thread's last 16-byte repeat of 4096 (8193 to 10240, multiples of
    16), and past PIPED_ROW_MAX on every variant's rows that end exactly at
    that half (14336), piped so instead of taking RELOAD; no other row, and
    not LayerNorm's piped rows."""
    from bench_frozen_norm import record_backward
    monkeypatch.setattr(fn, "_TRITON_VERSION", version)
    warps = fn.RELOAD_ROW_BLOCK_MAX // 32 // fn.RELOAD_ELEMENTS_PER_THREAD
    one = {"rms": dict(dx=1, dw=1), "fadd": dict(dx=1, dw=1), "ln dw": dict(dx=1, dw=1, db=0),
           "ln db": dict(dx=1, dw=0, db=1)}
    old = version < fn.PIPED_ALL_TRITON
    for label, want in one.items():
        name = label.split()[0]
        for N in (8208, 9216, 9728, 10240, 10256, 11264, 12288, 12304, 13312, 14336, 14352, 15360, 16384):
            launch = record_backward(name, (4, N), want, dtype).launches[0]
            c = launch.constexprs
            assert (launch.name, c["BLOCK_N"], launch.num_warps) == (
                "_row_norm_bwd_kernel", fn.RELOAD_ROW_BLOCK_MAX, warps), (label, N)
            narrow = old and (N == 14336 or (name in ("rms", "fadd") and N <= 10240))
            piped = narrow or not _reloads(name, want, N, version)
            assert (c["VEC"], c["N_CONST"], c["RELOAD"]) == (
                fn.PIPED_VEC_ELEMENTS if narrow else 0, N if piped else 0, not piped), (label, N)
            if narrow:
                assert not c["W_PER_TILE"], (label, N)
            elif N > fn.PIPED_ROW_MAX:
                assert c["W_PER_TILE"] == (piped or name == "ln"), (label, N)
            else:
                assert c["W_PER_TILE"] == (old or N > fn.W_HELD_ROW_MAX), (label, N)


@pytest.mark.parametrize("version", TRITON_VERSIONS, ids=VERSION_IDS)
def test_one_acc_backward_real_limits(version, monkeypatch):
    """Past RELOAD_ROW_BLOCK_MAX (16400) the long-row kernels. Under the plan
    of a Triton before PIPED_ALL_TRITON, RMSNorm's trainable backward on rows
    of 9008 and 16384 piped in a tile of 16384 (bf16), in narrow vectors on
    rows of 10240 and 14336, and with RELOAD on a row of 12304; FusedAdd's
    and LayerNorm's one-parameter variants in narrow vectors at 14336. Under
    the plan from it on, RMSNorm's on rows of 9008, 12304 and 16384, and the
    other variants at 12304, all piped in 16-byte vectors. The plans:
    `test_one_acc_plan_at_real_limits`."""
    from bench_frozen_norm import VARIANTS, record_backward
    monkeypatch.setattr(fn, "_TRITON_VERSION", version)
    longer = record_backward("rms", (4, fn.RELOAD_ROW_BLOCK_MAX + 16), VARIANTS["rms"]["trainable"]).launches
    assert [lc.name for lc in longer][:2] == ["_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"]
    old = version < fn.PIPED_ALL_TRITON
    rms_rows = (9008, 10240, fn.PIPED_ROW_MAX + 16, 14336, fn.RELOAD_ROW_BLOCK_MAX) if old else (
        9008, fn.PIPED_ROW_MAX + 16, fn.RELOAD_ROW_BLOCK_MAX)
    for N in rms_rows:
        check_op(OPS["rms"], (3, N), torch.bfloat16, ALL_TRAIN["rms"], _with_grads("rms"))
    for name, params in ONE_TRAINED[1:]:   # the other variants: in narrow vectors, or past PIPED_ROW_MAX
        check_op(OPS[name], (3, 14336 if old else fn.PIPED_ROW_MAX + 16), torch.bfloat16, params, _with_grads(name))


def test_fused_add_forward_keeps_longer_rows_in_one_tile(monkeypatch):
    """FusedAddRMSNorm's forward holds rows up to RESIDUAL_ROW_BLOCK_MAX in one
    tile, past ROW_BLOCK_MAX where RMSNorm's takes the long-row kernel; its
    backward is RMSNorm's. At the real limits (a row of 20000 in a tile of
    32768), then with limits of 64 and 256 at 200 columns."""
    from bench_frozen_norm import recording
    check_op(OPS["fadd"], (3, 20000), torch.bfloat16, ALL_TRAIN["fadd"], _with_grads("fadd"))
    assert fn._row_tiling(3, 20000, block_max=fn.RESIDUAL_ROW_BLOCK_MAX)[:3] == (1, 32768, True)
    monkeypatch.setattr(fn, "ROW_BLOCK_MAX", 64)
    monkeypatch.setattr(fn, "RESIDUAL_ROW_BLOCK_MAX", 256)
    x = torch.empty(37, 200, device="meta")
    with recording() as rec:
        fn.fused_add_rms_norm_forward(x, x, x[0])
        fn.rms_norm_forward(x, (200,), x[0])
        fn.fused_add_rms_norm_backward(x, x, x, x[0], x[:, 0])
    assert [(lc.name, lc.constexprs["BLOCK_N"]) for lc in rec.launches[:3]] == [
        ("_row_norm_fwd_kernel", 256), ("_long_row_norm_fwd_kernel", 32), ("_long_row_norm_bwd_kernel", 32)]
    check_op(OPS["fadd"], (37, 200), torch.float32, ALL_TRAIN["fadd"], _with_grads("fadd"))


def _meta_rows(N):
    """Meta tensors for the plan tests: x (3, N) bf16, r (3,) (rstd or mean),
    w (N,), and PolyNorm's w (3,) and b (1,)."""
    x = torch.empty(3, N, device="meta", dtype=torch.bfloat16)
    return x, torch.empty(3, device="meta"), x[0], torch.empty(3, device="meta"), torch.empty(1, device="meta")


def _first_launches(calls):
    """{name: the first launch of call()} for {name: call}, recorded, not run."""
    from bench_frozen_norm import recording
    first = {}
    for what, call in calls.items():
        with recording() as rec:
            call()
        first[what] = rec.launches[0]
    return first


@pytest.mark.parametrize("N", [2048, 2304, 3072, 3584, 4608, 5120, 7168, 10240, 12288])
def test_padded_rows_plan(N):
    """Rows longer than PADDED_ROW_MIN that fill at most PADDED_ROW_FILL of
    their power-of-two tile (real limits): the forward, the backward without
    dw/db and PolyNorm's backward take the long-row kernels; FusedAdd's
    forward and a trained row-norm backward keep the tile kernels, and so do
    the forwards of 16-bit rows that 16-byte vectors leave a partial repeat
    of a thread's lanes (NARROW_VEC_ELEMENTS: 2304, 4608, 5120; the rule's own
    test is test_narrow_forward_plan). The kernels each call launches first,
    on meta tensors."""
    padded = fn.PADDED_ROW_MIN < N <= fn.PADDED_ROW_FILL * fn._pow2(N)
    assert padded == (N in (2304, 3072, 4608, 5120, 10240, 12288))
    if N == 4608:   # halved twice, down to 9 x 512 (LONG_CHUNK_MIN)
        assert fn._row_tiling(3, N, padded_long=True).block_n == 512
    long_rows, long_poly = padded or N > fn.ROW_BLOCK_MAX, padded or N > fn.POLY_ROW_BLOCK_MAX
    long_forward = long_rows and N not in (2304, 4608, 5120)
    x, r, w, w3, b1 = _meta_rows(N)
    calls = {
        "rms forward": (lambda: fn.rms_norm_forward(x, (N,), w), long_forward),
        "ln forward": (lambda: fn.layer_norm_forward(x, (N,), w, w), long_forward),
        "fadd forward": (lambda: fn.fused_add_rms_norm_forward(x, x, w), False),
        "rms backward, w frozen": (lambda: fn.rms_norm_backward(x, x, w, r, compute_dw=False), long_rows),
        "ln backward, w and b frozen": (lambda: fn.layer_norm_backward(x, x, w, w, r, r, True, False, False),
                                        long_rows),
        "rms backward, w trained": (lambda: fn.rms_norm_backward(x, x, w, r), N > fn.RELOAD_ROW_BLOCK_MAX),
        "poly backward, frozen": (lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3], True, False, False),
                                  long_poly),
        "poly backward, trained": (lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3]), long_poly),
    }
    first = _first_launches({what: call for what, (call, _) in calls.items()})
    for what, (_, long) in calls.items():
        assert first[what].name.startswith("_long_") == long, (what, first[what].name)


@pytest.mark.parametrize("N", [384, 576, 768, 896, 1024, 1152, 1280, 1536])
def test_padded_short_rows_plan(N, monkeypatch):
    """Rows of PADDED_ROW_MIN or less that fill at most PADDED_ROW_FILL of
    their tile (real limits). PolyNorm's forward and backward and RMSNorm's
    frozen backward take the long-row kernels for rows over
    PADDED_SHORT_ROW_MIN (chunks of 256 on one warp up to 1024, of 512 on
    MIN_WARPS beyond, PolyNorm's on one warp up to POLY_WARP_ROW_MAX; its
    forward takes rows over 1024 so anyway); LayerNorm's forward and frozen
    backward run their tiles on PADDED_TILE_WARPS warps, or up to
    PADDED_WARP_ROW_MAX on one warp at as many elements per thread; every
    other call, FusedAdd's frozen backward with ds too, stays in a tile of
    MIN_WARPS. The first launch of each call, on meta tensors."""
    padded = N <= fn.PADDED_ROW_FILL * fn._pow2(N)
    assert padded == (N in (384, 576, 768, 1152, 1280, 1536))
    tile = (False, fn.MIN_WARPS)
    fewer = (False, (1 if N <= fn.PADDED_WARP_ROW_MAX else fn.PADDED_TILE_WARPS) if padded else fn.MIN_WARPS)
    long_padded = padded and N > fn.PADDED_SHORT_ROW_MIN
    frozen = (True, 1 if N <= 1024 else fn.MIN_WARPS) if long_padded else tile
    poly = (True, 1) if long_padded else tile   # one warp up to POLY_WARP_ROW_MAX
    poly_long = long_padded or N > fn.POLY_FWD_ROW_BLOCK_MAX
    poly_forward = (poly_long, 1 if poly_long else fn.MIN_WARPS)
    x, r, w, w3, b1 = _meta_rows(N)
    calls = {
        "ln forward": (lambda: fn.layer_norm_forward(x, (N,), w, w), fewer),
        "ln backward, w and b frozen": (lambda: fn.layer_norm_backward(x, x, w, w, r, r, True, False, False), fewer),
        "rms backward, w frozen": (lambda: fn.rms_norm_backward(x, x, w, r, compute_dw=False), frozen),
        "fadd backward, w frozen": (lambda: fn.fused_add_rms_norm_backward(x, x, x, w, r, compute_dw=False), tile),
        "poly backward, frozen": (lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3], True, False, False), poly),
        "rms forward": (lambda: fn.rms_norm_forward(x, (N,), w), tile),
        "fadd forward": (lambda: fn.fused_add_rms_norm_forward(x, x, w), tile),
        "ln backward, w trained": (lambda: fn.layer_norm_backward(x, x, w, w, r, r, True, True, False), tile),
        "poly backward, trained": (lambda: fn.poly_norm_backward(x, x, w3, b1, x[:, :3]), poly),
        "poly forward": (lambda: fn.poly_norm_forward(x, w3, b1), poly_forward),
    }
    first = _first_launches({what: call for what, (call, _) in calls.items()})
    for what, (_, (long, warps)) in calls.items():
        launch = first[what]
        assert (launch.name.startswith("_long_"), launch.num_warps) == (long, warps), (what, launch.name)
    if 1024 < N <= 1280:
        assert fn._row_tiling(3, N, block_max=fn.POLY_FWD_ROW_BLOCK_MAX).block_n == 256
    per_thread = lambda t: t.rows * t.block_n // (32 * t.num_warps)
    ours = [fn._row_tiling(4096, N, backward=backward, padded_tile=True) for backward in (False, True)]
    monkeypatch.setattr(fn, "PADDED_WARP_ROW_MAX", 0)   # one warp holds as much a thread as PADDED_TILE_WARPS
    assert [per_thread(t) for t in ours] == [
        per_thread(fn._row_tiling(4096, N, backward=backward, padded_tile=True)) for backward in (False, True)]


@pytest.mark.parametrize("name, call, N, dtype, chunk", [
    ("rms", "forward", 2313, torch.bfloat16, 1024),   # RMS_PADDED_CHUNK_MIN, not 5 x 512
    ("rms", "forward", 4601, torch.bfloat16, 1024),   # (rows of 16-bit vectors take a tile: NARROW_VEC_ELEMENTS)
    ("rms", "forward", 4608, torch.float32, 512),     # fp32: chunks of LONG_CHUNK_MIN load 16 bytes a thread
    ("ln", "forward", 4601, torch.bfloat16, 512),     # two sums: LONG_CHUNK_MIN
    ("fadd", "frozen w", 2304, torch.bfloat16, 1024),
    ("fadd", "frozen w", 4601, torch.bfloat16, 1024),  # (aligned rows of 4608 take a tile and a tail)
    ("rms", "frozen w", 2304, torch.bfloat16, 1024),  # 512 would leave a partial chunk too
    ("rms", "frozen w", 4608, torch.bfloat16, 512),   # whole chunks: 9 x 512
    ("rms", "frozen w", 2560, torch.bfloat16, 512),   # 5 x 512
    ("rms", "frozen w", 2304, torch.float32, 512),
    ("ln", "all frozen", 2304, torch.bfloat16, 512)])
def test_rms_padded_chunk_min(name, call, N, dtype, chunk):
    """RMSNorm's and FusedAdd's long-row kernels (one row sum) cut padded
    16-bit rows into chunks of RMS_PADDED_CHUNK_MIN or more; RMSNorm's frozen
    backward takes whole chunks of LONG_CHUNK_MIN where those fit the row;
    fp32 rows and LayerNorm's go down to LONG_CHUNK_MIN. The chunk of the
    first launch, on meta tensors; the 1024-element chunks of padded rows run
    in test_padded_rows (2560)."""
    launch = _first_launch(name, call, (3, N), dtype)
    assert launch.name.startswith("_long_row_norm_") and launch.constexprs["BLOCK_N"] == chunk


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("N, padded", [(576, True), (2304, True), (5120, True), (2048, False), (3584, False)])
def test_padded_tiles_pipeline_deeper(name, N, padded):
    """A trained row-norm backward loops over padded tiles (PADDED_ROW_FILL)
    through a pipeline PADDED_PIPELINE_STAGES deep, over full ones
    PIPELINE_STAGES deep (meta tensors: no shared-memory limit applies)."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward(name, (8192, N), VARIANTS[name]["trainable"]).launches[0]
    assert launch.name == "_row_norm_bwd_kernel" and launch.args[-1] > 1   # several tiles per program
    assert launch.constexprs["STAGES"] == (fn.PADDED_PIPELINE_STAGES if padded else fn.PIPELINE_STAGES)


@pytest.mark.parametrize("name", ["rms", "fadd"])
@pytest.mark.parametrize("N, dtype", [(4112, torch.bfloat16), (4608, torch.bfloat16), (5120, torch.bfloat16),
                                      (4608, torch.float16)])
def test_padded_tail(name, N, dtype):
    """RMSNorm's and FusedAdd's trained backward of bf16 and fp16 rows of 4097
    to 5120 (FusedAdd's to 4608; aligned for vectors) runs a tile of 4096 and a
    tail of PADDED_TAIL_BLOCK_N (4112: the tail holds 16 elements), checked
    against float64 with dy along y (`check_op`), so that c1 must sum the
    tile's and the tail's terms; trained, and FusedAdd's frozen too. The plan
    keeps the one tile of 8192 past 5120, for LayerNorm, fp32, an unaligned
    row and dw alone, and RMSNorm's frozen rows their long-row kernel."""
    from bench_frozen_norm import VARIANTS, record_backward

    def tiles(size, want, dtype=dtype, op=name):
        launch = record_backward(op, size, want, dtype).launches[0]
        return launch.constexprs.get("BLOCK_N"), launch.constexprs.get("TAIL")
    trained = VARIANTS[name]["trainable"]
    if name == "fadd" and N > 4096 + fn.PADDED_TAIL_BLOCK_N // 2:   # with ds: the tail half full at most
        assert tiles((8192, N), trained) == (8192, 0)
        N = 4096 + fn.PADDED_TAIL_BLOCK_N // 2
    assert tiles((8192, N), trained) == (4096, fn.PADDED_TAIL_BLOCK_N)
    assert tiles((8192, 5376), trained) == (8192, 0)
    assert tiles((8192, N), VARIANTS["ln"]["trainable"], op="ln") == (8192, 0)
    assert tiles((8192, N), trained, torch.float32)[1] == 0
    assert tiles((8192, N + 1), trained) == (8192, 0)   # N + 1: odd rows, not in vectors
    # Frozen: FusedAdd's rows take the tile and the tail too (its long-row kernel is slower there),
    # RMSNorm's the long-row kernel.
    frozen = tiles((8192, N), VARIANTS[name]["frozen w"])
    assert frozen == (4096, fn.PADDED_TAIL_BLOCK_N) if name == "fadd" else frozen[1] is None
    assert tiles((8192, N), VARIANTS[name]["no dx"]) == (8192, 0)
    check_op(OPS[name], (3, N), dtype, ALL_TRAIN[name], _with_grads(name), along_y=True)
    check_op(OPS[name], (3, N), dtype, ALL_FROZEN[name], _with_grads(name), along_y=True)


@pytest.mark.parametrize("N, dtype", [(8208, torch.bfloat16), (9728, torch.float16), (10240, torch.bfloat16)])
def test_layer_norm_two_acc_tail(N, dtype, monkeypatch):
    """LayerNorm's backward with dx, dw and db (two accumulators) on 16-bit
    rows of ROW_BLOCK_MAX + 1 to ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX, aligned
    for vectors: a tile of ROW_BLOCK_MAX and a tail of the rest's power of
    two, at least PADDED_TAIL_BLOCK_N (8208: 16 elements in a tail of 1024;
    9728: 1536 in 2048), w per tile, a row per tile, on the persistent grid;
    checked against float64 with dy along y, so that c1 and c2 must sum the
    tile's and the tail's terms, and bitwise the same on a second run. The
    plan keeps the long-row kernels for fp32 and for an unaligned row, and
    one past the limit before PIPED_ALL_TRITON (from it on: the next test);
    dw alone stays piped, and with neither trained the long-row dx kernel
    runs."""
    def first(call, size, dtype=dtype):
        launch = _first_launch("ln", call, size, dtype)
        c = launch.constexprs
        return launch.name, c.get("BLOCK_N"), c.get("TAIL"), c.get("W_PER_TILE"), c.get("ROWS")
    tail = max(fn.PADDED_TAIL_BLOCK_N, 1 << (N - fn.ROW_BLOCK_MAX - 1).bit_length())
    assert first("trainable", (4096, N)) == ("_row_norm_bwd_kernel", fn.ROW_BLOCK_MAX, tail, True, 1)
    for size, dt in [((4096, N), torch.float32), ((4096, N + 1), dtype)]:
        assert first("trainable", size, dt)[0] == "_long_row_norm_bwd_kernel", (size, dt)
    monkeypatch.setattr(fn, "_TRITON_VERSION", OLD_TRITON)
    assert first("trainable", (4096, fn.ROW_BLOCK_MAX + fn.TWO_ACC_TAIL_MAX + 16))[0] == "_long_row_norm_bwd_kernel"
    monkeypatch.undo()
    assert first("frozen b", (4096, N))[2] == 0          # dw alone: piped (no tail)
    assert first("all frozen", (4096, N))[0] == "_long_row_norm_bwd_kernel"
    _check_twice("ln", (3, N), dtype, ALL_TRAIN["ln"], along_y=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_folded_row(dtype, monkeypatch):
    """LayerNorm's backward with dx, dw and db on 16-bit rows of
    TWO_ACC_FOLDED_ROW: both accumulators in the one-parameter rows' tile of
    RELOAD_ROW_BLOCK_MAX, a row per tile, piped (N a compile-time constant),
    w per tile, under the plans of both Triton versions, and from
    PIPED_ALL_TRITON on the rows past the tail's (ROW_BLOCK_MAX +
    TWO_ACC_TAIL_MAX) too; checked against float64 with dy along y, and
    bitwise the same on a second run. Rows 16 longer, fp32 rows, and before
    PIPED_ALL_TRITON rows 16 shorter, keep the long-row kernels. (At small
    limits, with 37 rows: `test_one_acc_folded_row`.)"""
    N = fn.TWO_ACC_FOLDED_ROW
    shortest = fn.ROW_BLOCK_MAX + fn.TWO_ACC_TAIL_MAX + 16
    for version in TRITON_VERSIONS:
        monkeypatch.setattr(fn, "_TRITON_VERSION", version)
        wide = [N] + ([shortest, N - 16] if version >= fn.PIPED_ALL_TRITON else [])
        for n in wide:
            launch = _first_launch("ln", "trainable", (4096, n), dtype)
            c = launch.constexprs
            assert (launch.name, c["BLOCK_N"], c["N_CONST"], c["RELOAD"], c["TAIL"], c["W_PER_TILE"]) == (
                "_row_norm_bwd_kernel", fn.RELOAD_ROW_BLOCK_MAX, n, False, 0, True), (version, n)
        long = [((4096, N + 16), dtype), ((4096, N), torch.float32)]
        long += [] if version >= fn.PIPED_ALL_TRITON else [((4096, shortest), dtype), ((4096, N - 16), dtype)]
        for size, dt in long:
            assert _first_launch("ln", "trainable", size, dt).name == "_long_row_norm_bwd_kernel", (version, size, dt)
    _check_twice("ln", (3, N), dtype, ALL_TRAIN["ln"], along_y=True)


@pytest.mark.parametrize("version", TRITON_VERSIONS, ids=VERSION_IDS)
def test_one_acc_folded_row(version, monkeypatch):
    """LayerNorm's rows of TWO_ACC_FOLDED_ROW, and from PIPED_ALL_TRITON on
    those past the tail's, at the small limits of `_one_acc_limits`: 37 rows
    of 192 (and 176) in tiles of 256, fp16, dx, dw and db against float64,
    and bitwise the same on a second run."""
    _one_acc_limits(monkeypatch, version)
    for N in [192] + ([176] if version >= fn.PIPED_ALL_TRITON else []):
        assert _one_acc_plan("ln", N, dict(dx=1, dw=1, db=1), torch.float16) == ("piped", True)
        _check_twice("ln", (37, N), torch.float16, ALL_TRAIN["ln"])


@pytest.mark.parametrize("name", ["rms", "fadd", "ln", "poly"])
@pytest.mark.parametrize("mode", ["train", "frozen"])
@pytest.mark.parametrize("M, N", [(3, 2560), (37, 576), (5, 1152)])
def test_padded_rows(name, mode, M, N):
    """Padded rows against float64, trained and frozen. 2560 (a tile of 4096):
    frozen through the long-row kernels, trained through the tile kernels (but
    PolyNorm's backward), the forwards in a tile (NARROW_VEC_ELEMENTS). 576 and
    1152, on a GPU: LayerNorm's padded tiles (on one warp at 576,
    PADDED_WARP_ROW_MAX; on PADDED_TILE_WARPS at 1152) and the long-row
    kernels in chunks of 256 on one warp (RMSNorm's frozen backward at 576;
    PolyNorm's forward and backward at both) compile and run."""
    params = (ALL_TRAIN if mode == "train" else ALL_FROZEN)[name]
    check_op(OPS[name], (M, N), torch.bfloat16, params, _with_grads(name))


# The first forward launch of RMSNorm and LayerNorm on 16-bit rows of N
# (real limits, NARROW_VEC_ELEMENTS): "long" for the long-row kernel, else the
# tile's VEC (0: 16-byte vectors, N at run time). 3072 and 6144 are whole
# 16-byte repeats of a thread's lanes (1024 on 4 warps, 2048 on 8), 2313 is
# odd (not in vectors; 2312 = 8 x 289 is, by ALIGN); RMSNorm's full tiles
# (3328, 3584, 7168) keep VEC 0.
NARROW_FORWARD_PLANS = {
    "rms": {2304: 2, 2312: 2, 2313: "long", 2560: 4, 2816: 2, 3072: "long", 3328: 0, 3584: 0, 4096: 0,
            4352: 2, 4608: 2, 5120: 4, 5632: 2, 6144: "long", 6656: 0, 7168: 0, 8192: 0},
    "ln": {2304: 2, 2312: 2, 2313: "long", 2560: 4, 2816: 2, 3072: "long", 3328: 2, 3584: 4, 4096: 0,
           4352: 2, 4608: 2, 5120: 4, 5632: 2, 6144: "long", 6656: 2, 7168: 4, 8192: 0}}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_narrow_forward_plan(dtype):
    """RMSNorm's and LayerNorm's forwards hold 16-bit rows of PADDED_ROW_MIN
    to ROW_BLOCK_MAX whose last repeat of a thread's lanes 16-byte vectors
    leave partial in one tile, N a compile-time constant, in vectors of
    NARROW_VEC_ELEMENTS (8 bytes where they make whole repeats, else 4);
    RMSNorm's only where the row fills the tile poorly (PADDED_ROW_FILL).
    fp32 rows and FusedAdd's forward keep their plans (padded rows long,
    FusedAdd's in a tile of 16-byte vectors). The first launch, on meta
    tensors, at the real limits."""
    from bench_frozen_norm import record_forward
    for name, plans in NARROW_FORWARD_PLANS.items():
        for N, want in plans.items():
            if dtype == torch.float32:
                want = "long" if N <= fn.PADDED_ROW_FILL * fn._pow2(N) else 0
            launch = record_forward(name, (8192, N), dtype).launches[0]
            if want == "long":
                assert launch.name == "_long_row_norm_fwd_kernel", (name, N)
                continue
            c = launch.constexprs
            # Rows that fill their tile take FULL_TILE_ELEMENTS_PER_THREAD a thread: those of
            # ROW_BLOCK_MAX, and at TILE_ELEMENTS RMSNorm's and LayerNorm's fp32 ones (W_FIRST).
            w_first = name == "ln" and N == fn.TILE_ELEMENTS and dtype == torch.float32
            full = N == fn.ROW_BLOCK_MAX or N == fn.TILE_ELEMENTS and (name == "rms" or w_first)
            got = (launch.name, c["BLOCK_N"], c["ROWS"], launch.num_warps, c["N_CONST"], c["VEC"], c["W_FIRST"])
            assert got == ("_row_norm_fwd_kernel", fn._pow2(N), 1, _forward_warps(N, full),
                           N if want else 0, want, w_first), (name, N)
            fused = record_forward("fadd", (8192, N), dtype).launches[0]
            c = fused.constexprs
            assert (fused.name, fused.num_warps, c["N_CONST"], c["VEC"], c["W_FIRST"]) == (
                "_row_norm_fwd_kernel", _forward_warps(N, N == fn.ROW_BLOCK_MAX), 0, 0, False), N


def _forward_warps(N, full):
    """The warps of a forward tile a row of N fills alone: FULL_TILE_ELEMENTS_PER_THREAD a
    thread where `full`, else ELEMENTS_PER_THREAD."""
    return fn._pow2(N) // (32 * (fn.FULL_TILE_ELEMENTS_PER_THREAD if full else fn.ELEMENTS_PER_THREAD))


def test_w_first_forward():
    """LayerNorm's fp32 rows of TILE_ELEMENTS, a row a tile, load w and b
    before x (W_FIRST; the plan, and the 16-bit rows' without it, are
    test_narrow_forward_plan's): recorded on meta tensors, then against
    float64 with each parameter trained, frozen and absent (HAS_W and HAS_B
    apart), every input asking for its gradient."""
    from bench_frozen_norm import record_forward
    assert record_forward("ln", (3, fn.TILE_ELEMENTS), torch.float32).launches[0].constexprs["W_FIRST"]
    op = OPS["ln"]
    for params, inputs in freeze_patterns(op):
        if all(inputs.values()):
            check_op(op, (3, fn.TILE_ELEMENTS), torch.float32, params, inputs)


# Padded 16-bit rows of PADDED_ROW_MIN and less whose tiles take N_CONST and
# vectors of NARROW_VEC_ELEMENTS (real limits): VEC of LayerNorm's forward and
# of the frozen tile backwards of LayerNorm (one- and two-warp padded tiles),
# FusedAdd (with ds, 4-warp tiles) and RMSNorm ("long": its frozen backward's
# long-row plan past PADDED_SHORT_ROW_MIN); 0 where none is taken (N_CONST 0).
# 896 and 1024 fill their tiles, 585 is odd (not in vectors; 584 = 8 x 73
# is, by ALIGN); 96 (one warp) and the 4-warp tiles of 512 and less are
# narrower than one 16-byte repeat.
SHORT_NARROW_PLANS = {   # N: (ln forward, ln frozen, fadd frozen, rms frozen)
    96: (0, 0, 0, 0), 160: (2, 2, 0, 0), 384: (4, 4, 0, 0), 576: (2, 2, 2, "long"), 640: (4, 4, 2, "long"),
    768: (4, 4, 2, "long"), 1152: (2, 2, 2, "long"), 1280: (4, 4, 2, "long"), 1536: (4, 4, 4, "long"),
    584: (2, 2, 2, "long"), 586: (0, 0, 0, "long"), 896: (0, 0, 0, 0), 1024: (0, 0, 0, 0),
    585: ("long", "long", 0, "long")}   # odd rows: the long-row kernels with SKEW (SKEW_TILE_ROW_MIN)


def _short_narrow_launch(launch):
    """(N_CONST, VEC) of a tile launch, or "long" (the long-row plan, whose
    trained backward ends with the dw/db kernel)."""
    if launch.name.startswith("_long") or launch.name == "_row_norm_dwdb_kernel":
        return "long"
    return launch.constexprs["N_CONST"], launch.constexprs["VEC"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_short_narrow_plan(dtype):
    """LayerNorm's forward and the row norms' frozen tile backwards of padded
    16-bit rows up to PADDED_ROW_MIN, aligned for vectors, in tiles at least
    one 16-byte repeat wide, launch N_CONST = N and VEC by NARROW_VEC_ELEMENTS'
    rule; trained backwards, rows that fill their tile, unaligned rows,
    narrower tiles and fp32 rows keep N at run time; odd rows take the
    long-row kernels (SKEW_TILE_ROW_MIN; trained, by `_trained_rows_each`).
    The first forward launch and the backward's main launch, on meta
    tensors, at the real limits."""
    from bench_frozen_norm import VARIANTS, main_backward_launch, record_backward, record_forward
    frozen = {"ln": "all frozen", "fadd": "frozen w", "rms": "frozen w"}
    for N, wants in SHORT_NARROW_PLANS.items():
        got_fwd = _short_narrow_launch(record_forward("ln", (8192, N), dtype).launches[0])
        want = wants[0] if dtype != torch.float32 or wants[0] == "long" else 0
        assert got_fwd == (want if want == "long" else ((N if want else 0), want)), (N, got_fwd)
        for (name, variant), want in zip(frozen.items(), wants[1:]):
            if dtype == torch.float32 and want != "long":
                want = 0
            trained = "long" if N % 2 and _trained_rows_each(name, N, 16 // dtype.itemsize, dx=True) else 0
            for v, w in ((variant, want), ("trainable", trained)):
                got = _short_narrow_launch(main_backward_launch(record_backward(name, (8192, N), VARIANTS[name][v],
                                                                                dtype=dtype)))
                assert got == (w if w == "long" else ((N if w else 0), w)), (name, v, N, got)


@pytest.mark.parametrize("name", ["ln", "fadd", "rms"])
@pytest.mark.parametrize("M, N, dtype, layout", [
    (37, 576, torch.bfloat16, "contiguous"), (9, 384, torch.float16, "contiguous"),
    (5, 1280, torch.bfloat16, "wide"), (11, 160, torch.bfloat16, "contiguous")])
def test_short_narrow(name, M, N, dtype, layout):
    """The launches of test_short_narrow_plan against float64, frozen (N_CONST
    and narrow vectors where that plan has them: LayerNorm's at every length
    here, FusedAdd's at 576 and 1280) and trained (neither), with a row
    stride aligned for vectors too ("wide": N + 64)."""
    for params in (ALL_FROZEN[name], ALL_TRAIN[name]):
        check_op(OPS[name], (M, N), dtype, params, _with_grads(name), layout=_wide if layout == "wide" else None)


@pytest.mark.parametrize("name, N, dtype, cap", [
    ("ln", 512, torch.bfloat16, "short"), ("ln", 480, torch.float16, "short"), ("ln", 5120, torch.bfloat16, "narrow"),
    ("ln", 512, torch.float32, None), ("ln", 256, torch.bfloat16, None), ("ln", 384, torch.bfloat16, None),
    ("ln", 1024, torch.bfloat16, None), ("ln", 4608, torch.bfloat16, None), ("ln", 7168, torch.bfloat16, None),
    ("ln", 8192, torch.bfloat16, None), ("rms", 512, torch.bfloat16, None), ("rms", 5120, torch.bfloat16, None),
    ("fadd", 512, torch.bfloat16, None)])
def test_forward_register_caps(name, N, dtype, cap):
    """LayerNorm's 16-bit tile forwards that FWD_SHORT_* (tiles 512 wide on
    MIN_WARPS warps) and FWD_NARROW_* (5120 in 4-element vectors) name launch
    under their register cap; the others (a padded row of 384 on one warp,
    4608 in 2-element vectors, 7168, fp32 rows, RMSNorm's and FusedAdd's)
    under ptxas's own choice. On meta tensors, at the real limits."""
    from bench_frozen_norm import record_forward
    want = {"short": fn.FWD_SHORT_MAX_REGISTERS, "narrow": fn.FWD_NARROW_MAX_REGISTERS, None: None}[cap]
    launches = record_forward(name, (8192, N), dtype).launches
    assert [(lc.name, lc.maxnreg) for lc in launches] == [("_row_norm_fwd_kernel", want)], launches


@pytest.mark.parametrize("name", ["rms", "ln"])
@pytest.mark.parametrize("N, dtype, layout", [
    (2304, torch.bfloat16, "contiguous"), (2560, torch.float16, "contiguous"), (3584, torch.bfloat16, "contiguous"),
    (4352, torch.bfloat16, "contiguous"), (2313, torch.bfloat16, "contiguous"),
    (2312, torch.bfloat16, "contiguous"), (2304, torch.bfloat16, "wide"),
    (2560, torch.bfloat16, "misaligned"), (2304, torch.bfloat16, "sliced")])
def test_narrow_forward(name, N, dtype, layout):
    """The forwards of test_narrow_forward_plan against float64 (the backward
    with them), with the plan they launch: one tile in 4-byte vectors (2304;
    4352, whose last repeat of 512 stays half masked), in 8-byte ones (2560;
    LayerNorm's full tile of 3584; 2312, a multiple of 8 only), the long-row
    kernel for an odd row length (2313: not in vectors). Rows sliced from
    wider ones keep the rule where the row stride is aligned too ("wide": N +
    64), not where it is not ("sliced": N + 3); an address off a 16-byte
    boundary ("misaligned") keeps it (Triton then proves no vector). The plan: recorded on meta tensors of
    the same row stride."""
    from bench_frozen_norm import recording
    check_op(OPS[name], (3, N), dtype, ALL_TRAIN[name], _with_grads(name),
             layout=_wide if layout == "wide" else LAYOUTS[layout])
    x = torch.empty_strided((3, N), ({"wide": N + 64, "sliced": N + 3}.get(layout, N), 1), device="meta",
                            dtype=dtype)
    with recording() as rec:
        fn.rms_norm_forward(x, (N,), x[0]) if name == "rms" else fn.layer_norm_forward(x, (N,), x[0], x[0])
    forward = rec.launches[0]
    want = "long" if layout == "sliced" else NARROW_FORWARD_PLANS[name][N]
    if want == "long":
        assert forward.name == "_long_row_norm_fwd_kernel"
    else:
        assert (forward.name, forward.constexprs["VEC"]) == ("_row_norm_fwd_kernel", want)


def test_poly_forward_long_rows_past_1024():
    """PolyNorm's forward takes the long-row kernel past POLY_FWD_ROW_BLOCK_MAX
    (real limits), its backward holds such rows in a tile."""
    from bench_frozen_norm import recording
    N = fn.POLY_FWD_ROW_BLOCK_MAX + 1000
    x, w3, b1 = torch.empty(3, N, device="meta"), torch.empty(3, device="meta"), torch.empty(1, device="meta")
    with recording() as rec:
        fn.poly_norm_forward(x[:, :fn.POLY_FWD_ROW_BLOCK_MAX], w3, b1)
        fn.poly_norm_forward(x, w3, b1)
        fn.poly_norm_backward(x, x, w3, b1, x[:, :3])
    assert [lc.name for lc in rec.launches[:3]] == [
        "_poly_norm_fwd_kernel", "_long_poly_norm_fwd_kernel", "_poly_norm_bwd_kernel"]
    check_op(OPS["poly"], (3, N), torch.bfloat16, ALL_TRAIN["poly"], _with_grads("poly"))


@pytest.mark.parametrize("M, N, dtype, misalign, seg_fwd, seg_bwd", [
    # 16-byte vectors: lines of 256 (the last one partly masked), halved
    # while a tile's rows keep their lines in one warp: the forward's 8
    # rows on 4 warps to 128, 2 lines a warp; not the backward's 4 rows.
    (9, 496, torch.bfloat16, False, 128, 256),
    (9, 160, torch.bfloat16, False, 64, 128),    # 16 rows forward, 8 backward (a padded row)
    (9, 256, torch.bfloat16, False, 64, 256),    # the backward of a row that fills its tile: not halved
    (9, 160, torch.float32, False, 32, 64),
    (33, 96, torch.bfloat16, False, 32, 64),     # 32 rows forward: 64-byte lines, LINE_MIN_BYTES
    (9, 784, torch.bfloat16, False, 256, 1024),  # the backward's tiles of 2 rows: the plain tile
    (9, 1001, torch.bfloat16, False, 32, 1024),  # an odd row: one element a lane
    (9, 1000, torch.bfloat16, False, 256, 1024),  # 8 x 125: 16-byte vectors by ALIGN
    (9, 512, torch.bfloat16, True, 32, 32),      # x's address not 16-byte aligned
    (2, 1024, torch.bfloat16, False, 1024, 1024),  # fewer rows than warps: the plain tile
])
def test_poly_segmented_tile(M, N, dtype, misalign, seg_fwd, seg_bwd):
    """PolyNorm's tile kernels load rows in lines of SEG elements
    (`_segment_tile`). The SEG each layout case launches with, forward and
    backward, and y and every gradient against the float64 reference."""
    from bench_frozen_norm import main_backward_launch, recording
    flat = randn(M * N + 1, dtype=dtype)
    x = (flat[1:] if misalign else flat[:-1]).view(M, N).requires_grad_()
    w, b = randn(3, dtype=dtype).requires_grad_(), randn(1, dtype=dtype).requires_grad_()
    dy = randn(M, N, dtype=dtype)
    with recording() as rec:   # the launches, not run
        fn.poly_norm_backward(dy, x, w, b, fn.poly_norm_forward(x, w, b)[1])
    assert rec.launches[0].constexprs["SEG"] == seg_fwd
    assert main_backward_launch(rec).constexprs["SEG"] == seg_bwd
    y = fn.poly_norm(x, w, b)
    y.backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = fn.poly_norm_reference(x64, w64, b64)
    y64.backward(dy.double())
    assert rel_error(y, y64) < TOLERANCE[dtype]
    for t, t64 in ((x, x64), (w, w64), (b, b64)):
        assert rel_error(t.grad, t64.grad) < 2 * TOLERANCE[dtype]


def _row_launches(name, N, stride, M=64, dtype=torch.bfloat16):
    """The launches of `name`'s low-level forward and backward (every
    gradient, then dx alone) on meta rows of N elements, row stride `stride`
    (dy, x and FusedAdd's residual and ds alike)."""
    from bench_frozen_norm import recording
    x, dy, other = (torch.empty_strided((M, N), (stride, 1), device="meta", dtype=dtype) for _ in range(3))
    w, stats = torch.empty(N, device="meta", dtype=dtype), torch.empty(M, device="meta")
    w3, b1, rstd3 = torch.empty(3, device="meta"), torch.empty(1, device="meta"), torch.empty(M, 3, device="meta")
    with recording() as rec:
        for trains in (True, False):
            if name == "rms":
                fn.rms_norm_forward(x, (N,), w)
                fn.rms_norm_backward(dy, x, w, stats, compute_dw=trains)
            elif name == "fadd":
                fn.fused_add_rms_norm_forward(x, other, w)
                fn.fused_add_rms_norm_backward(dy, other, x, w, stats, compute_dw=trains)
            elif name == "ln":
                fn.layer_norm_forward(x, (N,), w, w)
                fn.layer_norm_backward(dy, x, w, w, stats, stats, compute_dw=trains, compute_db=trains)
            else:
                fn.poly_norm_forward(x, w3, b1)
                fn.poly_norm_backward(dy, x, w3, b1, rstd3, compute_dw=trains, compute_db=trains)
    return rec.launches


@pytest.mark.parametrize("name", ["rms", "fadd", "ln", "poly"])
@pytest.mark.parametrize("N, extra, align", [
    (1000, 0, 8), (1000, 4, 4), (100, 0, 4), (4104, 0, 8), (4104, 2, 2), (12296, 0, 8),   # 12296 = 8 x 1537
    (1024, 8, 8),                                  # a row of 16s in rows of 8s
    (1024, 0, 1), (1001, 0, 1), (4104, 3, 1)])     # multiples of 16, odd rows and strides
def test_aligned_rows(name, N, extra, align):
    """Rows and row strides (N + extra) whose largest common power of two is
    2, 4 or 8 launch every row kernel with that ALIGN (`_align`), multiples
    of 16 and odd ones with 1 (recorded on meta tensors of those strides); a
    launch's `_aligned` computes v // ALIGN * ALIGN, in the interpreter too,
    so a wrong ALIGN would misplace rows: the forward and the backward,
    trained and frozen, against float64."""
    launches = _row_launches(name, N, N + extra)
    hinted = [lc.constexprs["ALIGN"] for lc in launches if "ALIGN" in lc.constexprs]
    assert len(hinted) >= 4 and set(hinted) == {align}, [(lc.name, lc.constexprs.get("ALIGN")) for lc in launches]
    layout = _row_stride(N + extra) if extra else None
    for params in (ALL_TRAIN[name], ALL_FROZEN[name]):
        check_op(OPS[name], (3, N), torch.bfloat16, params, _with_grads(name), layout=layout)


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("N, extra, dtype, skew, presum", [
    (8195, 0, torch.bfloat16, 8, False),    # the long-row forward (RMSNorm, LayerNorm) and backward
    (4097, 0, torch.float32, 4, False),     # fp32: vectors of 4 elements; the backward's padded long rows
    (8195, 0, torch.bfloat16, 8, True),     # pre-summed: LayerNorm's forward, every backward
    (8195, 8, torch.bfloat16, 8, False),    # a row stride of N + 8: every row lies as without it
    (8195, 1, torch.bfloat16, 0, False)])   # a stride of N + 1: x's rows and y's lie apart, one element a lane
def test_skewed_rows(name, N, extra, dtype, skew, presum, monkeypatch):
    """Rows of an odd length or stride launch the long-row kernels with SKEW
    the elements of a 16-byte vector (`_row_skew`), unless their tensors'
    rows lie differently against the vectors (recorded on meta tensors);
    nine rows start at every lane of a vector. Against float64, trained,
    frozen and, where SKEW is not 0, without parameters (the stride of N + 8
    trained alone), the outputs and dx element by element: a lane left out
    of both the whole vectors and the edges (`_skew_edges`) would show.
    FusedAdd's forward takes these rows over chunks too. With `presum`, the
    rows are pre-summed (LONG_PRESUM) as past the presum limits, here
    lowered to N - 1 (the interpreter pays for long rows)."""
    monkeypatch.setattr(fn, "RESIDUAL_ROW_BLOCK_MAX", fn.ROW_BLOCK_MAX)
    if presum:
        monkeypatch.setattr(fn, "LONG_FWD_PRESUM_AFTER", N - 1)
        monkeypatch.setattr(fn, "LONG_BWD_PRESUM_AFTER", N - 1)
    launches = [lc for lc in _row_launches(name, N, N + extra, dtype=dtype) if lc.name.startswith("_long_row")]
    assert launches and {lc.constexprs["SKEW"] for lc in launches} == {skew}, [lc.name for lc in launches]
    if presum:
        presummed = {lc.name for lc in launches if lc.constexprs["PRESUM"] > 1}
        assert presummed == {"_long_row_norm_bwd_kernel"} | ({"_long_row_norm_fwd_kernel"} if name == "ln" else set())
    if N > fn.ROW_BLOCK_MAX:
        assert "_long_row_norm_fwd_kernel" in {lc.name for lc in launches}
    layout = _row_stride(N + extra) if extra else None
    absent = {p: ABSENT for p in ALL_TRAIN[name]}   # without w, nothing zeroes g on the skewed lanes outside a row
    # A stride of N + 8 leaves the rows' lanes as N's own: trained alone (N's case has the patterns).
    patterns = (ALL_TRAIN[name], ALL_FROZEN[name]) + ((absent,) if skew else ())
    for params in (ALL_TRAIN[name],) if extra == 8 else patterns:
        check_op(OPS[name], (9, N), dtype, params, _with_grads(name), layout=layout, elementwise=True)


def _untrained_tiles_skewed(name, N, skew):
    """Whether the forward's and the frozen backward's tiles of odd rows of N
    (too short for the long-row kernels) read them skewed, by the rules
    `_row_norm_forward` and `_row_norm_backward` state: FusedAdd's forward
    from SKEW_RESIDUAL_TILE_FWD_ROW_MIN, RMSNorm's where the lanes before a
    row keep it in its tile of SKEW_TILE_BLOCK_MIN lanes or more; the
    frozen backward's of both where the row and those lanes fill more than
    PADDED_ROW_FILL of such a tile; LayerNorm's never."""
    room = fn._pow2(N + skew - 1)
    forward = (name == "fadd" and N >= fn.SKEW_RESIDUAL_TILE_FWD_ROW_MIN
               or name == "rms" and room == fn._pow2(N) >= fn.SKEW_TILE_BLOCK_MIN)
    frozen = name != "ln" and room >= fn.SKEW_TILE_BLOCK_MIN and N + skew - 1 > fn.PADDED_ROW_FILL * room
    return forward, frozen


def _trained_rows_each(name, N, skew, dx):
    """Whether the trained backward takes odd rows of N a tile would hold a
    row a program (the long-row dx kernel and the dw/db kernel), by the rule
    `_row_norm_backward` states. In 16-bit dtypes (skew 8): every op's
    without dx from SKEW_TRAINED_NODX_ROW_MIN elements on; with dx,
    LayerNorm's whose row and the skew - 1 lanes before it exceed
    SKEW_TRAINED_TILE_BLOCK_MAX lanes. In fp32 (skew 4): LayerNorm's past
    SKEW_TRAINED_FP32_TILE_BLOCK_MAX lanes."""
    lanes = N + skew - 1
    if skew == 8 and not dx:
        return N >= fn.SKEW_TRAINED_NODX_ROW_MIN
    block_max = fn.SKEW_TRAINED_TILE_BLOCK_MAX if skew == 8 else fn.SKEW_TRAINED_FP32_TILE_BLOCK_MAX
    return name == "ln" and lanes > block_max


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("N, extra", [(511, 0), (577, 0), (1001, 0), (1025, 0), (4097, 0),
                                      (8189, 0),    # trained: no room in a tile for the lanes before a row
                                      (1001, 1)])   # x's rows and y's lie apart: no SKEW, their tiles
def test_skewed_tile_rows(name, N, extra):
    """Odd rows a tile would hold take the long-row kernels with SKEW, in
    the forward and in the backward that trains nothing, from
    SKEW_TILE_ROW_MIN elements on (FusedAdd's forward from
    SKEW_RESIDUAL_FWD_ROW_MIN, its backward from SKEW_RESIDUAL_BWD_ROW_MIN),
    and in the trained backward by `_trained_rows_each` (dx, then dw and db
    from the dw/db kernel, both with SKEW); the others keep their tiles and
    read them skewed there, the trained ones where a tile has room for the
    SKEW - 1 lanes before a row, the others by `_untrained_tiles_skewed`.
    Recorded on meta tensors (`_row_launches` runs trained first); against
    float64 element by element, trained and frozen."""
    launches = [lc for lc in _row_launches(name, N, N + extra) if lc.name != "_sum_partials_kernel"]
    names = [lc.name for lc in launches]
    starts = [i for i, lc in enumerate(launches) if "_fwd_" in lc.name]
    assert len(starts) == 2 and starts[0] == 0, names
    forward = [launches[i] for i in starts]
    trained, frozen = launches[1:starts[1]], launches[starts[1] + 1:]
    fadd = name == "fadd"
    fwd_min, bwd_min = ((fn.SKEW_RESIDUAL_FWD_ROW_MIN, fn.SKEW_RESIDUAL_BWD_ROW_MIN) if fadd else
                        (fn.SKEW_TILE_ROW_MIN, fn.SKEW_TILE_ROW_MIN))
    long_fwd, long_frozen = not extra and N >= fwd_min, not extra and N >= bwd_min
    assert {lc.name for lc in forward} == {"_long_row_norm_fwd_kernel" if long_fwd else "_row_norm_fwd_kernel"}, names
    assert [lc.name for lc in frozen] == ["_long_row_norm_bwd_kernel" if long_frozen else "_row_norm_bwd_kernel"]
    if not extra and _trained_rows_each(name, N, 8, dx=True):
        assert [lc.name for lc in trained] == ["_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"], names
        assert {lc.constexprs["SKEW"] for lc in trained} == {8}
    else:
        assert [lc.name for lc in trained] == ["_row_norm_bwd_kernel"], names
        per_lane = extra or fn._pow2(N + 7) > fn.ROW_BLOCK_MAX   # no tile holds the row and the 7 lanes before it
        assert trained[0].constexprs["SKEW"] == (0 if per_lane else 8)
    assert {lc.constexprs["SKEW"] for lc in (forward if long_fwd else []) + (frozen if long_frozen else [])} <= {8}
    fwd_skewed, frozen_skewed = _untrained_tiles_skewed(name, N, 8)
    assert {lc.constexprs["SKEW"] for lc in forward if not long_fwd} <= {8 if fwd_skewed and not extra else 0}
    assert {lc.constexprs["SKEW"] for lc in frozen if not long_frozen} <= {8 if frozen_skewed and not extra else 0}
    layout = _row_stride(N + extra) if extra else None
    for params in (ALL_TRAIN[name], ALL_FROZEN[name]):
        check_op(OPS[name], (9, N), torch.bfloat16, params, _with_grads(name), layout=layout, elementwise=True)


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("N, dtype, extra", [
    (3, torch.bfloat16, 0),      # rows inside one vector: a lane can be in both edges (`_skew_edges`)
    (9, torch.bfloat16, 0),      # a full tile of 16 lanes: the trained backward's alone (SKEW_TILE_BLOCK_MIN)
    (161, torch.bfloat16, 0),    # several rows a tile; RMSNorm's forward
    (449, torch.bfloat16, 0),    # RMSNorm's and FusedAdd's forward and frozen backward
    (509, torch.bfloat16, 0),    # within SKEW - 1 of 512: the tile of 1024 holds the lanes before a row
    (449, torch.float32, 0),     # fp32: vectors of 4 elements, 4 classes
    (161, torch.bfloat16, 8)])   # a row stride of N + 8: every row lies as without it
def test_skewed_tiles(name, N, dtype, extra, monkeypatch):
    """Odd rows a tile holds are read skewed there (the tile kernels' SKEW),
    each program taking the tiles of one class of rows, SKEW apart: the
    trained backward's but those `_trained_rows_each` sends a row a program
    (LayerNorm's from 449 on here), and the forward's and frozen backward's
    too short for the long-row kernels (SKEW_TILE_ROW_MIN, FusedAdd's own
    minimums) by `_untrained_tiles_skewed`. Recorded on meta tensors: SKEW the
    elements of a vector, tiles of N + SKEW - 1 lanes at least, the grid a
    multiple of SKEW where it is not 0. Then 77 rows (classes of 9 and 10;
    past 256, 45, whose classes of 5 rows or more still span two tiles) on
    one program a class where the grid is persistent (`_programs_per_sm` 1
    on one SM), so that each program loops over its class's tiles,
    against float64 element by element, the outputs and every gradient, for
    every freeze pattern whose backward is a tile (and the trained one
    without dx, from SKEW_TRAINED_NODX_ROW_MIN on in 16-bit dtypes the dw/db
    kernel's): a dw or db lane left in its skewed frame, a row of another
    class, or an edge of y, s or dx missed would show; where the trained
    backward is a tile, twice the same bits."""
    skew = 16 // dtype.itemsize
    launches = [lc for lc in _row_launches(name, N, N + extra, dtype=dtype) if lc.name != "_sum_partials_kernel"]
    starts = [i for i, lc in enumerate(launches) if "_fwd_" in lc.name]
    assert len(starts) == 2 and starts[0] == 0, launches
    fwd_min, bwd_min = ((fn.SKEW_RESIDUAL_FWD_ROW_MIN, fn.SKEW_RESIDUAL_BWD_ROW_MIN) if name == "fadd" else
                        (fn.SKEW_TILE_ROW_MIN, fn.SKEW_TILE_ROW_MIN))
    fwd_skewed, frozen_skewed = _untrained_tiles_skewed(name, N, skew)
    forward = [launches[i] for i in starts if launches[i].name == "_row_norm_fwd_kernel"]
    trained, frozen = ([lc for lc in run if lc.name == "_row_norm_bwd_kernel"]
                       for run in (launches[1:starts[1]], launches[starts[1] + 1:]))
    row_each = _trained_rows_each(name, N, skew, dx=True)
    assert len(trained) == (not row_each) and len(forward) == 2 * (N < fwd_min), launches
    assert len(frozen) == (N < bwd_min), launches
    if row_each:
        assert [(lc.name, lc.constexprs["SKEW"]) for lc in launches[1:starts[1]]] == [
            ("_long_row_norm_bwd_kernel", skew), ("_row_norm_dwdb_kernel", skew)], launches
    for group, skewed in ((trained, True), (forward, fwd_skewed), (frozen, frozen_skewed)):
        for lc in group:
            assert lc.constexprs["SKEW"] == (skew if skewed else 0), lc
            if skewed:
                assert lc.constexprs["BLOCK_N"] >= N + skew - 1 and lc.grid[0] % skew == 0, lc
    M = 77 if N <= 256 else 45
    if N > 256:   # the smallest class of rows spans two tiles or more
        assert all(M // skew > lc.constexprs["ROWS"] for lc in trained + frozen if lc.constexprs["SKEW"])
    monkeypatch.setattr(fn, "_num_sms", lambda device: 1)
    monkeypatch.setattr(fn, "_programs_per_sm", lambda num_warps: 1)
    layout = _row_stride(N + extra) if extra else None
    op, twice = OPS[name], 0
    for params, inputs in freeze_patterns(op):
        if TRAIN not in params.values() and N >= bwd_min:
            continue   # a frozen backward in the long-row kernels, not a tile (test_skewed_rows)
        if TRAIN in params.values() and row_each:
            continue   # a trained one a row a program, not a tile (test_skewed_trained_rows_each)
        if all(inputs.values()) or (params == ALL_TRAIN[name] and not inputs["x"]):
            all_trained = params == ALL_TRAIN[name] and all(inputs.values())   # the tile's persistent loop
            check_op(op, (M, N), dtype, params, inputs, layout=layout, elementwise=True, twice=all_trained)
            twice += all_trained
    assert twice == (not row_each)   # a row a program: test_skewed_trained_rows_each


@pytest.mark.parametrize("name, N, dtype, each", [
    ("rms", 1025, torch.bfloat16, False),   # 1032 lanes: about half the tile of 2048, the skewed tile
    ("fadd", 2049, torch.bfloat16, False),  # the tile of 4096
    ("rms", 4097, torch.bfloat16, False),   # the tile of 8192
    ("fadd", 513, torch.float16, False),    # a tile of two rows of 1024
    ("rms", 1225, torch.float32, False),    # fp32 (SKEW 4): RMSNorm's tiles stay
    ("fadd", 513, torch.float32, False),    # and FusedAdd's
    ("ln", 1025, torch.float32, False),     # and LayerNorm's up to 4096 lanes
    ("ln", 4093, torch.float32, False),     # 4096 (SKEW_TRAINED_FP32_TILE_BLOCK_MAX)
    ("ln", 4095, torch.float32, True),      # 4098
    ("ln", 249, torch.bfloat16, False),     # 256 lanes (SKEW_TRAINED_TILE_BLOCK_MAX)
    ("ln", 251, torch.bfloat16, True),      # 258
    ("ln", 8191, torch.bfloat16, True),     # no tile holds 8198 lanes
    ("rms", 127, torch.bfloat16, False),    # without dx, under SKEW_TRAINED_NODX_ROW_MIN: the skewed tile
    ("fadd", 129, torch.bfloat16, False)])  # from it on, the dw/db kernel alone
def test_skewed_trained_rows_each(name, N, dtype, each):
    """The trained backward's odd rows a tile would hold, a row a program
    (the long-row dx kernel, then the dw/db kernel, both with SKEW) where
    `_skewed_trained_row_each` says so, which `_trained_rows_each` restates
    (a change of either fails here); else the skewed tile kernel, but where
    no tile holds the row and the lanes before it, one element a lane.
    `each`: the plan with dx; without dx (recorded on meta tensors, as
    every trained pattern), 16-bit rows of SKEW_TRAINED_NODX_ROW_MIN or more
    take the dw/db kernel alone. Against float64 element by element, every
    freeze pattern that trains, for the rows under 2048 (the longer ones
    take the same kernels, which test_skewed_tile_rows runs at 4097 and
    8189); a row a program, all trained, twice the same bits."""
    from bench_frozen_norm import VARIANTS, record_backward
    skew = 16 // dtype.itemsize
    for dx in (True, False):
        rule = fn._skewed_trained_row_each(N, skew, center=name == "ln", compute_dx=dx)
        nodx_each = skew == 8 and not dx and N >= fn.SKEW_TRAINED_NODX_ROW_MIN
        assert rule == _trained_rows_each(name, N, skew, dx) == (each or nodx_each), dx
    for variant, want in VARIANTS[name].items():
        if not (want.get("dw") or want.get("db")):
            continue
        got = [(lc.name, lc.constexprs["SKEW"]) for lc in record_backward(name, (64, N), want, dtype=dtype).launches
               if lc.name != "_sum_partials_kernel"]
        dwdb = [("_row_norm_dwdb_kernel", skew)]
        row_each = _trained_rows_each(name, N, skew, bool(want["dx"]))
        wanted = (([("_long_row_norm_bwd_kernel", skew)] if want["dx"] else []) + dwdb if row_each else
                  [("_row_norm_bwd_kernel", 0 if fn._pow2(N + skew - 1) > fn.ROW_BLOCK_MAX else skew)])
        assert got == wanted, (variant, got)
    if N < 2048:
        op, twice = OPS[name], 0
        for params, inputs in freeze_patterns(op):
            if TRAIN in params.values():
                all_trained = each and params == ALL_TRAIN[name] and all(inputs.values())
                check_op(op, (9, N), dtype, params, inputs, elementwise=True, twice=all_trained)
                twice += all_trained
        assert twice == each


def test_row_skew_rule():
    """`_row_skew` on real tensors: 16 bytes' worth of elements for odd rows
    whose tensors start on a 16-byte boundary and whose strides agree
    modulo a vector; 0 for rows already in vectors, rows of a multiple of 2
    or 4 (ALIGN's narrower vectors), a tensor off a boundary, mixed element
    sizes or strides that differ modulo a vector."""
    bf16 = torch.empty(4, 1001, dtype=torch.bfloat16)
    assert fn._row_skew(1001, (1001, 1001), (bf16, bf16)) == 8
    assert fn._row_skew(1001, (1001,), (bf16.float(),)) == 4
    assert fn._row_skew(1001, (1009, 1001), (bf16, bf16)) == 8   # 1009 = 1001 + 8
    assert fn._row_skew(1001, (1002, 1001), (bf16, bf16)) == 0
    assert fn._row_skew(1024, (1024,), (bf16,)) == 0
    assert fn._row_skew(1002, (1002,), (bf16,)) == 0
    assert fn._row_skew(1001, (1001, 1001), (bf16, bf16.float())) == 0
    off = torch.empty(4 * 1001 + 1, dtype=torch.bfloat16)[1:].view(4, 1001)
    assert off.data_ptr() % 16 and fn._row_skew(1001, (1001, 1001), (bf16, off)) == 0


@pytest.mark.parametrize("shape, groups, align, long_align", [
    ((2, 4, 10, 10), 2, 4, 8), ((2, 4, 5, 40), 2, 8, 1), ((2, 8, 14, 14), 4, 4, 8),   # HW 100, 200, 196
    ((3, 6, 7, 7), 3, 1, 2), ((2, 4, 8, 8), 2, 1, 1), ((3, 3, 7, 7), 3, 1, None)])  # HW 49 (odd), 64; rows of 49
@pytest.mark.parametrize("kernels", ["own", "long", "short"])
def test_group_norm_aligned(shape, groups, align, long_align, kernels, monkeypatch):
    """GroupNorm's own and short-row kernels take ALIGN from HW (`_align`; x
    is indexed as a contiguous (B, C, HW)), the long-row kernels from a
    row's Cg * HW elements (rows of an odd length stay with the own kernels): every
    launch of the forward and of the backward, trained and dx alone
    (recorded on meta tensors); against float64, trained and frozen (a
    wrong ALIGN would misplace channels)."""
    from bench_frozen_norm import recording
    if kernels == "long":
        _group_long_rows_from(fn.ROW_BLOCK_MAX, monkeypatch)
        align = align if long_align is None else long_align
    else:
        _group_kernels(kernels, monkeypatch)
    x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    w = torch.empty(shape[1], device="meta", dtype=torch.bfloat16)
    with recording() as rec:
        _, stats = fn.group_norm_forward(x, groups, w, w)
        fn.group_norm_backward(x, x, groups, w, w, stats)
        fn.group_norm_backward(x, x, groups, w, w, stats, compute_dw=False, compute_db=False)
    aligns = [lc.constexprs["ALIGN"] for lc in rec.launches if lc.name != "_sum_partials_kernel"]
    names = {lc.name for lc in rec.launches if lc.name != "_sum_partials_kernel"}
    assert len(aligns) >= 3 and set(aligns) == {align}, [(lc.name, lc.constexprs.get("ALIGN")) for lc in rec.launches]
    if kernels == "short":
        assert names == {"_group_rows_fwd_kernel", "_group_rows_bwd_kernel"}, names
    else:
        own = kernels == "own" or long_align is None
        assert names == ({"_group_norm_fwd_kernel", "_group_norm_bwd_kernel"} if own else
                         {"_long_row_norm_fwd_kernel", "_long_row_norm_bwd_kernel"}), names
    for params in (ALL_TRAIN["gn"], ALL_FROZEN["gn"]):
        check_op(OPS["gn"], shape, torch.bfloat16, params, _with_grads("gn"), groups=groups)


def test_tiling_follows_warp_limits(monkeypatch):
    """The tiling cache is keyed on every constant it reads: a changed
    MIN_WARPS (the benchmark's --set) plans afresh, not from a stale entry."""
    assert fn._row_tiling(37, 100).num_warps == fn.MIN_WARPS   # cached with the default limits
    monkeypatch.setattr(fn, "MIN_WARPS", 16)
    assert fn._row_tiling(37, 100).num_warps == 16


@pytest.mark.parametrize("N, rows_chunk", [
    (9216, 2048), (12288, 4096), (13312, 2048), (16384, 4096), (20480, 4096), (24576, 8192), (32768, 8192),
    (262144, 8192), (70001, 8192)])
def test_long_row_chunks(N, rows_chunk):
    """The long-row planner on the real limits: a quarter row, at most
    LONG_CHUNK_MAX, halved once where that pads the row less (13312: 2048,
    though 1024 pads it less still). PolyNorm's backward holds rows up to
    POLY_ROW_BLOCK_MAX in one tile (but padded ones) and plans longer ones so."""
    rows = fn._row_tiling(2048, N)
    assert not rows.one_pass and rows.block_n == rows_chunk
    assert fn._row_tiling(2048, N, padded_long=True) == rows   # past ROW_BLOCK_MAX the padded rule changes nothing
    assert rows.num_warps == fn._warps_for(rows_chunk, fn.LONG_ELEMENTS_PER_THREAD)
    poly = fn._row_tiling(2048, N, block_max=fn.POLY_ROW_BLOCK_MAX)
    assert poly.one_pass if N <= fn.POLY_ROW_BLOCK_MAX else poly == rows


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
def test_long_row_backward_register_cap(name):
    """The long-row backward launches with ptxas's register cap
    LONG_BWD_MAX_REGISTERS (the offline compile of --dce takes it from the
    launch too); no other kernel of the backward has a cap."""
    from bench_frozen_norm import VARIANTS, record_backward
    rec = record_backward(name, (4, 65536), VARIANTS[name]["trainable"])
    caps = {launch.name: launch.maxnreg for launch in rec.launches}
    assert caps.pop("_long_row_norm_bwd_kernel") == fn.LONG_BWD_MAX_REGISTERS
    assert caps and all(cap is None for cap in caps.values()), caps


HIGH, LOW, EIGHT = fn.LONG_BWD_SPILL_MAX_REGISTERS, fn.LONG_BWD_MAX_REGISTERS, fn.LONG_BWD_8_WARP_MAX_REGISTERS


@pytest.mark.parametrize("name, N, dtype, chunk, cap", [
    ("rms", 5120, torch.bfloat16, 1024, HIGH),       # 5 whole chunks of 1024 (4 warps)
    ("rms", 10240, torch.float16, 2048, EIGHT),      # 5 whole chunks of 2048 (8 warps): a third program per SM
    ("fadd", 10240, torch.bfloat16, 2048, EIGHT),
    ("rms", 9216, torch.bfloat16, 1024, HIGH),       # RMSNorm's 9 chunks of 1024 (LONG_BWD_SPILL_CHUNK_MIN)
    ("ln", 13312, torch.bfloat16, 2048, EIGHT),      # two sums: 6.5 chunks of 2048, unrolled: 7 or more on 8 warps
    ("ln", 14336, torch.float16, 2048, EIGHT),       # 7 chunks
    ("fadd", 14336, torch.bfloat16, 4096, LOW),      # one sum: 3.5 chunks of 4096 on 16 warps (HALVED_MAX_CHUNKS)
    ("rms", 13312, torch.bfloat16, 4096, LOW),       # (not 13 of 1024)
    ("fadd", 9216, torch.bfloat16, 2048, LOW),       # 4.5 chunks of 2048: fewer than 7
    ("rms", 13312, torch.float32, 2048, HIGH),       # fp32: one halving, the higher cap, on 8 warps too
    ("rms", 10240, torch.float32, 2048, HIGH),
    ("ln", 12288, torch.float32, 4096, HIGH),
    ("fadd", 32768, torch.float32, 8192, LOW),       # 32 warps: 128 registers each would not fit an SM
    ("rms", 12288, torch.bfloat16, 4096, LOW),       # 3 chunks
    ("rms", 4608, torch.bfloat16, 512, LOW),         # 9 chunks of 512
    ("ln", 10240, torch.bfloat16, 2048, LOW),        # two sums, pre-summed
    ("rms", 20480, torch.bfloat16, 4096, HIGH),      # pre-summed (past LONG_BWD_PRESUM_AFTER), 16 warps
    ("rms", 18432, torch.bfloat16, 2048, HIGH),      # pre-summed on 8 warps: not per lane
    ("rms", 28672, torch.float32, 4096, HIGH),
    ("fadd", 20480, torch.bfloat16, 4096, LOW),      # FusedAdd's pre-summed rows keep the cap
    ("rms", 40960, torch.bfloat16, 8192, LOW)])      # 32 warps: 128 registers each would not fit an SM
def test_long_row_backward_spill_cap(name, N, dtype, chunk, cap, monkeypatch):
    """Planned as under PIPED_ALL_TRITON (before CUDA13_PTXAS_TRITON), whatever
    Triton runs: RMSNorm's and FusedAdd's long-row backward with per-lane sums, on
    16-bit rows of LONG_BWD_SPILL_CHUNKS or more whole chunks of 1024
    elements or more, RMSNorm's on pre-summed rows and every fp32 row, in
    chunks of at most 16 warps, launches with LONG_BWD_SPILL_MAX_REGISTERS
    instead of LONG_BWD_MAX_REGISTERS (see that constant); the per-lane rows
    on 8 warps, and the 16-bit rows unrolled over at least
    LONG_BWD_8_WARP_MIN_CHUNKS chunks of 8 warps (LayerNorm's: those with
    one sum keep chunks of 4096 there, HALVED_MAX_CHUNKS), with
    LONG_BWD_8_WARP_MAX_REGISTERS. RMSNorm's frozen one halves such rows'
    chunks down to LONG_BWD_SPILL_CHUNK_MIN where that pads less and leaves
    whole chunks. On a GPU the variants with a raised cap compile and run,
    checked against float64."""
    monkeypatch.setattr(fn, "_TRITON_VERSION", fn.PIPED_ALL_TRITON)
    _check_long_row_cap(name, N, dtype, chunk, cap, run=cap != LOW)


def _check_long_row_cap(name, N, dtype, chunk, cap, run):
    """The frozen long-row backward of rows of N launches alone, in chunks of
    `chunk`, with the register cap `cap`; if `run`, checked against float64
    (on a GPU that launch compiles and runs)."""
    from bench_frozen_norm import VARIANTS, record_backward
    rec = record_backward(name, (4, N), VARIANTS[name]["all frozen" if name == "ln" else "frozen w"], dtype)
    (launch,) = rec.launches
    assert launch.name == "_long_row_norm_bwd_kernel" and launch.constexprs["BLOCK_N"] == chunk
    assert launch.maxnreg == cap
    if run:
        check_op(OPS[name], (3, N), dtype, ALL_FROZEN[name], _with_grads(name))


CUDA13 = fn.CUDA13_MAX_REGISTERS


@pytest.mark.parametrize("name, N, dtype, chunk, before, cap", [
    ("rms", 4352, torch.bfloat16, 1024, CUDA13, CUDA13),  # 4.25 chunks of 4 warps, unrolled (from PIPED_ALL_TRITON on)
    ("fadd", 4864, torch.float16, 1024, LOW, CUDA13),     # FusedAdd's: from CUDA13_PTXAS_TRITON on
    ("fadd", 9216, torch.bfloat16, 2048, LOW, CUDA13),    # 4.5 chunks of 8 warps
    ("rms", 8448, torch.float16, 2048, LOW, CUDA13),
    ("rms", 10240, torch.bfloat16, 2048, EIGHT, HIGH),    # RMSNorm's under LONG_BWD_8_WARP_MAX_REGISTERS
    ("fadd", 10240, torch.bfloat16, 2048, EIGHT, EIGHT),  # FusedAdd's keep it
    ("rms", 12800, torch.bfloat16, 4096, LOW, LOW),       # 16 warps (HALVED_MAX_CHUNKS)
    ("ln", 14336, torch.float16, 2048, EIGHT, EIGHT),     # LayerNorm's are not changed
    ("rms", 4377, torch.bfloat16, 1024, LOW, LOW),        # odd: loads not in 16-byte vectors
    ("rms", 2560, torch.bfloat16, 512, LOW, LOW),         # not past half a tile
    ("rms", 6144, torch.bfloat16, 2048, LOW, LOW),        # 3 chunks
    ("rms", 12288, torch.bfloat16, 4096, LOW, LOW),       # 16 warps
    ("rms", 9216, torch.bfloat16, 1024, HIGH, HIGH),
    ("rms", 10240, torch.float32, 2048, HIGH, HIGH)])
def test_long_row_backward_ptxas_cap(name, N, dtype, chunk, before, cap, monkeypatch):
    """Planned as under CUDA13_PTXAS_TRITON (Triton 3.9, whose CUDA 13 ptxas
    spills where 3.8's did not), whatever Triton runs: RMSNorm's and
    FusedAdd's long-row dx kernel on 16-bit rows whose loads vectorize, in
    LONG_BWD_SPILL_CHUNKS unrolled chunks or more of 4 or 8 warps, takes
    CUDA13_MAX_REGISTERS where it took LONG_BWD_MAX_REGISTERS, and RMSNorm's
    frozen one LONG_BWD_SPILL_MAX_REGISTERS where it took
    LONG_BWD_8_WARP_MAX_REGISTERS; every other launch keeps its cap, and
    planned as under PIPED_ALL_TRITON each takes `before`. The raised caps'
    launches run, checked against float64."""
    monkeypatch.setattr(fn, "_TRITON_VERSION", fn.PIPED_ALL_TRITON)
    _check_long_row_cap(name, N, dtype, chunk, before, run=False)
    monkeypatch.setattr(fn, "_TRITON_VERSION", fn.CUDA13_PTXAS_TRITON)
    _check_long_row_cap(name, N, dtype, chunk, cap, run=cap != before)


@pytest.mark.parametrize("name, N, dtype, chunk, cap", [
    ("rms", 4352, torch.bfloat16, 1024, CUDA13),    # 4.25 chunks of 4 warps, unrolled
    ("rms", 4864, torch.float16, 1024, CUDA13),
    ("fadd", 4864, torch.bfloat16, 1024, LOW),      # FusedAdd's: from CUDA13_PTXAS_TRITON on
    ("rms", 4608, torch.bfloat16, 512, LOW),        # 9 chunks of 512: a loop
    ("fadd", 9216, torch.bfloat16, 2048, LOW),      # 8 warps: from CUDA13_PTXAS_TRITON on
    ("rms", 4377, torch.bfloat16, 1024, LOW)])      # odd: loads not in 16-byte vectors
def test_long_row_backward_4_warp_cap(name, N, dtype, chunk, cap, monkeypatch):
    """From PIPED_ALL_TRITON on (Triton 3.8, whose ptxas spills them under
    LONG_BWD_MAX_REGISTERS), RMSNorm's long-row dx kernel on 16-bit rows
    whose loads vectorize, in LONG_BWD_SPILL_CHUNKS unrolled chunks or more
    of 4 warps, takes CUDA13_MAX_REGISTERS; planned as under the Triton
    before, LONG_BWD_MAX_REGISTERS, and so is FusedAdd's under PIPED_ALL_TRITON.
    The raised cap's launches run, checked against float64."""
    monkeypatch.setattr(fn, "_TRITON_VERSION", (fn.PIPED_ALL_TRITON[0], fn.PIPED_ALL_TRITON[1] - 1))
    _check_long_row_cap(name, N, dtype, chunk, LOW, run=False)
    monkeypatch.setattr(fn, "_TRITON_VERSION", fn.PIPED_ALL_TRITON)
    _check_long_row_cap(name, N, dtype, chunk, cap, run=cap != LOW)


@pytest.mark.parametrize("name, size, call, dtype, joint", [
    ("ln", (4, 32768), "all frozen", torch.bfloat16, True),     # 32 warps under LONG_BWD_MAX_REGISTERS
    ("ln", (4, 65536), "trainable", torch.bfloat16, True),      # the dx launch of a trained backward too
    ("ln", (4, 12288), "all frozen", torch.float32, True),      # 16 warps under LONG_BWD_SPILL_MAX_REGISTERS
    ("ln", (4, 16384), "all frozen", torch.bfloat16, False),    # 16 warps under 64 registers: two per SM
    ("ln", (4, 24576), "all frozen", torch.bfloat16, False),    # six chunks of 4096, 16 warps
    ("rms", (4, 32768), "frozen w", torch.bfloat16, False),     # one sum
    ("fadd", (4, 32768), "frozen w", torch.bfloat16, False),
    ("poly", (4, 32768), "all frozen", torch.bfloat16, True),   # three sums
    ("poly", (4, 32768), "trainable", torch.bfloat16, True),    # four
    ("poly", (4, 20480), "trainable", torch.bfloat16, False),   # 16 warps
    ("gn", (16, 512, 64, 64, 32), "all frozen", torch.bfloat16, True),
    ("gn", (16, 512, 64, 64, 32), "trainable", torch.bfloat16, False)])   # per-channel sums
def test_long_row_backward_joint(name, size, call, dtype, joint):
    """The long-row backward reduces pass 1's row sums as one tuple (JOINT)
    where a program holds all of its SM's registers (`_holds_sm`) and it
    has several per-lane sums: LayerNorm's, GroupNorm's with w and b frozen,
    PolyNorm's; never with one sum. On meta tensors; the fp32 LayerNorm and
    the frozen PolyNorm case then run against float64 (LayerNorm's bf16 rows
    of 65536 and PolyNorm's trained ones do in test_chunk_rules)."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward(name, size, VARIANTS[name][call], dtype).launches[0]
    assert launch.name == ("_long_poly_norm_bwd_kernel" if name == "poly" else "_long_row_norm_bwd_kernel")
    assert launch.constexprs["JOINT"] == joint
    if dtype == torch.float32 or (name, call) == ("poly", "all frozen"):
        check_op(OPS[name], (3, size[1]), dtype, ALL_FROZEN[name], _with_grads(name))


@pytest.mark.parametrize("name, N, call, dtype, unroll", [
    ("rms", 576, "frozen w", torch.bfloat16, True),       # 3 chunks of 256 on one warp
    ("rms", 5376, "frozen w", torch.float32, True),       # 3 of 2048
    ("fadd", 2304, "frozen w", torch.bfloat16, True),     # 3 of 1024
    ("ln", 13312, "fwd", torch.bfloat16, True),           # 7 of 2048, the forward
    ("ln", 13312, "all frozen", torch.float32, True),
    ("ln", 13312, "trainable", torch.bfloat16, True),     # the dx launch of a trained backward
    ("poly", 1152, "fwd", torch.bfloat16, True),          # 4 whole chunks of 256 and a tail (TAIL)
    ("poly", 5376, "trainable", torch.float32, True),
    ("ln", 4352, "all frozen", torch.bfloat16, True),     # 9 of 512, the last partial
    ("poly", 8448, "all frozen", torch.bfloat16, True),   # 17 of 512, the last partial
    ("ln", 4608, "all frozen", torch.bfloat16, False),    # 9 whole chunks of 512: over UNROLL_MAX_CHUNKS
    ("rms", 16384, "frozen w", torch.bfloat16, False)])   # chunks of 4096: over UNROLL_MAX_BLOCK_N
def test_long_row_unroll(name, N, call, dtype, unroll):
    """The long-row kernels unroll both passes whole (UNROLL, a
    `loop_unroll_factor` of every chunk) on chunks of at most
    UNROLL_MAX_BLOCK_N elements, at most UNROLL_MAX_CHUNKS of them or the last
    one partial, and leave more whole chunks and wider ones to the compiler.
    On meta tensors; the unrolled ones then run against float64 (on a GPU,
    the unrolled code)."""
    from bench_frozen_norm import VARIANTS, record_backward, record_forward
    rec = (record_forward(name, (3, N), dtype) if call == "fwd"
           else record_backward(name, (3, N), VARIANTS[name][call], dtype))
    launch = rec.launches[0]
    assert launch.name.startswith("_long_") and launch.constexprs["UNROLL"] == unroll, launch.name
    block_n = launch.constexprs["BLOCK_N"]
    assert unroll == (block_n <= fn.UNROLL_MAX_BLOCK_N and (N % block_n > 0 or N // block_n <= fn.UNROLL_MAX_CHUNKS))
    if unroll:
        params = ALL_TRAIN[name] if call == "trainable" else ALL_FROZEN[name]
        check_op(OPS[name], (3, N), dtype, params, _with_grads(name))


def _long_bwd_launch(rec):
    """The long-row backward's launch among a recorded call's launches."""
    return next(lc for lc in rec.launches if lc.name == "_long_row_norm_bwd_kernel")


@pytest.mark.parametrize("name, size, call, dtype, unroll_sums", [
    ("rms", (3, 16384), "frozen w", torch.bfloat16, True),     # 4 chunks of 4096
    ("fadd", (3, 12288), "frozen w", torch.float32, True),     # 3 of 4096
    ("ln", (3, 15360), "trainable", torch.bfloat16, True),     # the dx launch; 4 of 4096, the last partial
    ("ln", (2, 32768), "all frozen", torch.bfloat16, True),    # 4 of 8192
    ("gn", (64, 128, 64, 64, 32), "all frozen", torch.bfloat16, True),   # rows of 16384: 4 of 4096
    ("rms", (3, 20480), "frozen w", torch.bfloat16, False),    # 5 of 4096: over UNROLL_SUMS_MAX_CHUNKS
    ("ln", (3, 65536), "all frozen", torch.bfloat16, False),   # 4 of 16384: over LONG_CHUNK_MAX
    ("gn", (64, 96, 64, 64, 32), "all frozen", torch.float16, True),     # rows of 12288
    ("gn", (16, 512, 64, 64, 32), "all frozen", torch.bfloat16, False)])
def test_long_row_unroll_sums(name, size, call, dtype, unroll_sums):
    """The long-row backward unrolls its pass 1 alone (UNROLL_SUMS) where a
    row has at most UNROLL_SUMS_MAX_CHUNKS chunks of at most LONG_CHUNK_MAX
    elements. On meta tensors; the row norms' unrolled cases then run against
    float64 (on a GPU, the unrolled code; GroupNorm's in
    test_long_row_unroll_sums_group, on a shorter row)."""
    from bench_frozen_norm import VARIANTS, record_backward
    rec = record_backward(name, size, VARIANTS[name][call], dtype)
    launch = _long_bwd_launch(rec)
    N, block_n = launch.constexprs["N"], launch.constexprs["BLOCK_N"]
    assert launch.constexprs["UNROLL_SUMS"] == unroll_sums, (N, block_n)
    assert unroll_sums == (block_n <= fn.LONG_CHUNK_MAX and -(-N // block_n) <= fn.UNROLL_SUMS_MAX_CHUNKS)
    assert not launch.constexprs["UNROLL"]   # chunks wider than UNROLL_MAX_BLOCK_N: both passes are not
    if unroll_sums and name != "gn":
        params = ALL_TRAIN[name] if call == "trainable" else ALL_FROZEN[name]
        check_op(OPS[name], size, dtype, params, _with_grads(name))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_long_row_unroll_sums_group(dtype, monkeypatch):
    """GroupNorm's frozen rows with UNROLL_SUMS against float64: two rows of
    3 x 64 x 64 = 12288 (3 chunks of 4096) through the long-row kernels."""
    from bench_frozen_norm import VARIANTS, record_backward
    _group_long_rows_from(64, monkeypatch)
    shape, groups = (2, 3, 64, 64), 1
    rec = record_backward("gn", (*shape, groups), VARIANTS["gn"]["all frozen"], dtype)
    launch = _long_bwd_launch(rec)
    assert launch.constexprs["UNROLL_SUMS"] and not launch.constexprs["UNROLL"]
    check_op(OPS["gn"], shape, dtype, ALL_FROZEN["gn"], {"x": True}, groups)


@pytest.mark.parametrize("N, call, dtype, block_n, unroll", [
    (11264, "all frozen", torch.bfloat16, 2048, True),   # 2.75 chunks of 4096: 5.5 of 2048, unrolled
    (10241, "trainable", torch.float16, 2048, True),
    (11264, "all frozen", torch.float32, 4096, False),   # fp32 rows: kept
    (12288, "all frozen", torch.bfloat16, 4096, False),  # 3 whole chunks of 4096: kept
    (20480, "trainable", torch.bfloat16, 4096, False),   # past POLY_ROW_BLOCK_MAX: kept
    (4608, "all frozen", torch.bfloat16, 1024, True),    # frozen, 9 whole chunks of 512: 4.5 of 1024
    (4608, "trainable", torch.bfloat16, 512, False),     # trained: kept
    (4608, "all frozen", torch.float32, 512, False),     # fp32: kept
    (4352, "all frozen", torch.bfloat16, 512, True),     # 8.5 chunks of 512: unrolled already
    (2304, "all frozen", torch.bfloat16, 256, False)])   # one-warp chunks (POLY_WARP_ROW_MAX): kept
def test_poly_unrolled_chunks(N, call, dtype, block_n, unroll):
    """PolyNorm's backward of 16-bit padded rows whose last chunk of more than
    UNROLL_MAX_BLOCK_N is partial walks chunks of UNROLL_MAX_BLOCK_N, and its
    frozen backward of rows of more than UNROLL_MAX_CHUNKS whole chunks
    walks chunks twice as long, both of which UNROLL unrolls
    (`_poly_unrolled_chunks`). On meta tensors; the unrolled plans then run
    against float64."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward("poly", (3, N), VARIANTS["poly"][call], dtype).launches[0]
    assert launch.name == "_long_poly_norm_bwd_kernel"
    assert launch.constexprs["BLOCK_N"] == block_n
    assert launch.constexprs["UNROLL"] == unroll
    if unroll:
        params = ALL_TRAIN["poly"] if call == "trainable" else ALL_FROZEN["poly"]
        check_op(OPS["poly"], (3, N), dtype, params, _with_grads("poly"))


@pytest.mark.parametrize("N, call, dtype, block_n", [
    (14336, "all frozen", torch.bfloat16, 2048),   # frozen past ROW_BLOCK_MAX: the long-row plan, 7 x 2048
    (16384, "all frozen", torch.float16, 4096),
    (12800, "all frozen", torch.bfloat16, 2048),   # 6.25 x 2048, unrolled
    (9216, "trainable", torch.bfloat16, 2048),     # trained, padded: 4.5 x 2048 (UNROLL_MAX_BLOCK_N), not 9 x 1024
    (8704, "no dx", torch.bfloat16, 2048),         # not 17 x 512
    (8448, "frozen w", torch.float16, 2048),
    (14336, "trainable", torch.bfloat16, None),    # trained, filling the tile: kept in it
    (8192, "all frozen", torch.bfloat16, None),    # not past ROW_BLOCK_MAX: the tile
    (14336, "all frozen", torch.float32, None),    # fp32 frozen rows keep the tile,
    (9216, "trainable", torch.float32, 2048),      # and halve their padded rows' chunks as 16-bit ones do
    (8704, "all frozen", torch.float32, 2048)])
def test_poly_long_plan(N, call, dtype, block_n):
    """PolyNorm's frozen backward of 16-bit rows past ROW_BLOCK_MAX takes the
    long-row plan, as the row norms' do, and its trained 16-bit rows past it
    that fill the tile of POLY_ROW_BLOCK_MAX poorly halve their chunks down to
    UNROLL_MAX_BLOCK_N only, as do fp32 rows, frozen or not; frozen fp32 rows
    that fill the tile keep it (block_n None: the tile). Unrolled over
    LONG_BWD_8_WARP_MIN_CHUNKS or more chunks of 8 warps, it launches with
    LONG_BWD_8_WARP_MAX_REGISTERS. On meta tensors; the changed plans then
    run against float64."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward("poly", (3, N), VARIANTS["poly"][call], dtype).launches[0]
    if block_n is None:
        assert launch.name == "_poly_norm_bwd_kernel"
        return
    assert launch.name == "_long_poly_norm_bwd_kernel" and launch.constexprs["BLOCK_N"] == block_n
    assert launch.constexprs["UNROLL"] == (block_n == fn.UNROLL_MAX_BLOCK_N)
    eight = launch.num_warps == 8 and -(-N // block_n) >= fn.LONG_BWD_8_WARP_MIN_CHUNKS and dtype != torch.float32
    assert launch.maxnreg == (fn.LONG_BWD_8_WARP_MAX_REGISTERS if eight else fn.LONG_BWD_MAX_REGISTERS)
    want = VARIANTS["poly"][call]
    params = {"weight": TRAIN if want["dw"] else FROZEN, "bias": TRAIN if want["db"] else FROZEN}
    check_op(OPS["poly"], (3, N), dtype, params, {"x": bool(want["dx"])})


@pytest.mark.parametrize("name, size, call, joint", [
    ("ln", (8192, 5120), "trainable", True),      # 16 warps: one program per SM
    ("ln", (8192, 8192), "frozen b", True),
    ("ln", (4096, 9216), "frozen w", False),      # db alone past ROW_BLOCK_MAX, piped
    ("ln", (4096, 13312), "frozen w", False),     # and with RELOAD
    ("ln", (16384, 4096), "trainable", False),    # 8 warps: two per SM
    ("ln", (8192, 8192), "all frozen", True),     # frozen, tiles of ROW_BLOCK_MAX (Triton 3.8's late load)
    ("ln", (8192, 7168), "all frozen", True),
    ("ln", (16384, 4096), "all frozen", False),   # frozen, narrower tiles
    ("rms", (8192, 8192), "trainable", False),    # one sum
    ("fadd", (8192, 8192), "trainable", False)])
def test_tile_backward_joint(name, size, call, joint):
    """The tile backward reduces a row's c1 and c2 sums as one pair (JOINT)
    where its persistent grid puts one program on each SM (a trained
    LayerNorm on 16 warps, rows up to ROW_BLOCK_MAX), and a frozen
    LayerNorm's on tiles of ROW_BLOCK_MAX; not on the rows past it that one
    trained parameter keeps in the tile, not where trained programs share an
    SM, not on narrower frozen tiles, nor with one sum. On meta tensors;
    then the JOINT cases against float64, on 3 rows (the same plan: it
    depends on the row, not on the number of rows)."""
    from bench_frozen_norm import VARIANTS, record_backward
    want = VARIANTS[name][call]
    launch = record_backward(name, size, want).launches[0]
    assert launch.name == "_row_norm_bwd_kernel"
    assert launch.constexprs["JOINT"] == joint
    if joint:
        assert record_backward(name, (3, size[1]), want).launches[0].constexprs["JOINT"]
        params = {"weight": TRAIN if want["dw"] else FROZEN, "bias": TRAIN if want["db"] else FROZEN}
        check_op(OPS[name], (3, size[1]), torch.bfloat16, params, _with_grads(name))


@pytest.mark.parametrize("name, N, presum", [("ln", 12288, fn.LONG_PRESUM), ("rms", 16384, 1),
                                             ("rms", 16400, fn.LONG_PRESUM), ("fadd", 70001, fn.LONG_PRESUM),
                                             ("poly", 16400, fn.LONG_PRESUM)])
def test_long_row_backward_presum(name, N, presum):
    """Pass 1 of the long-row backward pre-sums each thread's elements for
    LayerNorm and PolyNorm at every length, for RMSNorm and FusedAdd past
    LONG_BWD_PRESUM_AFTER (frozen weight: the long-row kernel at any length)."""
    from bench_frozen_norm import VARIANTS, record_backward
    rec = record_backward(name, (4, N), VARIANTS[name]["all frozen" if name in ("ln", "poly") else "frozen w"])
    kernel = "_long_poly_norm_bwd_kernel" if name == "poly" else "_long_row_norm_bwd_kernel"
    assert [(lc.name, lc.constexprs["PRESUM"]) for lc in rec.launches] == [(kernel, presum)]


@pytest.mark.parametrize("name, N, presum", [("ln", 24576, 1), ("ln", 24592, fn.LONG_PRESUM), ("poly", 24576, 1),
                                             ("poly", 40960, fn.LONG_PRESUM), ("rms", 70001, 1), ("fadd", 70001, 1)])
def test_long_row_forward_presum(name, N, presum):
    """The long-row forwards with several sums (LayerNorm, PolyNorm) pre-sum
    each thread's elements past LONG_FWD_PRESUM_AFTER; RMSNorm's and FusedAdd's
    one sum never does."""
    from bench_frozen_norm import recording
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, w = torch.empty(4, N, **meta), torch.empty(N, **meta)
    with recording() as rec:
        {"ln": lambda: fn.layer_norm_forward(x, (N,), w, w), "rms": lambda: fn.rms_norm_forward(x, (N,), w),
         "fadd": lambda: fn.fused_add_rms_norm_forward(x, x, w),
         "poly": lambda: fn.poly_norm_forward(x, torch.empty(3, **meta), torch.empty(1, **meta))}[name]()
    assert [lc.constexprs["PRESUM"] for lc in rec.launches] == [presum], rec.launches


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("N, dtype, capped", [(129, torch.bfloat16, True), (1024, torch.float32, True),
                                              (1024, torch.bfloat16, False), (199, torch.float16, True)])
def test_tile_backward_register_cap(name, N, dtype, capped):
    """The row norms' tile backward launches with TILE_BWD_MAX_REGISTERS
    where its grid is persistent (a parameter trains) and its rows are
    skewed (odd rows, read skewed when trained) or fp32; with no cap
    otherwise (aligned 16-bit rows, or frozen parameters: a program per
    tile). Recorded on meta tensors, every freeze pattern."""
    from bench_frozen_norm import VARIANTS, record_backward
    checked = set()
    for variant, want in VARIANTS[name].items():
        trains = bool(want.get("dw") or want.get("db"))
        for lc in record_backward(name, (64, N), want, dtype=dtype).launches:
            if lc.name == "_row_norm_bwd_kernel":
                assert not trains or (lc.constexprs["SKEW"] > 0) == (N % 2 == 1), (variant, lc.constexprs)
                assert lc.maxnreg == (fn.TILE_BWD_MAX_REGISTERS if capped and trains else None), variant
                checked.add(trains)
    assert checked == {True, False}


@pytest.mark.parametrize("N, kernel, cap", [(4096, "_poly_norm_bwd_kernel", fn.POLY_BWD_MAX_REGISTERS),
                                             (65536, "_long_poly_norm_bwd_kernel", fn.LONG_BWD_MAX_REGISTERS)],
                         ids=["tile", "long-rows"])
def test_poly_backward_register_cap(N, kernel, cap):
    """PolyNorm's backward launches rows held in a tile with the register cap
    POLY_BWD_MAX_REGISTERS, longer rows with the long-row backward's
    LONG_BWD_MAX_REGISTERS, one program per row; the partial-sum launch has
    none and sums a partial row per program."""
    from bench_frozen_norm import VARIANTS, record_backward
    rec = record_backward("poly", (4, N), VARIANTS["poly"]["trainable"])
    caps = {launch.name: launch.maxnreg for launch in rec.launches}
    assert caps == {kernel: cap, "_sum_partials_kernel": None}
    main, reduction = rec.launches
    assert main.args[5].shape == (main.grid[0], 4) and reduction.args[4] == main.grid[0]
    if N > fn.POLY_ROW_BLOCK_MAX:
        assert main.grid == (4,)


@pytest.mark.parametrize("M, N, rows, row_accumulators", [(64, 512, 4, True), (64, 300, 4, True),
                                                         (64, 1024, 2, False), (16, 4096, 1, False)])
def test_poly_backward_row_accumulators(M, N, rows, row_accumulators):
    """PolyNorm's tile backward keeps dw and db per tile row where a tile has
    POLY_ROW_ACCUMULATOR_ROWS rows or more (the real limits), else sums each
    tile's rows at once; both against float64 (the freeze sweep checks tiles
    of 8 and 16 rows). M: enough tiles that each program of the
    interpreter's grid loops over several (16 tiles of one row of 4096 on
    INTERPRETER_SMS x 2 programs)."""
    from bench_frozen_norm import VARIANTS, record_backward
    launch = record_backward("poly", (M, N), VARIANTS["poly"]["trainable"]).launches[0]
    assert launch.constexprs["ROWS"] == rows
    assert launch.constexprs["ROW_ACCUMULATORS"] is row_accumulators
    check_op(OPS["poly"], (M, N), torch.float32, ALL_TRAIN["poly"], _with_grads("poly"))


@pytest.mark.parametrize("x_dtype, p_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                              (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("name", list(OPS))
def test_mixed_dtypes(name, x_dtype, p_dtype):
    """x, weight and bias in different dtypes; each gradient in its own input's dtype."""
    shape, groups = small_case(name)
    check_op(OPS[name], shape, x_dtype, ALL_TRAIN[name], _with_grads(name), groups, param_dtype=p_dtype)


@pytest.mark.parametrize("row_block_max", [8192, 64], ids=["tile", "long-rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_rms_offset(dtype, row_block_max, monkeypatch):
    """Gemma's (1 + w) scaling, plain and fused, in a tile and over chunks
    (fewer rows there: `_rows_for`)."""
    _long_rows_from(row_block_max, monkeypatch)
    shape = (_rows_for(row_block_max, 100), 100)
    check_op(OPS["rms"], shape, dtype, {"weight": TRAIN}, {"x": True}, offset=1.0)
    check_op(OPS["fadd"], shape, dtype, {"weight": TRAIN}, {"x": True, "residual": True}, offset=1.0)


LONG_ROW_VARIANTS = dict(argnames="row_block_max, presum", argvalues=[(8192, False), (512, False), (512, True)],
                         ids=["tile", "long-rows", "long-rows-presum"])


@pytest.mark.parametrize(**LONG_ROW_VARIANTS)
def test_layer_norm_large_mean(row_block_max, presum, monkeypatch):
    """A large mean over a small spread: the variance must not cancel away, in a
    tile (mean first) or over chunks (per-lane or per-group shifted sums,
    merged across lanes or groups)."""
    _long_rows_from(row_block_max, monkeypatch, presum)
    x = randn(16, 3000, scale=1.0, shift=1000.0).requires_grad_()
    check = fn.layer_norm(x, (3000,))
    ref = fn.layer_norm_reference(x.detach().double().cpu(), (3000,))
    assert rel_error(check, ref) < 1e-3


@pytest.mark.parametrize("presum", [False, True], ids=["per-lane", "presum"])
def test_layer_norm_large_mean_skewed(presum, monkeypatch):
    """Skewed rows (`_row_skew`; fp32, odd) over chunks, on a mean of 1e4
    over a spread of 1: a group's shift k comes from the row's first
    element where the group starts before the row (in the lanes of its
    first vector), not from a 0 there, whose sums would cancel."""
    from bench_frozen_norm import recording
    _long_rows_from(512, monkeypatch, presum)
    x = randn(9, 3001, scale=1.0, shift=1e4).requires_grad_()
    with recording() as rec:   # on meta tensors: it records the launches, runs none
        fn.layer_norm_forward(x.detach().to("meta"), (3001,))
    assert [lc.constexprs["SKEW"] for lc in rec.launches] == [4]
    check = fn.layer_norm(x, (3001,))
    ref = fn.layer_norm_reference(x.detach().double().cpu(), (3001,))
    assert rel_error(check, ref) < 1e-3


@pytest.mark.parametrize(**LONG_ROW_VARIANTS)
def test_layer_norm_outliers(row_block_max, presum, monkeypatch):
    """Rows whose first elements (the long-row kernel's per-lane or per-group
    shifts) are outliers, 1e4 against a spread of 1: the statistics must not
    cancel."""
    _long_rows_from(row_block_max, monkeypatch, presum)
    x = randn(16, 3000)
    x[:, :700] += 1e4 * (torch.rand(16, 700, device=x.device) < 0.01)
    x.requires_grad_()
    check = fn.layer_norm(x, (3000,))
    ref = fn.layer_norm_reference(x.detach().double().cpu(), (3000,))
    assert rel_error(check, ref) < 1e-4


def _group_long_rows_from(n, monkeypatch):
    """GroupNorm's rows take the long-row kernels however few or short, in
    chunks where they are longer than n (`_long_rows_from`)."""
    _long_rows_from(n, monkeypatch)
    monkeypatch.setattr(fn, "GROUP_LONG_ROWS_PER_SM", 0)
    monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 0)


def _group_own_kernels(monkeypatch):
    """GroupNorm's own kernels take every row, however many or short (on the
    interpreter's INTERPRETER_SMS two rows are already many)."""
    monkeypatch.setattr(fn, "GROUP_LONG_ROWS_PER_SM", math.inf)
    monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 0)


def _group_short_rows_all(monkeypatch):
    """GroupNorm's short-row kernels take every row of the tests' sizes."""
    monkeypatch.setattr(fn, "GROUP_LONG_ROWS_PER_SM", math.inf)
    monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 2**14)


def _group_kernels(kernels, monkeypatch):
    """GroupNorm on its own kernels ("own"), the long-row kernels ("long", in
    chunks past 64 elements) or the short-row kernels ("short"), whatever the rows."""
    {"own": _group_own_kernels, "long": lambda mp: _group_long_rows_from(64, mp),
     "short": _group_short_rows_all}[kernels](monkeypatch)


def _row_kernels_of(shape, groups):
    """Which kernels take GroupNorm's rows of x of `shape` ("short", "long" or "own")."""
    B, C = shape[:2]
    return fn._group_row_kernels(B, C, math.prod(shape[2:]), groups, torch.device(DEVICE))[0]


def _takes_long_rows(shape, groups):
    return _row_kernels_of(shape, groups) == "long"


def _takes_short_rows(shape, groups):
    return _row_kernels_of(shape, groups) == "short"


def _short_rows_plan(B, C, HW, G, backward=False):
    """The short-row kernels' plan of `_group_row_kernels`, None where other kernels take the rows."""
    kernels, plan = fn._group_row_kernels(B, C, HW, G, torch.device(DEVICE), backward=backward)
    return plan if kernels == "short" else None


@pytest.mark.parametrize("kernels", ["own", "long", "short"])
def test_group_norm_large_mean(kernels, monkeypatch):
    """GroupNorm's statistics on a large mean over a small spread: per tile,
    merged with Chan's formula, in one program per group and split over
    programs (B * G = 2); through the long-row kernels' per-group shifts; or
    in the short-row kernels' tile of whole rows (the mean first)."""
    _group_kernels(kernels, monkeypatch)
    assert (_takes_long_rows((1, 4, 30, 50), 2), _takes_short_rows((1, 4, 30, 50), 2)) == (
        kernels == "long", kernels == "short")
    x = randn(1, 4, 30, 50, scale=1.0, shift=1000.0).requires_grad_()
    w, b = randn(4, shift=1.0), randn(4)
    check = fn.group_norm(x, 2, w, b)
    ref = fn.group_norm_reference(x.detach().double().cpu(), 2, w.double().cpu(), b.double().cpu())
    assert rel_error(check, ref) < 1e-3


@pytest.mark.parametrize("op, kernels, trained", [
    ("ln", "tile", True), ("ln", "long", True), ("ln", "long", False), ("gn", "own", True), ("gn", "long", True),
    ("gn", "long", False), ("gn", "short", True), ("gn", "short", False)])
def test_large_mean_backward(op, kernels, trained, monkeypatch):
    """The backward on a large mean over a small spread (fp32, 1000 against
    1), dy = y + noise so that c1 counts. LayerNorm's and GroupNorm's kernels
    take the row's mean out of their per-element arithmetic (xhat = x * rstd
    - mean * rstd, `_xhat`; sums of x * g less mean * sum(g),
    `_long_row_norm_bwd_kernel`), so products are rounded at the size of x;
    dx, dw and db must stay within a few times the mean's own rounding,
    about 6e-8 * 1000, of float64: in a tile and on the long-row kernels
    (GroupNorm: its own, the long-row and the short-row kernels).
    GroupNorm's dw has 4 entries, the smallest a twentieth of the largest,
    each summed over 1500 such products: 2.0e-4 measured on a GPU (three
    seeds, Triton 3.6 and 3.8), hence 4e-4 (E[x^2] - E[x]^2 would lose the
    variance itself, 1000^2 * 6e-8 against 1)."""
    if op == "ln":
        if kernels == "long":
            _long_rows_from(512, monkeypatch)
        x = randn(16, 3000, shift=1000.0)
        w, b = randn(3000, shift=1.0), randn(3000)
        run = lambda x, w, b: fn.layer_norm(x, (3000,), w, b)   # noqa: E731
        ref = lambda x, w, b: fn.layer_norm_reference(x, (3000,), w, b)   # noqa: E731
    else:
        _group_kernels(kernels, monkeypatch)
        assert _takes_long_rows((1, 4, 30, 50), 2) == (kernels == "long")
        x = randn(1, 4, 30, 50, shift=1000.0)
        w, b = randn(4, shift=1.0), randn(4)
        run = lambda x, w, b: fn.group_norm(x, 2, w, b)   # noqa: E731
        ref = lambda x, w, b: fn.group_norm_reference(x, 2, w, b)   # noqa: E731
    leaves = [x.requires_grad_(), w.requires_grad_(trained), b.requires_grad_(trained)]
    y = run(*leaves)
    dy = y.detach() + randn(*y.shape)
    y.backward(dy)
    leaves64 = [t.detach().double().cpu().requires_grad_(t.requires_grad) for t in leaves]
    ref(*leaves64).backward(dy.double().cpu())
    for name, t, t64 in zip("xwb", leaves, leaves64):
        if t.requires_grad:
            assert rel_error(t.grad, t64.grad) < 4e-4, f"d{name} error {rel_error(t.grad, t64.grad):.2e}"
        else:
            assert t.grad is None


# GroupNorm through the long-row kernels: HW = 64 (w loaded once per 8
# elements), 36 (per 4), a row of one channel, and 9 channels of HW = 8. With
# w or b trained, the backward's per-channel sums go in tiles (BLOCK_C x
# BLOCK_HW) of 2 x 16, 1 x 16 (the last 4 of 16 lanes in a channel), 1 x 16
# (100 positions in 7 tiles) and 8 x 2 (9 channels: the second block 1 of 8).
# Then rows that fit one chunk, as GroupNorm's many short rows do since
# `b54bcff`: 2 channels of 4 positions (a chunk of 8, PRESUM 4) and of 28 (56).
# Then odd HW, w per element (PRESUM 1): 2 channels of 49 (two chunks) and of
# 15 (rows of 30).
GROUP_LONG_SHAPES = [((3, 6, 8, 8), 3), ((3, 4, 6, 6), 2), ((2, 2, 100), 2), ((2, 18, 2, 4), 2),
                     ((4, 6, 2, 2), 3), ((3, 4, 7, 4), 2), ((2, 4, 7, 7), 2), ((3, 6, 3, 5), 3)]


def _group_cases(shapes):
    """GroupNorm's cases at `shapes`, each dtype: every freeze pattern for the
    first shape in fp32, all frozen and all trained for the others."""
    for (shape, groups), dtype in itertools.product(shapes, DTYPES):
        patterns = list(freeze_patterns(OPS["gn"]))
        if (shape, groups) != shapes[0] or dtype != torch.float32:
            patterns = [(ALL_FROZEN["gn"], {"x": True}), (ALL_TRAIN["gn"], {"x": True})]
        for params, inputs in patterns:
            yield pytest.param(shape, groups, dtype, params, inputs,
                               id=f"{DTYPE_IDS[dtype]}-{'x'.join(map(str, shape))}-{pattern_id(params, inputs)}")


@pytest.mark.parametrize("shape, groups, dtype, params, inputs", list(_group_cases(GROUP_LONG_SHAPES)))
def test_group_norm_long_rows(shape, groups, dtype, params, inputs, monkeypatch):
    """GroupNorm's forward and backward through the long-row kernels
    (per-channel w and b; with w or b trained, per-channel sums). Where dx is
    asked, GroupNorm's own backward is stubbed out, so the test fails if it
    runs; without dx it takes the call (the long-row kernel always writes dx)."""
    _group_long_rows_from(64, monkeypatch)
    assert _takes_long_rows(shape, groups)
    if inputs["x"]:
        monkeypatch.setattr(fn, "_group_norm_bwd_kernel", None)
    check_op(OPS["gn"], shape, dtype, params, inputs, groups)


@pytest.mark.parametrize("presum", [2, 4, fn.LONG_PRESUM])
@pytest.mark.parametrize("shape, groups", [((2, 16, 7, 7), 2), ((2, 16, 3, 5), 2), ((2, 8, 5, 10), 2),
                                           ((3, 4, 6, 6), 2)], ids=["7x7", "3x5", "5x10", "6x6"])
@pytest.mark.parametrize("params", [ALL_FROZEN["gn"], ALL_TRAIN["gn"]], ids=["frozen", "train"])
def test_group_norm_long_rows_spanning_groups(presum, shape, groups, params, monkeypatch):
    """Groups of `presum` elements that reach into the next channel
    (`_spans_channels`): the tests' chunks are too narrow for the planner to
    pick groups of more than one element a thread, so the size is set here,
    within the planner's bounds (`_group_long_presum`: HW at least the group
    or a multiple of it, N a multiple of it), spanning also where the planner
    keeps groups of 4 in one channel (6 x 6) to reach the code. With w and b
    trained, the per-channel sums' tiles are
    [2, 4], smaller than a chunk, as the planner's are on a GPU
    (`_group_long_sum_tile`)."""
    _group_long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "_group_long_presum",
                        lambda N, HW, t: presum if HW >= presum and N % presum == 0 else math.gcd(HW, presum))
    monkeypatch.setattr(fn, "_group_long_sum_tile", lambda Cg, N, HW, t: dict(BLOCK_C=2, BLOCK_HW=4))
    assert _takes_long_rows(shape, groups)
    monkeypatch.setattr(fn, "_group_norm_bwd_kernel", None)
    check_op(OPS["gn"], shape, torch.float32, params, {"x": True}, groups)


# GroupNorm's rows of HW no multiple of 4 at real sizes, planned by the real
# SM count (the CPU tests reach these plans by lowering limits or setting the
# group's size): groups of LONG_PRESUM that span two channels (7 x 7 with 16
# channels a group, 5 x 10, 15 x 15), rows of one chunk on one or two warps
# (784, 800), and rows of 490, whose vectors of 2 keep groups of one element.
GPU_ODD_HW_SHAPES = [((128, 512, 7, 7), 32, True), ((128, 512, 5, 10), 32, True),
                     ((64, 1024, 15, 15), 32, True), ((256, 320, 7, 7), 32, False)]


@gpu
@pytest.mark.parametrize("shape, groups, spans", GPU_ODD_HW_SHAPES, ids=["7x7", "5x10", "15x15", "7x7-490"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("params", [ALL_FROZEN["gn"], ALL_TRAIN["gn"]], ids=["frozen", "train"])
def test_group_norm_odd_hw_real_plans(shape, groups, spans, dtype, params):
    """Those shapes through the long-row kernels as planned on this GPU."""
    B, C = shape[:2]
    HW = math.prod(shape[2:])
    assert _takes_long_rows(shape, groups)
    for backward in (False, True):
        t = fn._group_long_rows(B, C, HW, groups, torch.device(DEVICE), backward=backward)
        presum = fn._group_long_presum(C // groups * HW, HW, t)
        assert (HW % presum != 0) == spans and (presum == fn.LONG_PRESUM or not spans)
    check_op(OPS["gn"], shape, dtype, params, {"x": True}, groups)


def test_group_norm_sum_tiles():
    """The per-channel sums' tiles span 1 / GROUP_SUM_TILES of a channel (rounded
    up to a power of two), at most the chunk, at most Cg rounded up channels."""
    tiles = fn.GROUP_SUM_TILES
    assert fn._group_long_sum_channels(16, 1024 * tiles, 8192) == 8          # [8, 1024]
    assert fn._group_long_sum_channels(4, 4096 * tiles, 8192) == 2           # [2, 4096]
    assert fn._group_long_sum_channels(10, 100 * tiles, 8192) == 16          # [16, 512]: Cg rounded up to 16
    assert fn._group_long_sum_channels(3, 8192 * tiles, 8192) == 1           # part of a channel per chunk
    # The tile holds at most GROUP_SUM_ELEMENTS_PER_THREAD a thread, or the chunk.
    per_thread = fn.GROUP_SUM_ELEMENTS_PER_THREAD
    # A row of one chunk: at most half of it.
    chunk_4_warps = fn._RowTiling(1, 4096, False, 4, 1)
    tile = fn._group_long_sum_tile(64, 64 * 49, 49, chunk_4_warps)
    assert tile["BLOCK_C"] * tile["BLOCK_HW"] == min(128 * per_thread, 2048)
    assert tile["BLOCK_C"] == 64
    many_chunks = fn._group_long_sum_tile(4, 4 * 3969, 3969, chunk_4_warps)
    assert many_chunks["BLOCK_C"] * many_chunks["BLOCK_HW"] == min(128 * per_thread, 4096)
    small = fn._group_long_sum_tile(16, 16 * 49, 49, fn._RowTiling(1, 1024, False, 4, 1))
    assert small["BLOCK_C"] * small["BLOCK_HW"] == min(512, 128 * per_thread)


@pytest.mark.parametrize("size, unroll_sums", [
    ((128, 1024, 14, 14, 32), True),   # [32, 64] tiles: 4 steps over 196 positions
    ((256, 2048, 7, 7, 32), True),     # [64, 16]: 4 over 49
    ((16, 512, 128, 128, 32), True),   # [2, 4096]: 4 over 16384
    ((4, 64, 256, 256, 32), True),     # [1, 8192]: 8 over 65536
    ((4, 32, 512, 256, 32), False)])   # [1, 8192]: 16 over 131072, over GROUP_SUMS_UNROLL_MAX_STEPS
def test_group_norm_unroll_sums(size, unroll_sums):
    """GroupNorm's long-row backward with w or b trained unrolls its channel
    sums' loop over HW whole (UNROLL_SUMS) where it takes at most
    GROUP_SUMS_UNROLL_MAX_STEPS tiles. On meta tensors; the unrolled code
    against float64 in test_group_norm_unroll_sums_values."""
    from bench_frozen_norm import VARIANTS, record_backward
    for call in ("trainable", "frozen w"):   # both trained, or b alone
        rec = record_backward("gn", size, VARIANTS["gn"][call], torch.bfloat16)
        launch = _long_bwd_launch(rec)
        steps = -(-size[2] * size[3] // launch.constexprs["BLOCK_HW"])
        assert launch.constexprs["UNROLL_SUMS"] == unroll_sums, (call, steps)
        assert unroll_sums == (steps <= fn.GROUP_SUMS_UNROLL_MAX_STEPS)


@pytest.mark.parametrize("shape, groups, per_thread, steps", [
    ((3, 6, 8, 8), 3, 8, 4),       # rows of two channels of 8 x 8 in [2, 16] tiles
    ((2, 4, 16, 16), 2, 1, 8)])    # two channels of 16 x 16 in [1, 32] tiles, one after the other
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_group_norm_unroll_sums_values(shape, groups, per_thread, steps, dtype, monkeypatch):
    """GroupNorm's trained rows with the channel sums unrolled (UNROLL_SUMS)
    against float64, four and eight steps over a channel's positions (tiles
    of GROUP_SUM_ELEMENTS_PER_THREAD = `per_thread` a thread; on a GPU, the
    unrolled code)."""
    from bench_frozen_norm import VARIANTS, record_backward
    _group_long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "GROUP_SUM_ELEMENTS_PER_THREAD", per_thread)
    rec = record_backward("gn", (*shape, groups), VARIANTS["gn"]["trainable"], dtype)
    launch = _long_bwd_launch(rec)
    hw = shape[2] * shape[3]
    assert launch.constexprs["UNROLL_SUMS"] and hw // launch.constexprs["BLOCK_HW"] == steps
    check_op(OPS["gn"], shape, dtype, ALL_TRAIN["gn"], {"x": True}, groups)


def test_group_norm_presum():
    """GroupNorm's long rows pre-sum LONG_PRESUM elements a thread, fewer where a
    thread holds fewer of a chunk, and HW's largest power-of-two divisor (a
    group in one channel) where that is GROUP_ONE_CHANNEL_PRESUM_MIN or more,
    where HW is shorter than the group and where N is no multiple of it."""
    presum = fn.LONG_PRESUM
    wide = fn._RowTiling(1, 4096, False, 4, 1)                 # 32 elements a thread
    narrow = fn._RowTiling(1, 512, False, 4, 1)                # 4 elements a thread
    assert fn._group_long_presum(64 * 49, 49, wide) == presum  # spans two channels at most
    assert fn._group_long_presum(16 * 50, 50, wide) == presum  # spans: in one channel, groups of 2
    assert fn._group_long_presum(64 * 64, 64, wide) == presum
    assert fn._group_long_presum(32 * 196, 196, wide) == 4     # in one channel: groups of 4
    assert fn._group_long_presum(64 * 6, 6, wide) == 2 and fn._group_long_presum(64 * 5, 5, wide) == 1
    assert fn._group_long_presum(8 * 49, 49, narrow) == 4 and fn._group_long_presum(8 * 3, 3, narrow) == 1
    assert fn._group_long_presum(10 * 49, 49, narrow) == 1     # 490: vectors of 2, groups in one channel
    for cg, hw in itertools.product(range(1, 20), range(1, 70)):
        for t in (wide, narrow):
            p = fn._group_long_presum(cg * hw, hw, t)
            assert p & (p - 1) == 0 and p <= t.block_n // (32 * t.num_warps)
            assert hw % p == 0 or (hw >= p and cg * hw % p == 0)   # a group spans two channels at most
            if hw % p:   # spanning only where a group in one channel would be shorter
                assert math.gcd(hw, p) < fn.GROUP_ONE_CHANNEL_PRESUM_MIN


@pytest.mark.parametrize("params", [ALL_FROZEN["gn"], ALL_TRAIN["gn"]], ids=["frozen", "train"])
def test_group_norm_long_rows_mixed_dtypes(params, monkeypatch):
    """bf16 x with fp32 w and b through the long-row kernels."""
    _group_long_rows_from(64, monkeypatch)
    shape, groups = GROUP_LONG_SHAPES[0]
    check_op(OPS["gn"], shape, torch.bfloat16, params, {"x": True}, groups, param_dtype=torch.float32)


def test_group_norm_long_rows_plan():
    """Which GroupNorm rows take the long-row kernels: at least
    GROUP_LONG_ROWS_PER_SM per SM, of a multiple of GROUP_LONG_MIN_RUN
    elements, long or short (whatever HW)."""
    device = torch.device(DEVICE)
    rows = math.ceil(fn.GROUP_LONG_ROWS_PER_SM * fn._num_sms(device))
    hw = fn.ROW_BLOCK_MAX   # two channels per group: rows of 2 * ROW_BLOCK_MAX elements
    plan = lambda B, HW: fn._group_long_rows(B, 2, HW, 1, device)   # noqa: E731  (B rows of 2 * HW)
    assert plan(rows, hw) is not None
    assert plan(rows, 4) is not None         # rows of 8 elements too
    assert plan(rows, 196).block_n >= 392    # a row that fits a tile: one chunk
    assert plan(rows - 1, hw) is None        # too few rows (rows > 1 on any GPU and in the interpreter)
    assert plan(rows, hw + 1) is not None    # odd HW, rows of an even length
    assert plan(rows, 49) is not None
    run = fn.GROUP_LONG_MIN_RUN
    assert fn._group_long_rows(rows, 1, 2 * run + 1, 1, device) is None        # one channel: rows no multiple
    assert fn._group_long_rows(rows, 1, 2 * run, 1, device) is not None


def test_group_norm_long_row_warps():
    """A GroupNorm row that fits one tile runs one program on the warps of its
    own elements, LOOP_ELEMENTS_PER_THREAD a thread backward and, where HW is
    no multiple of LONG_PRESUM, ELEMENTS_PER_THREAD forward, down to one warp
    and at most the tile's; other forwards and rows of several chunks keep
    the plan's."""
    device = torch.device(DEVICE)
    rows = 4096   # many rows on any GPU and in the interpreter

    def warps(N, HW, backward):
        return fn._group_long_rows(rows, N // HW, HW, 1, device, backward=backward).num_warps   # rows of N

    for N in (392, 784, 1568, 4096, fn.ROW_BLOCK_MAX):
        tile = fn._row_tiling(rows, N)
        block = fn._pow2(N)
        assert tile.one_pass and tile.block_n == block
        for backward, per_thread in ((False, fn.ELEMENTS_PER_THREAD), (True, fn.LOOP_ELEMENTS_PER_THREAD)):
            assert warps(N, 2, backward) == max(1, min(tile.num_warps, block // (32 * per_thread)))
        assert warps(N, fn.LONG_PRESUM, False) == tile.num_warps   # channels of whole vectors, forward
    assert warps(392, 2, False) == warps(392, 2, True) == 1 and warps(784, 2, True) == 2
    assert warps(392, 8, True) == 1
    long = fn._row_tiling(rows, 4 * fn.ROW_BLOCK_MAX)
    assert not long.one_pass and warps(4 * fn.ROW_BLOCK_MAX, 2, True) == long.num_warps


# GroupNorm's short rows: [ROWS, BLOCK_C, BLOCK_HW] tiles of whole rows. Cg
# and HW powers of two or not (lanes masked past either), one position a
# channel (HW = 1), odd HW, rows per tile not dividing B * G (a last tile
# part empty), a tile of one row, and groups of one channel.
GROUP_SHORT_SHAPES = [((3, 6, 5, 7), 3), ((5, 24), 3), ((4, 8, 4, 4), 2), ((7, 12, 1, 1), 3), ((3, 10, 9), 5),
                      ((2, 4, 31, 33), 1), ((6, 6, 16), 6)]


@pytest.mark.parametrize("shape, groups, dtype, params, inputs", list(_group_cases(GROUP_SHORT_SHAPES)))
def test_group_norm_short_rows(shape, groups, dtype, params, inputs, monkeypatch):
    """GroupNorm's forward and backward through the short-row kernels (w and b
    per channel of each row in the tile; with w or b trained, the sums per
    (sample, channel)), under every freeze pattern for one shape. GroupNorm's
    own and the long-row kernels are stubbed out, so the test fails if
    either runs."""
    _group_short_rows_all(monkeypatch)
    assert _takes_short_rows(shape, groups)
    for name in ("_group_norm_fwd_kernel", "_group_norm_bwd_kernel", "_long_row_norm_fwd_kernel",
                 "_long_row_norm_bwd_kernel"):
        monkeypatch.setattr(fn, name, None)
    check_op(OPS["gn"], shape, dtype, params, inputs, groups)


@pytest.mark.parametrize("params", [ALL_FROZEN["gn"], ALL_TRAIN["gn"]], ids=["frozen", "train"])
def test_group_norm_short_rows_mixed_dtypes(params):
    """bf16 x with fp32 w and b through the short-row kernels (their own plan)."""
    shape, groups = GROUP_SHORT_SHAPES[0]
    assert _takes_short_rows(shape, groups)
    check_op(OPS["gn"], shape, torch.bfloat16, params, {"x": True}, groups, param_dtype=torch.float32)


def test_group_norm_short_rows_plan():
    """Which GroupNorm rows take the short-row kernels, however few: those
    whose [pow2(Cg), pow2(HW)] block holds at most GROUP_SHORT_ROW_MAX
    elements, unless the long-row kernels take rows of GROUP_LONG_ROW_MIN
    or more that fill it poorly (PADDED_ROW_FILL) or whose HW is no
    multiple of GROUP_SHORT_MIN_RUN. Then what they launch at H200 sizes (meta
    tensors): one tile of rows a program, forward and backward, and with w
    and b frozen nothing but dx allocated."""
    from bench_frozen_norm import recording
    device = torch.device(DEVICE)
    many = math.ceil(fn.GROUP_LONG_ROWS_PER_SM * fn._num_sms(device))
    plan = lambda B, C, HW: _short_rows_plan(B, C, HW, C)   # noqa: E731  (groups of one channel)
    block = fn.GROUP_SHORT_ROW_MAX
    assert plan(4096, 1, block).rows * block == fn.TILE_ELEMENTS      # the forward's tiles of whole rows
    assert plan(1, 1, block) is not None                              # however few rows
    assert plan(many, 1, block + 1) is None                           # a block of 2 * GROUP_SHORT_ROW_MAX
    assert _short_rows_plan(1, 6, block // 2, 2) is None              # 3 channels of block / 2: [4, block / 2]
    poor = block // 2 + 4                                             # fills 0.5 of its block: the long rows'
    assert plan(many, 1, poor) is None and plan(1, 1, poor) is not None   # but with too few rows for them, short
    assert plan(many, 1, block // 2 + 1) is not None                  # an odd row: the long rows would not take it
    short = lambda Cg, HW: _short_rows_plan(many, Cg, HW, 1)   # noqa: E731  (one group)
    assert short(16, 50) is None and short(16, 49) is None            # filled, but HW no multiple of 4: long rows
    assert fn._group_row_kernels(many, 1, poor, 1, device) == ("long", fn._group_long_rows(many, 1, poor, 1, device))
    assert fn._group_row_kernels(1, 1, block + 1, 1, device) == ("own", None)   # neither: GroupNorm's own kernels
    assert short(16, 64) is not None
    min_row = fn.GROUP_LONG_ROW_MIN
    assert short(2, min_row // 2 - 2) is not None                     # rows under GROUP_LONG_ROW_MIN stay short
    assert short(2, min_row // 2 + 2) is None
    assert _short_rows_plan(4096, 1, block, 1, backward=True).rows * block == fn.LOOP_TILE_ELEMENTS

    B, C, H, W, G = 1024, 64, 8, 8, 32   # 32K rows of 2 channels of 64: 32 rows a forward tile
    x = torch.empty(B, C, H, W, device="meta", dtype=torch.bfloat16)
    w = torch.empty(C, device="meta", dtype=torch.bfloat16)
    with recording() as rec:
        _, stats = fn.group_norm_forward(x, G, w, w)
    assert [(lc.name, lc.grid[0]) for lc in rec.launches] == [("_group_rows_fwd_kernel", B * G // 32)]
    for trained in (False, True):
        with recording() as rec:
            fn.group_norm_backward(x, x, G, w, w, stats, compute_dw=trained, compute_db=trained)
        names = [lc.name for lc in rec.launches]
        assert names == ["_group_rows_bwd_kernel"] + ["_sum_partials_kernel"] * trained, names
        scratch = [a for a in rec.allocations if a[1] == torch.float32]
        assert scratch == ([((B, C), torch.float32, B * C * 4)] * 2 if trained else []), rec.allocations


def test_group_norm_backward_low_level():
    """The low-level backward, as the row norms': db takes bias's shape and
    dtype (here fp32 beside bf16 x and w), and a gradient not asked for, or
    without its parameter, is None."""
    x, dy = randn(2, 6, 5, 7, dtype=torch.bfloat16, shift=1.0), randn(2, 6, 5, 7, dtype=torch.bfloat16, shift=0.1)
    w, b = randn(6, dtype=torch.bfloat16, shift=1.0), randn(6)
    _, stats = fn.group_norm_forward(x, 3, w, b)
    dx, dw, db = fn.group_norm_backward(dy, x, 3, w, b, stats)
    x64, w64, b64 = (t.detach().double().cpu().requires_grad_() for t in (x, w, b))
    fn.group_norm_reference(x64, 3, w64, b64).backward(dy.double().cpu())
    assert db.dtype == torch.float32 and dw.dtype == dx.dtype == torch.bfloat16
    for out, ref in ((dx, x64.grad), (dw, w64.grad), (db, b64.grad)):
        assert rel_error(out, ref) < 2 * TOLERANCE[torch.bfloat16]
    dx2, dw2, db2 = fn.group_norm_backward(dy, x, 3, w, None, stats)
    assert db2 is None and torch.equal(dx2, dx) and torch.equal(dw2, dw)
    assert fn.group_norm_backward(dy, x, 3, None, b, stats, compute_dx=False)[:2] == (None, None)


def test_group_norm_split_statistics_plan():
    """With fewer (sample, group) rows than SMs, each row is split over
    programs by channels. Equal splits of more than ROW_BLOCK_MAX elements take
    their statistics from the long-row forward's pass 1 (APPLY off), the rest
    from GroupNorm's own kernel; GroupNorm's kernel then merges and writes y
    (real limits, H200's SM count, meta tensors)."""
    from bench_frozen_norm import recording

    def launches(C, HW):
        x = torch.empty(1, C, HW, device="meta", dtype=torch.bfloat16)
        with recording() as rec:
            fn.group_norm_forward(x, 32, x[0, :, 0], x[0, :, 0])
        return [(lc.name, lc.constexprs.get("APPLY"), lc.constexprs.get("SPLITS"), lc.constexprs.get("DO_STATS"))
                for lc in rec.launches]
    assert launches(512, 256 * 256) == [("_long_row_norm_fwd_kernel", False, 8, None),
                                        ("_group_norm_fwd_kernel", None, None, False)]
    own = [("_group_norm_fwd_kernel", None, None, True), ("_group_norm_fwd_kernel", None, None, False)]
    assert launches(416, 256 * 256) == own   # 13 channels in splits of 2: the last one shorter
    assert launches(512, 32 * 32) == own     # splits of 2 x 1024 elements


@pytest.mark.parametrize("shape, shift", [((1, 4, 30, 50), 1000.0), ((1, 6, 9, 9), 0.0), ((2, 6, 9, 9), 0.0),
                                          ((1, 7, 10, 10), 0.0)],
                         ids=["4-splits-large-mean", "odd-HW", "2-rows", "unequal-splits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_group_norm_split_statistics(shape, shift, dtype, monkeypatch):
    """(sample, group) rows split over programs (3 SMs in the interpreter; up to
    30 rows are "few" here), segments longer than ROW_BLOCK_MAX (patched to
    64): the long-row pass 1 for equal splits, GroupNorm's own for unequal
    ones (the last). The samples differ in scale, so that statistics stored
    for the wrong row show."""
    monkeypatch.setattr(fn, "ROW_BLOCK_MAX", 64)
    monkeypatch.setattr(fn, "GROUP_LONG_ROWS_PER_SM", 10)
    monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 0)
    assert not _takes_long_rows(shape, 1)
    t = fn._group_tiling(shape[0], shape[1], shape[2] * shape[3], 1, 4, torch.device(DEVICE))
    assert t.splits > 1 and t.channels_per_split * shape[2] * shape[3] > 64
    scale = torch.arange(1, shape[0] + 1, device=DEVICE).reshape(-1, 1, 1, 1) ** 2
    x = (randn(*shape, scale=1.0, shift=shift) * scale).to(dtype).requires_grad_()
    w, b = randn(shape[1], shift=1.0, dtype=dtype), randn(shape[1], dtype=dtype)
    y = fn.group_norm(x, 1, w, b)
    ref = fn.group_norm_reference(x.detach().double().cpu(), 1, w.double().cpu(), b.double().cpu())
    assert rel_error(y, ref) < max(1e-3 if shift else 0.0, TOLERANCE[dtype])
    check_op(OPS["gn"], shape, dtype, ALL_TRAIN["gn"], {"x": True}, 1)


def _group_split_case(shape, dtype, shift, plan_of):
    """GroupNorm of one group (a row per sample) on random inputs of `shape`:
    hands its plan to `plan_of(tiling, runs)` for the caller to check, and
    returns run(), which gives y, the trained dx, dw, db and the frozen dx,
    and the float64 reference of each."""
    B, C, HW = shape[0], shape[1], shape[2] * shape[3]
    t = fn._group_tiling(B, C, HW, 1, 4, torch.device(DEVICE))
    plan_of(t, fn._group_runs(B * t.splits, t.channels_per_split, HW, t.block_c, t.block_hw,
                               torch.device(DEVICE)))
    x = randn(*shape, shift=shift, dtype=dtype).requires_grad_()
    w, b = randn(C, shift=1.0, dtype=dtype).requires_grad_(), randn(C, dtype=dtype).requires_grad_()
    dy = randn(*shape, dtype=dtype)

    def run():
        out = [fn.group_norm(x, 1, w, b)]
        out += torch.autograd.grad(out[0], (x, w, b), dy)
        return out + list(torch.autograd.grad(fn.group_norm(x, 1, w.detach(), b.detach()), x, dy))
    x64, w64, b64 = (v.detach().double().cpu().requires_grad_() for v in (x, w, b))
    ref = fn.group_norm_reference(x64, 1, w64, b64)
    ref.backward(dy.double().cpu())
    return run, (ref, x64.grad, w64.grad, b64.grad, x64.grad)


def test_group_norm_split_runs_plan():
    """Where whole channels leave fewer splits than GROUP_PROGRAMS_PER_SM per
    SM, the statistics launch takes pieces of the splits (a power of two of
    them, at most that many programs), the launch that writes y (forward)
    or dx (backward) runs of their tiles (the nearest whole number to that
    many), and the backward's sums launch as many runs as pieces, with w or
    b trained where a split is one channel (H200's 132 SMs: 264 programs;
    meta tensors)."""
    from bench_frozen_norm import recording

    def grids(C, HW, trained=False):
        x = torch.empty(1, C, HW, device="meta", dtype=torch.bfloat16)
        w = x[0, :, 0]
        with recording() as rec:
            _, stats = fn.group_norm_forward(x, 32, w, w)
            fn.group_norm_backward(x, x, 32, w, w, stats, compute_dw=trained, compute_db=trained)
        return [(lc.name[1:-7], lc.grid[0]) for lc in rec.launches if lc.name != "_sum_partials_kernel"]
    # 4 channels a group: 4 splits of 32 rows, 128 programs; 2 pieces and 2 runs each.
    assert grids(128, 512 * 512) == [("long_row_norm_fwd", 256), ("group_norm_fwd", 256),
                                     ("group_norm_bwd", 256), ("group_norm_bwd", 256)]
    # 3 channels: 96 splits, 2 pieces and 3 runs each (264 / 96 = 2.75).
    assert [g for _, g in grids(96, 512 * 512)] == [192, 288, 192, 288]
    # One channel: one split a row, 32 programs; 8 pieces and 8 runs, w and b
    # trained too (each run's A and D a row of their own: 8 rows of dw and db).
    assert [g for _, g in grids(32, 512 * 512)] == [256, 256, 256, 256]
    assert [g for _, g in grids(32, 512 * 512, trained=True)] == [256, 256, 256, 256]
    x = torch.empty(1, 32, 512 * 512, device="meta", dtype=torch.bfloat16)
    with recording():
        _, stats = fn.group_norm_forward(x, 32, x[0, :, 0], x[0, :, 0])
    with recording() as rec:
        fn.group_norm_backward(x, x, 32, x[0, :, 0], x[0, :, 0], stats)
    assert [lc.name for lc in rec.launches] == ["_group_norm_bwd_kernel", "_group_norm_bwd_kernel",
                                                "_sum_partials_kernel"]
    assert rec.allocations.count(((8, 32), torch.float32, 8 * 32 * 4)) == 2, rec.allocations
    # 16 channels: 8 splits of 2, 256 programs, whole; 20 channels: 7 unequal splits of 3, 224, whole.
    assert [g for _, g in grids(512, 256 * 256)] == [256, 256, 256, 256]
    assert grids(640, 128 * 128) == [("group_norm_fwd", 224), ("group_norm_fwd", 224),
                                     ("group_norm_bwd", 224), ("group_norm_bwd", 224)]


@pytest.mark.parametrize("shape, long_stats", [((1, 4, 30, 50), False), ((1, 2, 25, 41), False),
                                               ((1, 2, 25, 41), True)],
                         ids=["2-runs", "3-uneven-runs", "3-runs-long-row-stats"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_group_norm_split_runs(shape, long_stats, dtype, monkeypatch):
    """The runs of `_group_runs` (3 SMs, 6 programs wanted; tiles of 256
    elements): 4 splits in 2 runs of 3 tiles, or 2 splits in 3 runs of 1, 2
    and 2 tiles (their statistics by GroupNorm's kernel, or by the long-row
    pass 1). y and every gradient bitwise equal to whole splits', trained and
    frozen, and near float64."""
    monkeypatch.setattr(fn, "_num_sms", lambda device: 3)
    monkeypatch.setattr(fn, "GROUP_TILE_ELEMENTS", 256)
    if long_stats:
        monkeypatch.setattr(fn, "ROW_BLOCK_MAX", 64)
    def plan_of(t, runs):
        assert (t.splits, runs) == ((4, 2) if shape[1] == 4 else (2, 3))
    run, refs = _group_split_case(shape, dtype, 0.5, plan_of)
    runs = run()
    monkeypatch.setattr(fn, "_group_runs", lambda *args: 1)
    for got, whole in zip(runs, run()):
        assert torch.equal(got, whole)
    for got, want in zip(runs, refs):
        assert rel_error(got, want) < 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("shape, plan", [((1, 1, 16, 32), (1, 4, 2)), ((1, 2, 24, 32), (2, 2, 3)),
                                         ((2, 1, 16, 32), (1, 2, 2))],
                         ids=["one-channel", "two-channels", "two-samples"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shift", [0.0, 1000.0], ids=["centred", "large-mean"])
def test_group_norm_split_pieces(shape, plan, dtype, shift, monkeypatch):
    """Groups of one or two channels and one or two rows (3 SMs in the
    interpreter, segments longer than ROW_BLOCK_MAX, patched to 64): the
    statistics in pieces of the splits (S splits, p pieces, r runs of tiles
    of 256 for y and dx; the pieces and runs do not line up), the
    backward's sums in p runs, frozen and trained (splits of one channel:
    each run's A and D a row of dw and db sums). Forward and both backwards
    near float64, with a mean far from zero too (the pieces' moments merge
    as the splits' do)."""
    monkeypatch.setattr(fn, "_num_sms", lambda device: 3)
    monkeypatch.setattr(fn, "ROW_BLOCK_MAX", 64)
    monkeypatch.setattr(fn, "GROUP_LONG_ROWS_PER_SM", 10)
    monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 0)
    monkeypatch.setattr(fn, "GROUP_TILE_ELEMENTS", 256)
    assert not _takes_long_rows(shape, 1) and not _takes_short_rows(shape, 1)

    def plan_of(t, runs):
        assert (t.splits, t.pieces, runs) == plan
    run, refs = _group_split_case(shape, dtype, shift, plan_of)
    tolerance = max(1e-3 if shift else 0.0, 2 * TOLERANCE[dtype])
    for got, want in zip(run(), refs):
        assert rel_error(got, want) < tolerance


def test_group_norm_backward_checks_stats(monkeypatch):
    """The low-level backward takes the statistics of group_norm_forward for
    the same x: a tensor of another shape, dtype or device, or one planned for
    another SM count (other splits), is refused before any launch."""
    from bench_frozen_norm import recording
    x = randn(1, 4, 9, 9)
    _group_own_kernels(monkeypatch)
    monkeypatch.setattr(fn, "_num_sms", lambda device: 3)   # 2 rows, 3 SMs: 2 splits of 2 channels
    _, split_stats = fn.group_norm_forward(x, 2)
    monkeypatch.setattr(fn, "_num_sms", lambda device: 1)   # 2 rows, 1 SM: whole rows
    _, stats = fn.group_norm_forward(x, 2)
    assert (split_stats.shape, stats.shape) == ((2, 2 + 2 * 2), (2, 2 + 2))
    for bad in (stats[:, :2], split_stats, stats.double(), stats.to("meta")):
        with recording(num_sms=1) as rec, pytest.raises(ValueError, match=r"stats: expected the \(2, 4\) fp32"):
            fn.group_norm_backward(x, x, 2, None, None, bad)
        assert rec.launches == []
    with recording(num_sms=1) as rec:
        fn.group_norm_backward(x, x, 2, None, None, stats)
    assert [launch.name for launch in rec.launches] == ["_group_norm_bwd_kernel"]


def test_group_norm_long_rows_allocations(monkeypatch):
    """Through the long-row backward: with w and b frozen nothing but dx; with
    both trained, dx, dw, db and one (B, C) fp32 scratch for each."""
    _group_long_rows_from(64, monkeypatch)
    shape, groups = (3, 6, 8, 8), 3
    assert _takes_long_rows(shape, groups)
    monkeypatch.setattr(fn, "_group_norm_bwd_kernel", None)   # GroupNorm's own backward would fail
    rec, grad_bytes = backward_allocations(OPS["gn"], shape, groups, ALL_FROZEN["gn"], {"x": True})
    assert rec.allocated_bytes == grad_bytes, rec.allocations
    rec, grad_bytes = backward_allocations(OPS["gn"], shape, groups, ALL_TRAIN["gn"], {"x": True})
    assert rec.allocated_bytes == grad_bytes + 2 * shape[0] * shape[1] * 4, rec.allocations


# Every kernel family, with lengths whose masks are not all true: the tiles
# (37 rows of 100 in tiles of 128 columns), the long rows (203: chunks of 32,
# the last with 11 columns, PolyNorm's in a tail chunk of 16; with pre-sums
# where a forward takes them, 200), GroupNorm's own kernels, its split
# statistics, its long rows (3 channels a group: blocks of 4) and its short
# rows (2 channels of 35 positions: [2, 64] blocks, 6 rows in a tile of 8).
# (op, path, shape, groups); `_take_path` sets the limits.
KERNEL_PATHS = [(name, "tile", (37, 100), None) for name in OPS if name != "gn"]
KERNEL_PATHS += [(name, "long", (13, 203), None) for name in OPS if name != "gn"]
KERNEL_PATHS += [("ln", "presum", (13, 200), None), ("poly", "presum", (13, 200), None)]
KERNEL_PATHS += [("gn", "tile", (2, 6, 5, 7), 2), ("gn", "split", (1, 6, 9), 2), ("gn", "long", (3, 6, 8, 8), 2),
                 ("gn", "short", (2, 6, 5, 7), 3)]


def _take_path(name, path, monkeypatch):
    """The limits under which op `name` takes `path` of KERNEL_PATHS."""
    if path in ("long", "presum"):
        (_group_long_rows_from if name == "gn" else _long_rows_from)(64, monkeypatch)
    if name == "gn" and path in ("tile", "split"):   # GroupNorm's own kernels: a tile, or split rows
        monkeypatch.setattr(fn, "GROUP_SHORT_ROW_MAX", 0)
    if path == "presum":
        monkeypatch.setattr(fn, "LONG_FWD_PRESUM_AFTER", 64)


# ----------------------------------------------------------------------------
# Frozen means free: what the backward allocates
# ----------------------------------------------------------------------------

def recorded_backward(op, shape, groups, params, inputs, run_forward=True, **recording_kw):
    """The launches and allocations (a `bench_frozen_norm.Recording`, made
    with `recording_kw`) of one backward through the outputs of `op` that
    require grad, on fresh fp32 inputs, and the gradients it returns; (None,
    None) where no output requires grad. The forward runs, or with
    `run_forward=False` only records its launches (on the SMs of
    `recording_kw`): its outputs then hold no values, which a backward that
    is only recorded never reads."""
    from bench_frozen_norm import H200_SMS, Recording, recording
    d = prepare(op, shape, torch.float32, params, inputs, groups)
    if run_forward:
        outs = op.run(d)
    else:
        with recording(recording_kw.get("num_sms", H200_SMS)):
            outs = op.run(d)
    outs = [o for o in as_tuple(outs) if o.requires_grad]
    if not outs:
        return None, None
    dys = grad_outputs(outs)
    wanted = [v for v in d.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    with recording(**recording_kw) as rec:
        grads = torch.autograd.grad(outs, wanted, dys)
    assert isinstance(rec, Recording)
    return rec, grads


def backward_allocations(op, shape, groups, params, inputs):
    """Bytes of every tensor created during the backward, and the bytes of the gradients it returns."""
    rec, grads = recorded_backward(op, shape, groups, params, inputs, launch=True)
    returned = {g.data_ptr(): g.numel() * g.element_size() for g in grads}   # dx = dr counts once
    return rec, sum(returned.values())


def _alloc_cases():
    for name in OPS:
        shape, groups = small_case(name)
        yield pytest.param(name, shape, groups, id=name)
    yield pytest.param("poly-long-rows", (37, 100), None, id="poly-long-rows")


@pytest.mark.parametrize("name, shape, groups", list(_alloc_cases()))
def test_frozen_backward_allocates_only_input_grads(name, shape, groups, monkeypatch):
    long_rows = name == "poly-long-rows"   # (M, 4) partials, one row per program
    if long_rows:
        name = "poly"
        _long_rows_from(64, monkeypatch)
    op = OPS[name]
    rec, grad_bytes = backward_allocations(op, shape, groups, ALL_FROZEN[name], _with_grads(name))
    assert rec.allocated_bytes == grad_bytes, rec.allocations
    # And the trainable backward does allocate scratch besides its gradients, so
    # this test would fail if the frozen one did too.
    rec, grad_bytes = backward_allocations(op, shape, groups, ALL_TRAIN[name], _with_grads(name))
    scratch = rec.allocated_bytes - grad_bytes
    min_scratch = {"gn": 2 * shape[0] * shape[1] * 4, "poly": (shape[0] if long_rows else 1) * 4 * 4}.get(
        name, shape[-1] * 4)
    assert scratch >= min_scratch, rec.allocations


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
def test_frozen_skewed_backward_allocations(name):
    """The one exception to the above, bounded: the frozen backward of rows
    no 16-byte vector fits (odd, fp32 here: SKEW 4) allocates, besides the
    gradients it returns, SKEW copies of w (`_skewed_copies`), which let it
    load w, x and dy in vectors; nothing else, and nothing where w is absent."""
    N, skew = 8195, 4
    L = fn._skewed_copy_length(N, skew)
    rec, grad_bytes = backward_allocations(OPS[name], (9, N), None, ALL_FROZEN[name], _with_grads(name))
    assert rec.allocated_bytes == grad_bytes + skew * L * 4, rec.allocations
    absent = {p: ABSENT for p in ALL_TRAIN[name]}
    rec, grad_bytes = backward_allocations(OPS[name], (9, N), None, absent, _with_grads(name))
    assert rec.allocated_bytes == grad_bytes, rec.allocations


@pytest.mark.parametrize("name, path, shape, groups", [pytest.param(*p, id=f"{p[0]}-{p[1]}") for p in KERNEL_PATHS])
def test_backward_flags_follow_needs_input_grad(name, path, shape, groups, monkeypatch):
    """Under every freeze pattern, on every kernel path: no backward launch
    has a COMPUTE_DX, COMPUTE_DW or COMPUTE_DB flag on whose gradient autograd
    did not ask for (dx: of x or, FusedAdd, of the residual), and each that it
    asked for is on in some launch (dx: or the long-row backward launched,
    which has no COMPUTE_DX: its wrappers launch it only for dx). Forward
    and backward record their launches; no kernel runs."""
    _take_path(name, path, monkeypatch)
    op = OPS[name]
    for params, inputs in freeze_patterns(op):
        rec, _ = recorded_backward(op, shape, groups, params, inputs, run_forward=False,
                                   num_sms=fn._num_sms(torch.device(DEVICE)))
        if rec is None:   # nothing requires grad: no backward
            continue
        asked = {"COMPUTE_DX": any(inputs.values()), "COMPUTE_DW": params["weight"] == TRAIN,
                 "COMPUTE_DB": params.get("bias") == TRAIN}
        for flag, wanted in asked.items():
            on = [launch.name for launch in rec.launches if launch.constexprs.get(flag, False)
                  or (flag == "COMPUTE_DX" and launch.name == "_long_row_norm_bwd_kernel")]
            assert bool(on) == wanted, (pattern_id(params, inputs), flag, on)


# A backward kernel that leaves one row of dw/db sums writes the gradients
# themselves (`_sum_targets`): no scratch, no reduction launch. On an H200 (132
# SMs): the long-row dw/db kernel on rows past 8384 (its 64-column blocks fill
# the SMs alone, so one slice walks all rows; but odd rows, read by classes of
# rows, a partial row each), the tile kernel with one tile, GroupNorm with one
# sample (its own kernels and the long-row ones).
ONE_ROW_OF_SUMS = [
    ("rms", (2048, 32768), True), ("ln", (1024, 32768), True), ("ln", (2048, 8384), False),
    ("ln", (2048, 8385), False),
    ("rms", (2, 100), True), ("rms", (2048, 4096), False),
    ("gn", (1, 512, 256, 256, 32), True), ("gn", (1, 64, 8, 8, 4), True), ("gn", (2, 64, 8, 8, 4), False),
]


@pytest.mark.parametrize("name, size, one_row", ONE_ROW_OF_SUMS, ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else None)
def test_one_row_of_sums_is_the_gradient(name, size, one_row):
    """A trained backward at H200 sizes (launches recorded, not run): where
    its kernel leaves one row of sums it allocates nothing but the gradients
    (and, for odd bf16 rows, the dx kernel's 8 copies of w: `_skewed_copies`)
    and launches no reduction; elsewhere it does both."""
    from bench_frozen_norm import VARIANTS, _grad_bytes, record_backward
    want = VARIANTS[name]["trainable"]
    rec = record_backward(name, size, want)
    names = [lc.name for lc in rec.launches]
    N = size[-1]
    copies = 8 * fn._skewed_copy_length(N, 8) * 2 if name != "gn" and N % 2 else 0
    scratch = rec.allocated_bytes - _grad_bytes(name, size, want) - copies
    if one_row:
        assert scratch == 0 and "_sum_partials_kernel" not in names, (names, rec.allocations)
    else:
        assert scratch > 0 and names[-1] == "_sum_partials_kernel", (names, rec.allocations)


@pytest.mark.parametrize("name", ["rms", "ln"])
@pytest.mark.parametrize("block_m", [128, 8], ids=["one-slice", "slices"])
def test_long_row_dw_slices(name, block_m, monkeypatch):
    """The long-row dw/db kernel run on 37 rows of 100 (3 interpreter SMs): in
    one slice (DW_BLOCK_M = 128) it stores dw and db themselves; in slices of
    8-row steps (DW_BLOCK_M = 8: two slices of 24 and 13 rows) it fills (2, N)
    partials that `_sum_partials_kernel` sums. Against float64 with dx (fp32)
    and without (bf16: dw, db stored in bf16 by the kernel or the reduction)."""
    from bench_frozen_norm import VARIANTS, record_backward
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "DW_BLOCK_M", block_m)
    rec = record_backward(name, (37, 100), VARIANTS[name]["trainable"], torch.float32, fn.INTERPRETER_SMS)
    reduction = ["_sum_partials_kernel"] if block_m == 8 else []
    assert [lc.name for lc in rec.launches] == ["_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"] + reduction
    assert rec.launches[1].grid == (2, 2 if block_m == 8 else 1)
    check_op(OPS[name], (37, 100), torch.float32, ALL_TRAIN[name], {"x": True})
    check_op(OPS[name], (37, 100), torch.bfloat16, ALL_TRAIN[name], {"x": False})


def _beside_patterns():
    """The freeze patterns in which the long-row dw/db kernel can run beside the
    dx kernel: dx and at least one parameter's gradient asked for."""
    for name in ["rms", "fadd", "ln"]:
        for params, inputs in freeze_patterns(OPS[name]):
            if TRAIN in params.values() and inputs["x"]:
                yield pytest.param(name, params, inputs, id=f"{name}-{pattern_id(params, inputs)}")


@pytest.mark.parametrize("name, params, inputs", list(_beside_patterns()))
def test_long_row_dw_beside(name, params, inputs, monkeypatch):
    """The dw/db kernel beside the dx kernel (`_run_beside`, here in every call:
    DW_BESIDE_EAGER), on 11 rows of 100 (3 interpreter SMs): one launch after
    the dx kernel's, first row first, in slabs of 64 columns (2 programs for
    half the SMs), 16 warps per accumulator, storing dw and db themselves (no
    scratch); without it, the dw/db kernel walks the rows last first. Against
    float64 in fp32, and the same bits twice in bf16."""
    from bench_frozen_norm import _grad_bytes, record_backward
    _long_rows_from(64, monkeypatch)
    want = {"dx": True, "dw": params["weight"] == TRAIN}
    if name == "ln":
        want["db"] = params["bias"] == TRAIN
    for beside in [False, True]:
        monkeypatch.setattr(fn, "DW_BESIDE_EAGER", beside)
        rec = record_backward(name, (11, 100), want, torch.float32, fn.INTERPRETER_SMS)
        dwdb = rec.launches[-1]
        assert [lc.name for lc in rec.launches] == ["_long_row_norm_bwd_kernel", "_row_norm_dwdb_kernel"]
        assert dwdb.constexprs["LAST_FIRST"] is not beside
        if beside:
            assert dwdb.grid == (2, 1) and dwdb.constexprs["BLOCK_N"] == 64, dwdb
            assert dwdb.num_warps == fn.DW_BESIDE_WARPS * (want["dw"] + want.get("db", False))
            assert dwdb.maxnreg == fn.DW_BESIDE_MAX_REGISTERS
            assert rec.allocated_bytes == _grad_bytes(name, (11, 100), want, 4), rec.allocations
    check_op(OPS[name], (11, 100), torch.float32, params, inputs)
    op = OPS[name]
    torch.manual_seed(1)
    d = prepare(op, (11, 100), torch.bfloat16, params, inputs)
    _assert_same_bits_twice(op, d)


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_skewed_dwdb(name, dtype, monkeypatch):
    """The dw/db kernel of trained odd rows past the tile (`_long_rows_from`
    64: rows of 127, whose lanes cross a column block of 64 where the row
    does not) reads them skewed, each program the rows of one class
    of its slice (its SKEW): recorded on meta tensors, SKEW programs per
    slice and column block, the column blocks covering N + SKEW - 1 lanes.
    Never beside the dx kernel: with DW_BESIDE_EAGER (whose one launch
    would leave no partials to reduce) the same launches and allocations.
    Then 37 rows in slices of 4 rows a class (of 8 classes, 2 slices or 1;
    of 4, 3; the last partial), against float64 element by element for
    every pattern that trains a parameter and leaves none absent (the dw/db
    kernel reads no w or b: to it an absent parameter is a frozen one; in
    fp32, whose launches differ in SKEW alone, all trained alone): a column
    off by its skew, or a class's row summed twice or not at all, would
    show."""
    from bench_frozen_norm import record_backward
    _long_rows_from(64, monkeypatch)
    monkeypatch.setattr(fn, "DW_BLOCK_M", 4)
    monkeypatch.setattr(fn, "_num_sms", lambda device: 1000)
    skew, (M, N) = 16 // dtype.itemsize, (37, 127)
    want = {"dx": True, "dw": True, **({"db": True} if name == "ln" else {})}
    recordings = []
    for beside in (False, True):
        monkeypatch.setattr(fn, "DW_BESIDE_EAGER", beside)
        recordings.append(record_backward(name, (M, N), want, dtype, 1000))
    eager, beside = recordings
    assert (_launch_key(eager), eager.allocated_bytes) == (_launch_key(beside), beside.allocated_bytes)
    dwdb, = [lc for lc in eager.launches if lc.name == "_row_norm_dwdb_kernel"]
    assert dwdb.constexprs["SKEW"] == skew and dwdb.constexprs["LAST_FIRST"]   # after the dx kernel
    assert dwdb.grid[1] == skew * -(-M // (4 * skew))   # slices of 4 rows a class
    assert dwdb.grid[0] * dwdb.constexprs["BLOCK_N"] >= N + skew - 1
    op = OPS[name]
    for params, inputs in freeze_patterns(op):
        if (TRAIN in params.values() and ABSENT not in params.values() and all(inputs.values())
                and (dtype == torch.bfloat16 or params == ALL_TRAIN[name])):
            check_op(op, (M, N), dtype, params, inputs, elementwise=True)


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
def test_dwdb_flatter_tiles(name):
    """The dw/db kernel after the dx kernel starts from DW_BLOCK_M x
    DW_BLOCK_N tiles and makes them flatter while its column blocks would
    not fit one wave of DW_WAVE_PROGRAMS_PER_SM programs per SM, or while a
    program would walk fewer than DW_FLAT_ROW_STEPS steps of rows and the
    column blocks still give each SM a program, down to DW_MIN_BLOCK_M rows.
    On an H200's 132 SMs: 2048 x 20480 keeps 64 x 64 (320 blocks), 2048 x
    32768 takes 32 x 128 (256), 1024 x 65536 16 x 256 (256), 512 x 131072
    8 x 512 (256), 256 x 262144 4 x 1024 (the floor); 37 rows of 8300 on 60
    SMs 32 x 128 (few rows; 65 blocks of 128), on 80 SMs 64 x 64 (65 would
    leave SMs idle). On 37 rows of 9001 in the interpreter (4 x 1024 on 3
    SMs), against float64. Rows of COLUMNS_DX_ROW_BYTES and more take these
    tiles too, with COMPUTE_DX (dx written in them)."""
    from bench_frozen_norm import record_backward
    want = {"dx": True, "dw": True, **({"db": True} if name == "ln" else {})}
    cases = [((2048, 20480), 132, (64, 64)), ((2048, 32768), 132, (32, 128)), ((1024, 65536), 132, (16, 256)),
             ((512, 131072), 132, (8, 512)), ((256, 262144), 132, (4, 1024)),
             ((37, 8300), 60, (32, 128)), ((37, 8300), 80, (64, 64)), ((37, 9001), fn.INTERPRETER_SMS, (4, 1024))]
    for (M, N), sms, tile in cases:
        dwdb, = [lc for lc in record_backward(name, (M, N), want, num_sms=sms).launches
                 if lc.name == "_row_norm_dwdb_kernel"]
        assert dwdb.constexprs["COMPUTE_DX"] == (N * 2 >= fn.COLUMNS_DX_ROW_BYTES), ((M, N), dwdb.constexprs)
        assert (dwdb.constexprs["BLOCK_M"], dwdb.constexprs["BLOCK_N"]) == tile, ((M, N), sms, dwdb)
        lanes = N + max(1, dwdb.constexprs["SKEW"]) - 1   # odd rows (9001): the SKEW - 1 lanes before a row too
        assert dwdb.grid[0] == -(-lanes // tile[1]) and dwdb.num_warps == fn.DW_WARPS
    check_op(OPS[name], (37, 9001), torch.float32, ALL_TRAIN[name], _with_grads(name))


@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
def test_backward_grid(name):
    """1031 rows of 33: 33 tiles of 32 rows (LOOP_TILE_ELEMENTS = 2048, of 64
    columns). A trained backward deals them to a persistent grid (3
    interpreter SMs, 4 programs of 4 warps each: 12 programs, 3 tiles each,
    through the pipeline), which accumulates dw; a frozen one runs one
    program per tile (LayerNorm's, whose rows fill half their tile: 65 tiles
    of 16 rows on one warp, PADDED_WARP_ROW_MAX). Both against float64."""
    from bench_frozen_norm import VARIANTS, record_backward
    assert fn._row_tiling(1031, 33, backward=True) == (32, 64, True, 4, 33)
    assert fn._row_tiling(1031, 33, backward=True, padded_tile=True) == (16, 64, True, 1, 65)
    frozen = VARIANTS[name]["all frozen" if name == "ln" else "frozen w"]
    frozen_grid = (65,) if name == "ln" else (33,)
    for want, grid, tiles in ((frozen, frozen_grid, 1), (VARIANTS[name]["trainable"], (12,), 3)):
        launch = record_backward(name, (1031, 33), want, torch.float32, fn.INTERPRETER_SMS).launches[0]
        assert launch.name == "_row_norm_bwd_kernel" and launch.grid == grid and launch.args[-1] == tiles
    for params in (ALL_TRAIN[name], ALL_FROZEN[name]):
        check_op(OPS[name], (1031, 33), torch.float32, params, _with_grads(name))
        check_op(OPS[name], (1031, 33), torch.bfloat16, params, _with_grads(name))


def _outputs_and_grads(op, d, dys=None):
    """One forward and backward of `op` on inputs `d`: its outputs, then the
    gradients of every input that requires one, for the gradients `dys` of
    the outputs that require one (by default drawn from a fixed seed, on the
    outputs' device)."""
    wanted = [v for v in d.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    outs = as_tuple(op.run(d))
    used = [o for o in outs if o.requires_grad]
    if dys is None:
        torch.manual_seed(2)
        dys = [dy.to(o.device) for dy, o in zip(grad_outputs(used), used)]
    return list(outs) + list(torch.autograd.grad(used, wanted, dys))


def _assert_same_bits(first, second):
    """Two runs' outputs and gradients (`_outputs_and_grads`) are bitwise the same."""
    assert len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def _assert_same_bits_twice(op, d):
    """Two runs of `_outputs_and_grads` give bitwise the same tensors."""
    _assert_same_bits(_outputs_and_grads(op, d), _outputs_and_grads(op, d))


def _check_twice(name, shape, dtype, params, along_y=False):
    """`check_op` of op `name` against float64, every input with a gradient,
    then bitwise the same outputs and gradients on a second run."""
    check_op(OPS[name], shape, dtype, params, _with_grads(name), along_y=along_y, twice=True)


@pytest.mark.parametrize("name", list(OPS) + ["gn-long-rows", "gn-own", "poly-long-rows"])
def test_deterministic(name, monkeypatch):
    """The same inputs give bitwise-identical outputs and gradients, run after
    run (GroupNorm on its short-row kernels, and also through the long-row
    kernels, per-channel sums and all, and its own; PolyNorm also with rows
    past POLY_ROW_BLOCK_MAX, whose (37, 4) scratch folds in bands of
    PARTIAL_FOLD_ROWS = 8)."""
    shape, groups = ((2, 6, 5, 7), 3) if name.startswith("gn") else ((300, 100), None)
    if name == "gn":
        assert _takes_short_rows(shape, groups)
    if name == "gn-own":
        name = "gn"
        _group_own_kernels(monkeypatch)
    if name == "gn-long-rows":
        name, shape, groups = "gn", (3, 6, 8, 8), 3
        _group_long_rows_from(64, monkeypatch)
        assert _takes_long_rows(shape, groups)
    if name == "poly-long-rows":
        name, shape = "poly", (37, 100)
        _long_rows_from(64, monkeypatch)
        monkeypatch.setattr(fn, "PARTIAL_FOLD_ROWS", 8)
    op = OPS[name]
    torch.manual_seed(1)
    d = prepare(op, shape, torch.bfloat16, ALL_TRAIN[name], _with_grads(name), groups)
    _assert_same_bits_twice(op, d)


# ----------------------------------------------------------------------------
# Bad input: a clear error before any kernel launches
# ----------------------------------------------------------------------------

def _x(*shape, dtype=torch.float32):
    return randn(*shape, dtype=dtype)


BAD_INPUTS = [
    ("weight shape", lambda: fn.rms_norm(_x(4, 8), (8,), _x(7)), ValueError, "weight must have shape"),
    ("weight dtype", lambda: fn.layer_norm(_x(4, 8), (8,), torch.ones(8, dtype=torch.int32, device=DEVICE)),
     TypeError, "weight must be float32"),
    ("bias shape", lambda: fn.layer_norm(_x(4, 8), (8,), _x(8), _x(8, 1)), ValueError, "bias must have shape"),
    ("weight device", lambda: fn.rms_norm(_x(4, 8), (8,), torch.ones(8, device="meta")), ValueError,
     "weight is on meta"),
    ("int x", lambda: fn.rms_norm(torch.ones(4, 8, dtype=torch.int64, device=DEVICE), (8,)), TypeError,
     "x must be float32"),
    ("float64 x", lambda: fn.layer_norm(_x(4, 8).double(), (8,)), TypeError, "float64 is not supported"),
    ("not a tensor", lambda: fn.rms_norm([[1.0, 2.0]], (2,)), TypeError, "x must be a torch.Tensor"),
    ("normalized_shape", lambda: fn.layer_norm(_x(4, 8), (4,)), ValueError, "normalized_shape"),
    ("normalized_shape empty", lambda: fn.rms_norm(_x(4, 8), ()), ValueError, "normalized_shape"),
    ("normalized_shape tensor", lambda: fn.layer_norm(_x(4, 8), _x(8)), TypeError,
     "normalized_shape must be an int or a sequence of ints, got Tensor$"),
    ("normalized_shape float", lambda: fn.rms_norm(_x(4, 8), 8.0), TypeError, "ints, got float$"),
    ("normalized_shape floats", lambda: fn.rms_norm(_x(4, 8), [4, 8.0]), TypeError, "ints, got list of float$"),
    ("normalized_shape bool", lambda: fn.layer_norm(_x(4, 1), (True,)), TypeError, "ints, got tuple of bool$"),
    ("groups", lambda: fn.group_norm(_x(2, 6, 3), 4), ValueError, "num_groups must be a positive int dividing"),
    ("groups zero", lambda: fn.group_norm(_x(2, 6, 3), 0), ValueError, "num_groups"),
    ("group dims", lambda: fn.group_norm(_x(6), 3), ValueError, "at least 2 dims"),
    ("group weight", lambda: fn.group_norm(_x(2, 6, 3), 3, _x(3)), ValueError, "weight must have shape"),
    ("residual shape", lambda: fn.fused_add_rms_norm(_x(4, 8), _x(4, 9)), ValueError, "residual must have"),
    ("residual dtype", lambda: fn.fused_add_rms_norm(_x(4, 8), _x(4, 8, dtype=torch.bfloat16)), ValueError,
     "residual must have"),
    ("poly weight", lambda: fn.poly_norm(_x(4, 8), _x(2), _x(1)), ValueError, "weight must have shape"),
    ("poly bias", lambda: fn.poly_norm(_x(4, 8), _x(3), _x(2)), ValueError, "bias must have shape"),
    ("poly no bias", lambda: fn.poly_norm(_x(4, 8), _x(3), None), TypeError, "bias must be a torch.Tensor"),
    ("eps string", lambda: fn.layer_norm(_x(4, 8), (8,), eps="1e-5"), TypeError, "eps must be a real number"),
    ("eps tensor", lambda: fn.group_norm(_x(2, 6, 3), 3, eps=torch.tensor(1e-5)), TypeError, "eps must be a real"),
    ("rms eps", lambda: fn.rms_norm(_x(4, 8), (8,), eps=[1e-6]), TypeError, "eps must be a real number"),
    ("fadd eps", lambda: fn.fused_add_rms_norm(_x(4, 8), _x(4, 8), eps=None), TypeError, "eps must be a real"),
    ("poly eps", lambda: fn.poly_norm(_x(4, 8), _x(3), _x(1), eps="x"), TypeError, "eps must be a real number"),
    ("offset", lambda: fn.rms_norm(_x(4, 8), (8,), _x(8), offset="1"), TypeError, "offset must be a real number"),
    ("fadd offset", lambda: fn.fused_add_rms_norm(_x(4, 8), _x(4, 8), offset=None), TypeError, "offset must be"),
]


@pytest.mark.parametrize("call, error, message", [pytest.param(*c[1:], id=c[0]) for c in BAD_INPUTS])
def test_bad_input(call, error, message, monkeypatch):
    launched = []
    for name in ("_row_norm_fwd_kernel", "_long_row_norm_fwd_kernel", "_group_norm_fwd_kernel",
                 "_poly_norm_fwd_kernel", "_long_poly_norm_fwd_kernel"):
        monkeypatch.setattr(fn, name, type("NoLaunch", (), {"__getitem__": lambda s, g: launched.append(g)})())
    with pytest.raises(error, match=message):
        call()
    assert not launched


@pytest.mark.parametrize("form", ["int", "list", "torch.Size", "numpy int"])
def test_normalized_shape_forms(form):
    """normalized_shape as torch.nn's norms take it: each form gives the tuple's output bit for bit."""
    x, w = _x(5, 12), _x(12)
    if form == "numpy int":
        shape = pytest.importorskip("numpy").int64(12)   # no NumPy, no NumPy ints to pass
    else:
        shape = {"int": 12, "list": [12], "torch.Size": torch.Size([12])}[form]
    for op in (fn.rms_norm, fn.layer_norm):
        assert torch.equal(op(x, shape, w), op(x, (12,), w))


def test_cpu_tensor_without_interpreter(monkeypatch):
    """A CPU tensor when Triton's interpreter is off: the message says how to run on the CPU."""
    monkeypatch.setattr(fn, "_interpreting", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fn.rms_norm(torch.randn(4, 8), (8,))


# ----------------------------------------------------------------------------
# Edge cases
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(OPS))
def test_empty_batch(name):
    """Zero rows: empty output, empty dx, zero parameter gradients."""
    op = OPS[name]
    shape, groups = ((0, 6, 5), 3) if name == "gn" else ((0, 16), None)
    d = prepare(op, shape, torch.float32, ALL_TRAIN[name], _with_grads(name), groups)
    outs = as_tuple(op.run(d))
    assert all(o.shape == d["x"].shape for o in outs)
    sum(o.sum() for o in outs).backward()
    assert d["x"].grad.shape == d["x"].shape
    assert all(torch.equal(d[p].grad, torch.zeros_like(d[p])) for p in op.params)


def test_rms_norm_single_element_rows():
    """N = 1: y = x / sqrt(x^2 + eps) * w."""
    x = randn(9, 1, shift=0.5).requires_grad_()
    w = randn(1, shift=1.0).requires_grad_()
    y = fn.rms_norm(x, (1,), w, 1e-5)
    ref = fn.rms_norm_reference(x.detach().double().cpu(), (1,), w.detach().double().cpu(), 1e-5)
    assert rel_error(y, ref) < 1e-5
    y.sum().backward()
    x64, w64 = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    fn.rms_norm_reference(x64, (1,), w64, 1e-5).sum().backward()
    assert rel_error(w.grad, w64.grad) < 1e-5
    assert torch.allclose(x.grad.double().cpu(), x64.grad, atol=1e-4)


def _laid_out(t, make):
    """A tensor of t's values in the storage `make(t)` returns, whose other
    elements (between sliced rows, before a misaligned start) hold NaN: a
    lane outside the rows that reached a result would make it NaN, which
    `rel_error` refuses."""
    out = make(t)
    (out if out._base is None else out._base).fill_(float("nan"))
    return out.copy_(t)


def _row_stride(stride):
    """A layout (as LAYOUTS'): the rows sliced from rows of `stride` elements."""
    return lambda t: _laid_out(t, lambda t: t.new_empty(*t.shape[:-1], stride)[..., : t.shape[-1]])


# Other layouts of an input's values: its rows sliced from wider rows (row
# stride N + 3), its address one element past a 16-byte boundary, transposed.
LAYOUTS = {
    "contiguous": None,
    "sliced": lambda t: _laid_out(t, lambda t: t.new_empty(*t.shape[:-1], t.shape[-1] + 3)[..., : t.shape[-1]]),
    "misaligned": lambda t: _laid_out(t, lambda t: t.new_empty(t.numel() + 1)[1:].view(t.shape)),
    "transposed": lambda t: _laid_out(t, lambda t: t.new_empty(t.shape[::-1]).permute(*reversed(range(t.dim())))),
}


def _wide(t):
    """t as rows of a wider tensor, a row stride of N + 64: still aligned for
    vectors, unlike LAYOUTS' "sliced" (N + 3)."""
    return _laid_out(t, lambda t: t.new_empty(*t.shape[:-1], t.shape[-1] + 64)[..., : t.shape[-1]])


def _layouts():
    for name, layout in itertools.product(OPS, ["transposed", "sliced", "expanded_dy"]):
        yield pytest.param(name, layout, 8192, id=f"{name}-{layout}")
        if name != "gn":   # the long-row kernels (PolyNorm: its chunk loops); GroupNorm copies x first
            yield pytest.param(name, layout, 64, id=f"{name}-{layout}-long-rows")


@pytest.mark.parametrize("name, layout, row_block_max", list(_layouts()))
def test_non_contiguous(name, layout, row_block_max, monkeypatch):
    """Non-contiguous inputs (transposed, sliced rows) and gradients (expanded,
    as from .sum()); fewer rows on the long-row kernels (`_rows_for`)."""
    _long_rows_from(row_block_max, monkeypatch)
    op = OPS[name]
    d = prepare(op, (2, 6, 5, 7) if name == "gn" else (_rows_for(row_block_max, 100), 100), torch.float32,
                ALL_TRAIN[name], {k: False for k in input_names(op)}, 3 if name == "gn" else None)
    for k in input_names(op):
        base = d[k].detach()
        if layout == "expanded_dy":
            view = base.clone()
        else:
            view = LAYOUTS[layout](base)
            assert not view.is_contiguous()
        d[k] = view.requires_grad_()
    outs = as_tuple(op.run(d))
    d64, refs = reference_of(op, d)
    for out, ref in zip(outs, refs):
        assert rel_error(out, ref) < 1e-5
    loss = sum(o.sum() for o in outs) if layout == "expanded_dy" else sum((o * o).sum() for o in outs)
    loss64 = sum(r.sum() for r in refs) if layout == "expanded_dy" else sum((r * r).sum() for r in refs)
    loss.backward()
    loss64.backward()
    for k, v in d.items():
        if isinstance(v, torch.Tensor) and v.requires_grad:
            assert rel_error(v.grad, d64[k].grad) < 2e-5, k


@pytest.mark.parametrize("smem_kib", [100, 164, 228])   # an Ada or Blackwell consumer GPU, A100, H100 / H200
def test_pipeline_buffers_fit_shared_memory(monkeypatch, smem_kib):
    """The software pipeline's depth leaves the buffers of every program sharing
    an SM inside its shared memory, and still pipelines where they fit."""
    monkeypatch.setattr(fn, "_smem_per_sm_of", lambda index: smem_kib * 1024)
    cuda = torch.device("cuda", 0)
    for tile_bytes in (4096 * 2 * 2, 8192 * 2 * 4, 8192 * 2 * 8, 16384 * 8, 16384 * 2 * 3, 16384 * 2 * 4):
        for programs_per_sm in (1, 2, 4):
            for depth in (fn.PIPELINE_STAGES, fn.PADDED_PIPELINE_STAGES):
                for exact in (False, True):
                    stages = fn._pipeline_stages(tile_bytes, programs_per_sm, cuda, depth, exact)
                    assert 1 <= stages <= depth
                    # Triton allocates stages - 1 tile buffers per program.
                    assert programs_per_sm * ((stages - 1) * tile_bytes + fn.SMEM_RESERVE) <= smem_kib * 1024
    if smem_kib >= 164:   # bf16 x and dy at N = 4096, two programs per SM: the full depth fits
        assert fn._pipeline_stages(4096 * 2 * 2, 2, cuda) == fn.PIPELINE_STAGES
    if smem_kib == 228:   # piped rows of 16384: x, dy and w fit two buffers; with ds too, one
        assert fn._pipeline_stages(16384 * 2 * 3, 1, cuda, exact=True) == fn.PIPELINE_STAGES
        assert fn._pipeline_stages(16384 * 2 * 4, 1, cuda, exact=True) == fn.PIPELINE_STAGES - 1


@pytest.mark.parametrize("name", list(OPS))
def test_nan_stays_in_its_row(name):
    """A NaN or inf in one row (GroupNorm: one sample's group) leaves every other row untouched."""
    op = OPS[name]
    shape, groups = ((3, 6, 5, 7), 3) if name == "gn" else ((37, 100), None)
    d = prepare(op, shape, torch.float32, ALL_FROZEN[name], _with_grads(name), groups)
    x = d["x"].detach().clone()
    x[1, 0] = float("nan")
    x[2, 0] = float("inf")
    d["x"] = x.requires_grad_()
    outs = as_tuple(op.run(d))
    sum((o * o).sum() for o in outs).backward()
    clean = [0] + list(range(3, shape[0]))
    if name == "gn":   # samples 1 and 2 hold the bad values in their first group (channels 0-1) only
        assert torch.isfinite(outs[0][0]).all() and torch.isfinite(outs[0][1:3, 2:]).all()
        assert torch.isfinite(d["x"].grad[0]).all() and torch.isfinite(d["x"].grad[1:3, 2:]).all()
        assert not torch.isfinite(outs[0][1, :2]).any()
    else:
        assert torch.isfinite(outs[0][clean]).all()
        assert torch.isfinite(d["x"].grad[clean]).all()
        assert not torch.isfinite(outs[0][1]).any()


@pytest.mark.parametrize("row_block_max", [8192, 64], ids=["tile", "long-rows"])
def test_rms_inf_as_torch(row_block_max, monkeypatch):
    """An inf in a row gives rstd = 0: torch's RMSNorm then has NaN at the inf
    and 0 elsewhere in that row (inf * 0), and so must ours, in a tile and over
    chunks; RMSNorm has no mean whose NaN could spread over the row."""
    _long_rows_from(row_block_max, monkeypatch)
    x = randn(5, 200)
    x[3, 17] = float("inf")
    w = randn(200, shift=1.0)
    out = fn.rms_norm(x, (200,), w, 1e-6)
    ref = torch.nn.functional.rms_norm(x.double().cpu(), (200,), w.double().cpu(), 1e-6)
    assert torch.equal(out.isnan().cpu(), ref.isnan()) and ref.isnan().sum() == 1
    finite = ~ref.isnan()
    assert rel_error(out.cpu().double()[finite], ref[finite]) < 1e-6


# ----------------------------------------------------------------------------
# Memory safety: every store inside its tensor
# ----------------------------------------------------------------------------

GUARD_BYTES = 4096   # each side of a guarded tensor: wider than any chunk at KERNEL_PATHS' lengths (128 fp32)
GUARD_BYTE = 0xA5    # the guard's fill; an out-of-bounds store overwrites some of it
EMPTY_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}   # no values of their own


class GuardedAllocations(FactoryOpMode):
    """Every tensor a factory op (empty, zeros, ...) or a clone creates,
    placed between two guards of GUARD_BYTES filled with GUARD_BYTE in a
    larger storage (same shape, strides and values; no view of anything).
    A kernel that stores past the end or before the start of its output, its
    statistics or its scratch changes a guard, and `assert_intact` says which
    allocation's. Stores past a row's end into the next row are overwritten by
    the next row's program on the interpreter, which runs programs in order;
    the last row's reach the guard. A floating-point tensor from an empty
    op (EMPTY_OPS) holds NaN: an element that no kernel writes, or a read of
    scratch that no kernel wrote, makes a result NaN, which `rel_error`
    refuses."""

    def __init__(self):
        super().__init__()
        self.guarded = []   # (the guarded storage, the tensor's bytes in it, what was allocated)

    def created(self, name, out):
        nbytes = out.untyped_storage().nbytes()
        storage = torch.full((2 * GUARD_BYTES + nbytes,), GUARD_BYTE, dtype=torch.uint8, device=out.device)
        guarded = torch.empty(0, dtype=out.dtype, device=out.device)
        guarded.set_(storage.untyped_storage(), GUARD_BYTES // out.element_size() + out.storage_offset(),
                     out.shape, out.stride())
        if name in EMPTY_OPS and out.is_floating_point():
            guarded.fill_(float("nan"))
        else:
            guarded.copy_(out)
        self.guarded.append((storage, nbytes, f"{name} {tuple(out.shape)} {out.dtype}"))
        return guarded

    def assert_intact(self):
        for storage, nbytes, what in self.guarded:
            for guard in (storage[:GUARD_BYTES], storage[GUARD_BYTES + nbytes:]):
                assert (guard == GUARD_BYTE).all(), f"a store outside {what}"


def _guarded_inputs(d):
    """x, the residual and the parameters of `d` between NaN guards of
    GUARD_BYTES: a load past a tensor that reached a result would make it
    NaN, which `rel_error` refuses."""
    def guarded(t):   # `_laid_out` fills the guards with NaN
        pad = GUARD_BYTES // t.element_size()
        return t.new_empty(2 * pad + t.numel())[pad: pad + t.numel()].view(t.shape)

    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            d[k] = _laid_out(v.detach(), guarded).requires_grad_(v.requires_grad)
    return d


def _guard_cases():
    for (name, path, shape, groups), mode in itertools.product(KERNEL_PATHS, ["train", "frozen"]):
        yield pytest.param(name, path, shape, groups, mode, id=f"{name}-{path}-{mode}")


@pytest.mark.parametrize("name, path, shape, groups, mode", list(_guard_cases()))
def test_stores_stay_inside(name, path, shape, groups, mode, monkeypatch):
    """On every kernel path, in bf16, trained (the scratch and its reduction
    too) and frozen: no kernel writes outside the tensors it was given, and
    no load past an input reaches a result."""
    _take_path(name, path, monkeypatch)
    params = (ALL_TRAIN if mode == "train" else ALL_FROZEN)[name]
    op = OPS[name]
    make = op.make
    monkeypatch.setattr(op, "make", lambda shape, dtype: _guarded_inputs(make(shape, dtype)))
    with GuardedAllocations() as guard:
        check_op(op, shape, torch.bfloat16, params, _with_grads(name), groups)
    assert guard.guarded
    guard.assert_intact()


# ----------------------------------------------------------------------------
# Autograd behaviour
# ----------------------------------------------------------------------------

def test_toggle_requires_grad_between_steps():
    """Freeze and unfreeze between steps: each step gets exactly the gradients asked for."""
    m = fn.LayerNorm(100).to(DEVICE)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    ref = torch.nn.LayerNorm(100, dtype=torch.float64)
    for step, (w_on, b_on) in enumerate([(True, True), (False, True), (False, False), (True, False), (True, True)]):
        m.weight.requires_grad_(w_on)
        m.bias.requires_grad_(b_on)
        m.zero_grad(set_to_none=True)
        x = randn(37, 100).requires_grad_()
        m(x).pow(2).sum().backward()
        ref.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
        ref.zero_grad(set_to_none=True)
        x64 = x.detach().double().cpu().requires_grad_()
        ref(x64).pow(2).sum().backward()
        assert rel_error(x.grad, x64.grad) < 1e-5
        for p, p64, on in [(m.weight, ref.weight, w_on), (m.bias, ref.bias, b_on)]:
            assert (p.grad is not None) == on, step
            if on:
                assert rel_error(p.grad, p64.grad) < 1e-5


@pytest.mark.parametrize("name", list(OPS))
def test_gradients_accumulate(name):
    op = OPS[name]
    shape, groups = small_case(name)
    d = prepare(op, shape, torch.float32, ALL_TRAIN[name], _with_grads(name), groups)
    first = None
    for _ in range(2):
        outs = op.run(d)
        sum(o.pow(2).sum() for o in as_tuple(outs)).backward()
        if first is None:
            first = {k: v.grad.clone() for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    for k, g in first.items():
        assert torch.allclose(d[k].grad, 2 * g, rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize("name", list(OPS))
def test_double_backward_raises(name):
    op = OPS[name]
    shape, groups = small_case(name)
    d = prepare(op, shape, torch.float32, ALL_TRAIN[name], _with_grads(name), groups)
    outs = op.run(d)
    loss = sum(o.pow(2).sum() for o in as_tuple(outs))
    (gx,) = torch.autograd.grad(loss, [d["x"]], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


def test_checkpoint():
    """Inside torch.utils.checkpoint: the forward runs twice, the gradients match."""
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), fn.RMSNorm(64), torch.nn.Linear(64, 64), fn.LayerNorm(64))
    m = m.to(DEVICE)
    x = randn(33, 64).requires_grad_()
    m(x).pow(2).sum().backward()
    plain = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
    m.zero_grad()
    x.grad = None
    torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False).pow(2).sum().backward()
    for a, b in zip(plain, [p.grad for p in m.parameters()] + [x.grad]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(OPS))
def test_inference_mode(name):
    """Under torch.inference_mode (evaluation, serving): the outputs of a
    call under autograd, bit for bit, as inference tensors."""
    op = OPS[name]
    shape, groups = small_case(name)
    d = prepare(op, shape, torch.bfloat16, ALL_TRAIN[name], _with_grads(name), groups)
    outs = as_tuple(op.run(d))
    with torch.inference_mode():
        inferred = as_tuple(op.run(d))
    assert len(inferred) == len(outs)
    for a, b in zip(inferred, outs):
        assert a.is_inference() and not a.requires_grad and torch.equal(a, b)


class _AllFive(torch.nn.Module):
    """One module of each kind, as a model would chain them."""

    def __init__(self, n):
        super().__init__()
        self.rms, self.fadd = fn.RMSNorm(n), fn.FusedAddRMSNorm(n)
        self.ln, self.gn, self.poly = fn.LayerNorm(n), fn.GroupNorm(4, n), fn.PolyNorm()

    def forward(self, x):
        y, s = self.fadd(self.rms(x), x)
        return self.poly(self.gn(self.ln(y) + s))


def test_torch_export():
    """torch.export takes a model of these modules (a graph for serving or
    AOT compilation): each norm is one custom op of the module's namespace in
    the exported graph, and the exported program gives eager's bits."""
    torch.manual_seed(0)
    m = _AllFive(48).to(DEVICE)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(1.0, 0.1)
    x = randn(13, 48)
    program = torch.export.export(m, (x,))
    ops = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert sum(o.startswith(fn._OPS_NAMESPACE + ".") for o in ops) == 5, ops
    assert torch.equal(program.module()(x), m(x))


@gpu
def test_autocast_keeps_input_dtype():
    """Under autocast the norm computes in fp32 internally and returns x's dtype.

    torch's own layer_norm returns fp32 under autocast; the values agree.
    """
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), fn.LayerNorm(256), torch.nn.Linear(256, 256)).cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        h = m[0](x)
        y = m[1](h)
        ref = torch.nn.functional.layer_norm(h, (256,), m[1].weight, m[1].bias)
        out = m[2](y)
    assert h.dtype == torch.bfloat16 and y.dtype == torch.bfloat16 and ref.dtype == torch.float32
    assert rel_error(y, ref) < 1e-2
    out.float().pow(2).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


# ----------------------------------------------------------------------------
# torch.compile: one graph, the same kernels
# ----------------------------------------------------------------------------

# Inductor on a GPU; on the CPU the graph runs op by op (Dynamo and
# AOTAutograd trace as they do for Inductor; Inductor would need a C compiler).
COMPILE_BACKEND = "inductor" if HAS_GPU else "aot_eager"
COMPILE_SHAPES = {"row": [((37, 100), None), ((5, 3, 64), None)], "gn": [((2, 6, 5, 7), 3), ((3, 6, 4), 2)]}
COMPILE_PATTERNS = ["train", "frozen", "mixed"]


def _compile_params(name, pattern):
    if pattern == "mixed":   # the first parameter trained, the others frozen
        return {p: TRAIN if i == 0 else FROZEN for i, p in enumerate(OPS[name].params)}
    return (ALL_TRAIN if pattern == "train" else ALL_FROZEN)[name]


def compiled_run(op, dynamic=None):
    """op.run under torch.compile with fullgraph=True, which raises on a graph break."""
    torch._dynamo.reset()   # op.run is one code object for every test: start its cache afresh
    return torch.compile(lambda d: op.run(d), backend=COMPILE_BACKEND, fullgraph=True, dynamic=dynamic)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("pattern", COMPILE_PATTERNS)
def test_torch_compile_one_graph(name, pattern):
    """Forward and backward of each op compiled as one graph: the bits of an
    eager call, outputs and the gradients of every input that requires one;
    on two shapes (the second recompiles), and with symbolic shapes
    (dynamic=True) for the mixed pattern."""
    op = OPS[name]
    compiled = compiled_run(op, dynamic=True if pattern == "mixed" else None)
    for shape, groups in COMPILE_SHAPES["gn" if name == "gn" else "row"]:
        d = prepare(op, shape, torch.float32, _compile_params(name, pattern), _with_grads(name), groups)
        leaves = [v for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        eager, got = as_tuple(op.run(d)), as_tuple(compiled(d))
        dys = grad_outputs(eager)
        want_grads = torch.autograd.grad(eager, leaves, dys)
        got_grads = torch.autograd.grad(got, leaves, dys)
        assert len(got) == len(eager) and len(got_grads) == len(want_grads) == len(leaves)
        for a, b in zip(list(got) + list(got_grads), list(eager) + list(want_grads)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(OPS))
def test_torch_compile_frozen_backward(name):
    """Compiled, the backward still follows needs_input_grad: with every
    parameter frozen its launches compute dx alone and launch no reduction;
    trained, the same call computes dw (so this test can fail). The op runs
    the eager launcher, whose allocations
    `test_frozen_backward_allocates_only_input_grads` checks."""
    from bench_frozen_norm import recording
    op = OPS[name]
    shape, groups = COMPILE_SHAPES["gn" if name == "gn" else "row"][0]
    compiled = compiled_run(op)
    for params, trains in ((ALL_FROZEN[name], False), (ALL_TRAIN[name], True)):
        d = prepare(op, shape, torch.float32, params, _with_grads(name), groups)
        leaves = [v for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        outs = as_tuple(compiled(d))
        dys = grad_outputs(outs)
        # The kernels are recorded, not run, planned for the SM count that the
        # forward's plan (GroupNorm's statistics tensor) was made for.
        with recording(num_sms=fn._num_sms(torch.device(DEVICE))) as rec:
            torch.autograd.grad(outs, leaves, dys)
        names = [launch.name for launch in rec.launches]
        asks = [launch.constexprs.get(flag, False) for launch in rec.launches for flag in ("COMPUTE_DW", "COMPUTE_DB")]
        assert names and any(asks) == trains, (names, asks)
        assert ("_sum_partials_kernel" in names) == trains, names


def test_torch_compile_bad_input():
    """Under torch.compile a bad argument raises the eager call's error, before any launch."""
    from bench_frozen_norm import recording
    torch._dynamo.reset()
    x, w = randn(4, 8), randn(9)
    with recording() as rec, pytest.raises(ValueError, match="weight must have shape"):
        torch.compile(lambda x, w: fn.rms_norm(x, (8,), w), backend=COMPILE_BACKEND)(x, w)
    assert rec.launches == []


def test_custom_ops_namespace_and_reload():
    """The ops are registered under the module's own name (a copy vendored as
    pkg/frozen_norm.py gets pkg_frozen_norm), and reloading the module (a
    notebook's autoreload) keeps them working, compiled too. In a child
    process, so that this one's module stays as it is."""
    assert fn._CUSTOM_OPS["_row_norm_forward"] is torch.ops.frozen_norm.row_norm_forward.default
    code = ("import importlib, frozen_norm, torch\n"
            "importlib.reload(frozen_norm)\n"
            f"x = torch.randn(3, 8, device='{DEVICE}', requires_grad=True)\n"
            "f = torch.compile(lambda x: frozen_norm.rms_norm(x, (8,)), backend='aot_eager', fullgraph=True)\n"
            "f(x).sum().backward()\n"
            "assert torch.equal(f(x), frozen_norm.rms_norm(x, (8,))) and x.grad is not None\n")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=here, env=os.environ)   # TRITON_INTERPRET as here


@gpu
def test_torch_compile_model():
    """A model built of these modules, compiled by Inductor as one graph
    (fullgraph=True) and with CUDA graphs (mode="reduce-overhead"): eager's
    gradients, but for the rounding of Inductor's own kernels (the matmuls
    and GELU differ from eager's by up to about 1e-3; the norms' bits are
    `test_torch_compile_one_graph`'s)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(128, 128), fn.RMSNorm(128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                            fn.LayerNorm(128)).cuda()
    m[1].weight.requires_grad_(False)   # a frozen norm beside a trained one
    x = torch.randn(64, 128, device="cuda", requires_grad=True)
    m(x).pow(2).sum().backward()
    eager = [p.grad.clone() for p in m.parameters() if p.requires_grad] + [x.grad.clone()]
    for kwargs in (dict(fullgraph=True), dict(mode="reduce-overhead")):
        torch._dynamo.reset()
        compiled = torch.compile(m, **kwargs)
        for _ in range(3):   # reduce-overhead records its CUDA graph on a later call
            m.zero_grad()
            x.grad = None
            compiled(x).pow(2).sum().backward()
        assert m[1].weight.grad is None
        for a, b in zip(eager, [p.grad for p in m.parameters() if p.requires_grad] + [x.grad]):
            assert rel_error(b, a) < 5e-3


@gpu
def test_torch_compile_reduce_overhead_long_rows(monkeypatch):
    """LayerNorm with w and b trained on fp32 rows of 8200 (the long-row
    kernels), compiled with CUDA graphs (mode="reduce-overhead"): its recorded
    graph runs the dw/db kernel beside the dx kernel on the side stream, and
    gives the bits of an eager call that does the same (DW_BESIDE_EAGER), not
    those of one that runs it after (another order of the sums: fp32 dw)."""
    torch.manual_seed(0)
    norm = fn.LayerNorm(8200).cuda()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
        norm.bias.normal_(0.0, 0.1)
    x = torch.randn(300, 8200, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)

    def grads(f):
        norm.zero_grad()
        x.grad = None
        f(x).backward(dy)
        return [x.grad.clone(), norm.weight.grad.clone(), norm.bias.grad.clone()]
    torch._dynamo.reset()
    compiled = torch.compile(norm, mode="reduce-overhead")
    for _ in range(3):   # reduce-overhead records its CUDA graph on a later call
        replayed = grads(compiled)
    after = grads(norm)
    assert torch.equal(replayed[0], after[0]) and not torch.equal(replayed[1], after[1])
    monkeypatch.setattr(fn, "DW_BESIDE_EAGER", True)
    for got, want in zip(replayed, grads(norm)):
        assert torch.equal(got, want)


# One shape per path, for CUDA-graph capture and for the tests of the device a
# launch goes to: short rows (the tile kernels), long rows (the long-row
# kernels, or the piped tiles, in 16- and 8-byte vectors, and RELOAD's; where
# the dw/db kernel runs, as for LayerNorm's trained rows, a capture runs it
# beside the dx kernel, in one row slice), GroupNorm with 256 rows, with 4
# rows split over programs (the two-launch path) and with 2048 short rows.
GPU_PATH_SHAPES = {"row": [((300, 1000), None), ((700, 8200), None), ((300, 12288), None), ((200, 13312), None),
                           ((200, 14336), None), ((200, 16384), None)],
                   "gn": [((8, 64, 32, 32), 32), ((1, 64, 64, 64), 4), ((64, 64, 8, 8), 32)]}


@gpu
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("mode", ["train", "frozen"])
def test_cuda_graph_capture(name, mode):
    """Forward and backward captured in one CUDA graph, then replayed on new
    values: the bits of a plain call that, as captures do, runs the long-row
    dw/db kernel beside the dx kernel (DW_BESIDE_EAGER). Capture fails on a
    host synchronization or a launch outside the capturing stream (the side
    stream joins and leaves the capture through events), and replay would go
    wrong if a call kept host-side state from the captured call."""
    from bench_frozen_norm import capture_graph
    op = OPS[name]
    params = (ALL_TRAIN if mode == "train" else ALL_FROZEN)[name]
    for shape, groups in GPU_PATH_SHAPES["gn" if name == "gn" else "row"]:
        d = prepare(op, shape, torch.bfloat16, params, _with_grads(name), groups)
        leaves = [k for k, v in d.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        outs = as_tuple(op.run(d))
        dys = grad_outputs(outs)

        def step():
            o = as_tuple(op.run(d))
            return list(o) + list(torch.autograd.grad(o, [d[k] for k in leaves], dys))

        d.update({k: d[k].detach().requires_grad_() for k in leaves})   # fresh leaves, as capture_graph asks
        graph, captured = capture_graph(step, warmups=1)
        with torch.no_grad():
            for t in [d[k] for k in op.params + input_names(op) if d[k] is not None] + dys:
                t.copy_(torch.randn_like(t, dtype=torch.float32) + 0.5)
        graph.replay()
        with pytest.MonkeyPatch.context() as m:   # as in the graph: dw/db of long rows beside dx
            m.setattr(fn, "DW_BESIDE_EAGER", True)
            plain = step()
        assert len(captured) == len(plain) == len(outs) + len(leaves)
        for got, want in zip(captured, plain):
            assert torch.equal(got, want)


@gpu
@pytest.mark.parametrize("name", list(OPS))
def test_launches_on_the_tensors_device(name, monkeypatch):
    """A launcher makes its tensors' GPU the current device when another one
    is (`_launcher`; a model spread over GPUs). With one GPU, that is feigned:
    torch.cuda.current_device answers another index (Triton's launcher bound
    the real one when it started), and every forward and backward must enter
    torch.cuda.device(x.device) and give the bits of a plain call."""
    op = OPS[name]
    for shape, groups in GPU_PATH_SHAPES["gn" if name == "gn" else "row"]:
        d = prepare(op, shape, torch.bfloat16, ALL_TRAIN[name], _with_grads(name), groups)
        plain = _outputs_and_grads(op, d)
        entered, real_device = [], torch.cuda.device

        class recorded_device(real_device):
            def __init__(self, device):
                entered.append(torch.device(device))
                super().__init__(device)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch.cuda, "current_device", lambda: d["x"].device.index + 1)
            m.setattr(torch.cuda, "device", recorded_device)
            moved = _outputs_and_grads(op, d)
        assert entered and all(e == d["x"].device for e in entered)   # one per launcher call
        for got, want in zip(moved, plain):
            assert torch.equal(got, want)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("name", list(OPS))
def test_tensors_on_another_gpu(name):
    """Tensors on cuda:1 while cuda:0 is current: the results of the same call
    with cuda:1 current, bit for bit, and cuda:0 still current afterwards."""
    op = OPS[name]
    for shape, groups in GPU_PATH_SHAPES["gn" if name == "gn" else "row"]:
        d = prepare(op, shape, torch.bfloat16, ALL_TRAIN[name], _with_grads(name), groups)
        d = {k: (v.detach().to("cuda:1").requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
             for k, v in d.items()}
        with torch.cuda.device(1):
            want = _outputs_and_grads(op, d)
        with torch.cuda.device(0):
            got = _outputs_and_grads(op, d)
            assert torch.cuda.current_device() == 0
        for g, w in zip(got, want):
            assert g.device == torch.device("cuda:1") and torch.equal(g, w)


@gpu
@pytest.mark.parametrize("name", ["rms", "ln", "fadd", "poly"])
def test_huge_hidden_size(name):
    """262,144 elements per row: far past one block, still exact."""
    check_op(OPS[name], (5, 262144), torch.bfloat16, ALL_TRAIN[name], _with_grads(name))
    check_op(OPS[name], (5, 262144), torch.bfloat16, ALL_FROZEN[name], _with_grads(name))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("name", ["rms", "fadd", "ln"])
def test_full_tile_forward(name, dtype):
    """Rows of TILE_ELEMENTS and ROW_BLOCK_MAX fill the forward's tile; those
    of ROW_BLOCK_MAX, and RMSNorm's and LayerNorm's fp32 ones of
    TILE_ELEMENTS, take FULL_TILE_ELEMENTS_PER_THREAD a thread (16 and 8
    warps; those LayerNorm's load w and b first, W_FIRST; the plan is
    test_narrow_forward_plan's): exact where warps are real (the
    interpreter runs a program as one thread), trained and frozen."""
    for N, params in itertools.product((fn.TILE_ELEMENTS, fn.ROW_BLOCK_MAX), (ALL_TRAIN[name], ALL_FROZEN[name])):
        check_op(OPS[name], (300, N), dtype, params, _with_grads(name))


# Inputs of more than 2^31 elements (bf16, 4 GiB each), cases that launch
# every kernel: the row tiles (RMSNorm), the piped rows (FusedAdd trained, with
# ds; RMSNorm trained from Triton 3.8 on), RELOAD (RMSNorm trained at 13312
# under Triton 3.6, PIPED_ALL_TRITON), the long rows and the dw/db kernel
# (LayerNorm; FusedAdd frozen), the rows past COLUMNS_DX_ROW_BYTES (RMSNorm
# trained at 262144), PolyNorm's tiles (1024) and long rows (32768),
# GroupNorm's long rows (32 groups), split rows (2) and short rows (2 channels
# of 256 positions).
HUGE_CASES = [("rms", (2**31 // 4096 + 1, 4096), None), ("rms", (2**31 // 13312 + 1, 13312), None),
              ("fadd", (2**31 // 13312 + 1, 13312), None), ("rms", (2**31 // 262144 + 1, 262144), None),
              ("ln", (2**31 // 32768 + 1, 32768), None), ("poly", (2**31 // 1024 + 1, 1024), None),
              ("poly", (2**31 // 32768 + 1, 32768), None),
              ("gn", (17, 32, 2048, 2048), 32), ("gn", (17, 32, 2048, 2048), 2),
              ("gn", (2**31 // 16384 + 1, 64, 16, 16), 32)]
HUGE_SLICE_ELEMENTS = 2**25   # the float64 reference a slice of rows (samples) at a time
# FusedAdd's case holds eight such tensors (x, r, y, s, their dys, dx, dr).
HUGE_GPU_BYTES = 40 * 2**30


def _gpu_randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    """`randn` drawn on the GPU in `dtype`: a CPU draw of 2^31 float64 values takes a minute."""
    return torch.randn(*shape, device="cuda", dtype=dtype).mul_(scale).add_(shift)


def _check_huge(op, shape, groups, params):
    """One configuration of more than 2^31 elements against float64: the outputs
    and input gradients of the first and last slices of rows (samples), and the
    parameter gradients, whose float64 sums are taken a slice at a time."""
    d = prepare(op, shape, torch.bfloat16, params, {k: True for k in input_names(op)}, groups)
    outs = as_tuple(op.run(d))
    dys = grad_outputs(outs)
    torch.autograd.backward(outs, dys)
    inputs = input_names(op)
    p64 = {k: d[k].detach().double().requires_grad_(d[k].requires_grad) for k in op.params}
    rows = shape[0]
    step = max(1, HUGE_SLICE_ELEMENTS // math.prod(shape[1:]))
    for lo in range(0, rows, step):
        part = slice(lo, min(rows, lo + step))
        ends = lo == 0 or part.stop == rows
        if not (ends or TRAIN in params.values()):
            continue   # nothing to check in this slice
        d64 = dict(d, **p64)
        d64.update({k: d[k].detach()[part].double().requires_grad_(ends) for k in inputs})
        refs = as_tuple(op.reference(d64))
        torch.autograd.backward(*zip(*[(r, dy[part].double()) for r, dy in zip(refs, dys) if r.requires_grad]))
        if ends:
            for out, ref in zip(outs, refs):
                assert rel_error(out[part], ref) < TOLERANCE[torch.bfloat16], (op.name, shape, lo)
            for k in inputs:
                assert rel_error(d[k].grad[part], d64[k].grad) < 2 * TOLERANCE[torch.bfloat16], (op.name, k, lo)
    for k in op.params:
        if params[k] == TRAIN:
            assert rel_error(d[k].grad, p64[k].grad) < 2 * TOLERANCE[torch.bfloat16], (op.name, shape, k)
        else:
            assert d[k].grad is None


def test_huge_cases_reach_every_kernel():
    """HUGE_CASES launch all fourteen kernels, trained and frozen (their plans
    recorded for an H200 on meta tensors), so the test below covers each."""
    from bench_frozen_norm import KERNELS, record_backward, record_forward
    seen = set()
    for name, shape, groups in HUGE_CASES:
        size = (*shape, groups) if name == "gn" else shape
        seen |= {launch.name for launch in record_forward(name, size).launches}
        for train in (1, 0):   # as ALL_TRAIN and ALL_FROZEN, with dx
            want = {"dx": 1, "dw": train} if name in ("rms", "fadd") else {"dx": 1, "dw": train, "db": train}
            seen |= {launch.name for launch in record_backward(name, size, want).launches}
    assert seen == set(KERNELS), sorted(set(KERNELS) - seen)


@gpu
@pytest.mark.skipif(HAS_GPU and torch.cuda.get_device_properties(0).total_memory < HUGE_GPU_BYTES,
                    reason=f"needs {HUGE_GPU_BYTES // 2**30} GiB of GPU memory")
def test_more_than_2_31_elements(monkeypatch):
    """Every kernel family on inputs of more than 2^31 elements, trained and
    frozen: offsets must be 64-bit. One test, the cases in turn, so that
    parallel workers do not hold several 4 GiB cases at once."""
    monkeypatch.setattr(sys.modules[__name__], "randn", _gpu_randn)
    for name, shape, groups in HUGE_CASES:
        for params in (ALL_TRAIN[name], ALL_FROZEN[name]):
            _check_huge(OPS[name], shape, groups, params)
            torch.cuda.empty_cache()


# Row lengths at and beside the planners' limits (ROW_BLOCK_MAX, the piped
# rows' 12288 and 16384, in narrow vectors 10240 and 14336, RELOAD's 13312,
# the forwards' pre-sum from 24576, the tile sizes), and a few odd ones.
RANDOM_ROW_LENGTHS = [2, 3, 100, 129, 300, 512, 784, 1000, 1024, 2048, 4096, 5000, 8192, 8193, 10240, 12288, 12290,
                      13312, 14336, 16384, 16385, 20480, 24576, 24592, 32768, 32769, 40000, 65536, 70001]
# How many configurations `test_random_cases` draws: 48, or as many as
# FROZEN_NORM_DRAWN_CASES says, for a longer check of a new GPU or Triton
# version (NOTES.md, section 5.5, times one such run).
DRAWN_CASES = int(os.environ.get("FROZEN_NORM_DRAWN_CASES", "48"))


def _drawn_row_length(r):
    """One of RANDOM_ROW_LENGTHS, or, as often, a length among the long rows'
    plans (8192 to 40960): a multiple of 256, or a few elements beside one."""
    if r.random() < 0.5:
        return r.choice(RANDOM_ROW_LENGTHS)
    return r.randrange(8192, 40961, 256) + r.choice([-8, -1, 0, 1, 8, 16, 128])


def _random_case(seed):
    """One drawn configuration: op, shape, dtypes, freeze pattern, layout, and
    whether dy runs along y (`check_op`'s along_y; not with fp16 parameters,
    whose gradients, sums of dy * xhat over up to 2^18 elements, would then
    pass fp16's largest value).
    Shapes hold up to 2^22 elements (or one row, one sample), 2^18 where fp16
    is in play: a gradient sum of 0.1-mean dy over more leaves fp16's range.
    Rows of one element are left to their own test (dx there cancels to eps *
    rstd^3, badly conditioned), and so are LayerNorm's rows of two: centring
    leaves dx a difference of nearly equal terms times rstd (float32's own
    F.layer_norm errs by 1e-4 there, against our tolerance of 2e-5)."""
    r = random.Random(seed)
    name = r.choice(sorted(OPS))
    op = OPS[name]
    dtype, param_dtype = r.choice(DTYPES), r.choice([None, None, *DTYPES])
    limit = 2**18 if torch.float16 in (dtype, param_dtype) else 2**22
    if name == "gn":
        groups, per_group, HW = r.choice([1, 2, 4, 32]), r.choice([1, 3, 4, 16, 40]), r.choice([7, 1024, 3844, 65536])
        spatial = (HW // 4, 4) if HW % 4 == 0 and r.random() < 0.5 else (HW,)
        shape = (max(1, min(r.choice([1, 2, 3, 16]), limit // (groups * per_group * HW))), groups * per_group, *spatial)
    else:
        groups, N = None, _drawn_row_length(r)
        while name == "ln" and N == 2:
            N = _drawn_row_length(r)
        M = max(1, min(r.choice([1, 3, 37, 300, 2048, 8191]), limit // N))
        shape = (M, N) if M % 2 or r.random() < 0.7 else (2, M // 2, N)
    params = {p: r.choice([TRAIN, FROZEN] + ([ABSENT] if op.absent_ok else [])) for p in op.params}
    inputs = {k: r.random() < 0.8 for k in input_names(op)}
    layout = r.choice(list(LAYOUTS))
    along_y = r.random() < 0.5 and (param_dtype or dtype) != torch.float16
    return pytest.param(name, shape, groups, dtype, param_dtype, params, inputs, layout, along_y,
                        id=f"{seed}-{name}-{'x'.join(map(str, shape))}-{DTYPE_IDS[dtype]}-"
                           f"{DTYPE_IDS.get(param_dtype, 'same')}-{pattern_id(params, inputs)}-{layout}"
                           f"{'-along-y' if along_y else ''}")


@gpu
@pytest.mark.parametrize("name, shape, groups, dtype, param_dtype, params, inputs, layout, along_y",
                         [_random_case(seed) for seed in range(DRAWN_CASES)])
def test_random_cases(name, shape, groups, dtype, param_dtype, params, inputs, layout, along_y):
    """Drawn configurations at real sizes, on the GPU only: the CPU tests reach
    the long-row, piped, RELOAD and split plans by lowering their limits, here the
    real limits and SM count choose them, with other layouts and dtypes, and in
    some of them (half of those without fp16 parameters) dy along y, so that an
    error in a row's c1 shows in dx."""
    check_op(OPS[name], shape, dtype, params, inputs, groups, param_dtype, layout=LAYOUTS[layout], along_y=along_y)


# ----------------------------------------------------------------------------
# Modules and replace_norms
# ----------------------------------------------------------------------------

def test_modules_are_drop_in():
    """Same constructor arguments, parameter names and state_dict as torch.nn."""
    pairs = [(torch.nn.LayerNorm(16, eps=1e-3, bias=False), fn.LayerNorm(16, eps=1e-3, bias=False)),
             (torch.nn.RMSNorm([4, 8], eps=1e-4), fn.RMSNorm([4, 8], eps=1e-4)),
             (torch.nn.GroupNorm(4, 8, affine=False), fn.GroupNorm(4, 8, affine=False))]
    for ref, ours in pairs:
        assert ref.state_dict().keys() == ours.state_dict().keys()
        ours.load_state_dict(ref.state_dict())
        assert isinstance(ours, type(ref))
    assert fn.PolyNorm().weight.tolist() == pytest.approx([1 / 3] * 3) and fn.PolyNorm().bias.tolist() == [1.0]
    fa = fn.FusedAddRMSNorm(8, offset=1.0)
    assert torch.equal(fa.weight, torch.zeros(8))


@pytest.mark.parametrize("trained", [True, False], ids=["train", "frozen"])
def test_normalized_over_two_dims(trained):
    """LayerNorm and RMSNorm over the last two dims (normalized_shape [4, 8],
    parameters of shape (4, 8)): outputs and gradients of torch's modules,
    computed in float64."""
    torch.manual_seed(0)
    for ref_type, our_type in [(torch.nn.LayerNorm, fn.LayerNorm), (torch.nn.RMSNorm, fn.RMSNorm)]:
        ref = ref_type([4, 8], eps=1e-5).to(DEVICE)
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(1.0, 0.1)
        ours = our_type([4, 8], eps=1e-5).to(DEVICE)
        ours.load_state_dict(ref.state_dict())
        ours.requires_grad_(trained)
        ref = ref.double().requires_grad_(trained)
        x, dy = randn(3, 5, 4, 8).requires_grad_(), randn(3, 5, 4, 8)
        x64 = x.detach().double().requires_grad_()
        out, want = ours(x), ref(x64)
        assert rel_error(out, want) < TOLERANCE[torch.float32]
        got = torch.autograd.grad(out, [x, *(ours.parameters() if trained else [])], dy)
        expected = torch.autograd.grad(want, [x64, *(ref.parameters() if trained else [])], dy.double())
        assert len(got) == len(expected) == 1 + trained * len(list(ours.parameters()))
        for g, e in zip(got, expected):
            assert g.shape == e.shape and rel_error(g, e) < TOLERANCE[torch.float32]


class LlamaRMSNorm(torch.nn.Module):
    """A Hugging Face-style RMSNorm (computes in fp32, casts back, then scales)."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.variance_epsilon = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(LlamaRMSNorm):
    def forward(self, h):
        return (1.0 + self.weight) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


class OddRMSNorm(LlamaRMSNorm):
    """Named like an RMSNorm, but eps sits outside the square root: not equivalent."""

    def forward(self, h):
        return self.weight * h / (h.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)


class MyLayerNorm(torch.nn.LayerNorm):
    """A subclass may change forward: left alone."""


def test_replace_norms():
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.ModuleList([LlamaRMSNorm(32), GemmaRMSNorm(32)]),
                                torch.nn.GroupNorm(4, 32), torch.nn.RMSNorm(32), OddRMSNorm(32), MyLayerNorm(32),
                                torch.nn.Linear(32, 32)).to(DEVICE)
    model[0].weight.requires_grad_(False)
    params = {name: p for name, p in model.named_parameters()}
    keys = model.state_dict().keys()
    x = randn(6, 32)
    run = lambda: [model[0](x), model[1][0](x), model[1][1](x), model[2](x[..., None]), model[3](x)]  # noqa: E731
    before = run()
    assert fn.replace_norms(model) == 5
    assert type(model[0]) is fn.LayerNorm and type(model[1][0]) is fn.RMSNorm and type(model[1][1]) is fn.RMSNorm
    assert model[1][1].offset == 1.0 and model[1][0].offset == 0.0
    assert type(model[2]) is fn.GroupNorm and type(model[3]) is fn.RMSNorm
    assert type(model[4]) is OddRMSNorm and type(model[5]) is MyLayerNorm
    assert all(p is params[name] for name, p in model.named_parameters())
    assert model.state_dict().keys() == keys and not model[0].weight.requires_grad
    after = run()
    for a, b in zip(before, after):
        assert rel_error(b, a) < 1e-5
    assert fn.replace_norms(model) == 0   # idempotent


# ----------------------------------------------------------------------------
# Dead-code elimination: the compiled kernels (selected by -k dce)
# ----------------------------------------------------------------------------

def _has_cuda_backend():
    try:
        import triton.backends
        return "nvidia" in triton.backends.backends
    except Exception:
        return False


@pytest.fixture(scope="module", params=[90, 80], ids=["sm90", "sm80"])
def dce_report(request, tmp_path_factory):
    """bench_frozen_norm.py --dce-json for Hopper and Ampere, in a child process: the
    interpreter must be off to compile."""
    if not _has_cuda_backend():
        pytest.skip("this Triton has no CUDA backend to compile for")
    path = tmp_path_factory.mktemp("dce") / "dce.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "bench_frozen_norm.py"), "--dce-json", str(path),
                    "--arch", str(request.param)], env=env, check=True, cwd=here)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def planned_code_paths(tmp_path_factory):
    """bench_frozen_norm.py --plans-json for sm_90, in a child process (the
    interpreter must be off to compile); it fails on the first compile error."""
    if not _has_cuda_backend():
        pytest.skip("this Triton has no CUDA backend to compile for")
    path = tmp_path_factory.mktemp("plans") / "plans.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "bench_frozen_norm.py"), "--plans-json", str(path)],
                   env=env, check=True, cwd=here)
    return json.loads(path.read_text())


def test_every_code_path_compiles(planned_code_paths):
    """Triton's compiler, which the interpreter skips, accepts every code path
    the wrappers take (flags, dtypes, launch modes) at the benchmark's
    PLAN_SIZES, each compiled through Triton's launcher with the launch's own
    keyword arguments (the interpreter drops an option it does not know), and
    those paths reach every kernel of the module: a kernel no wrapper launches
    there would go unchecked."""
    kernels = {name for name in dir(fn) if name.startswith("_") and name.endswith("_kernel")}
    assert len(kernels) == 14, kernels
    assert set().union(*planned_code_paths.values()) == kernels
    for op in OPS:
        assert sum(planned_code_paths[op].values()) > 10, (op, planned_code_paths[op])


@pytest.mark.parametrize("name", list(OPS))
def test_every_launch_asks_for_fp_fusion(name):
    """Every launch of the planned code paths passes enable_fp_fusion=FP_FUSION
    (True): the code the kernels were tuned with whatever Triton's default
    (Triton 3.9 warns at a launch that leaves it unset; 3.10 turns it off)."""
    from bench_frozen_norm import planned_launches
    launches = list(planned_launches(name))
    assert fn.FP_FUSION is True and launches
    assert [lc.name for lc in launches if lc.enable_fp_fusion is not True] == []


@pytest.mark.parametrize("name", list(OPS) + ["gn-short"])
def test_dce_flag_removes_scratch_stores(dce_report, name):
    """Compiled for sm_90 with one flag off and its scratch pointer still passed: that
    pointer gets no store (PolyNorm's dw and db share one buffer: fewer stores)."""
    entry = dce_report["ops"][name]
    trainable = entry["variants"]["trainable"]
    assert entry["flips"], "no flag was tested"
    for flag, flipped in entry["flips"].items():
        pointer = flipped["pointer"]
        assert trainable["stores_by_arg"].get(pointer, 0) > 0, (flag, trainable["stores_by_arg"])
        if name == "poly":
            assert flipped["stores_by_arg"].get(pointer, 0) < trainable["stores_by_arg"][pointer], flag
        else:
            assert flipped["stores_by_arg"].get(pointer, 0) == 0, (flag, flipped["stores_by_arg"])
        assert flipped["st_global"] < trainable["st_global"], flag


@pytest.mark.parametrize("name", list(OPS) + ["gn-short"])
def test_dce_frozen_variant(dce_report, name):
    """The launched frozen variant: fewer global stores and launches, no scratch, no atomics
    anywhere; every variant's registers and spills reported by ptxas."""
    variants = dce_report["ops"][name]["variants"]
    frozen = variants["all frozen" if "all frozen" in variants else "frozen w"]
    trainable = variants["trainable"]
    assert frozen["st_global"] < trainable["st_global"]
    assert frozen["launches"] < trainable["launches"] and frozen["launches"] == 1
    assert frozen["scratch_bytes"] == 0 < trainable["scratch_bytes"]
    assert not {"DWp", "DBp", "Partial"} & set(frozen["stores_by_arg"])
    assert all(v["any_atomics"] == 0 for v in variants.values())
    # ptxas's report (the --dce table's regs and spill): from the ptxas Triton assembles with.
    assert all(isinstance(v["registers"], int) and isinstance(v["spill_bytes"], int) for v in variants.values())
