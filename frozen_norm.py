"""frozen_norm: Triton normalization kernels whose backward skips frozen parameters.

What and why
------------
In LoRA/PEFT fine-tuning the base model's normalization weights are frozen
(``requires_grad=False``). Most norm kernels compute their gradients anyway: a
column reduction over every row, an fp32 scratch buffer of (programs x hidden)
partial sums and a final sum, all thrown away. This module holds Triton forward
and backward kernels for RMSNorm, FusedAddRMSNorm, LayerNorm, GroupNorm and
PolyNorm whose backward does only the work autograd asks for. Nothing changes
for the user: frozen parameters just get cheaper.

What you will learn by reading it
---------------------------------
* How ``ctx.needs_input_grad`` becomes ``tl.constexpr`` flags (COMPUTE_DX,
  COMPUTE_DW, COMPUTE_DB) so Triton compiles a kernel variant in which the
  dead code (loads, FLOPs, registers, stores) does not exist at all.
* How to derive each norm's backward, and which of its terms a frozen weight
  removes.
* A deterministic weight-gradient reduction without atomics: per-program fp32
  partial sums in registers, then a small fixed-order sum (a tall partial
  folded in bands first).
* How a tile's shape steers Triton's layout: rows loaded as lines of what
  one warp reads, or narrower ones that put several short rows in a warp,
  so that a row's reductions never leave its warp (`_segment_tile`,
  `_row_segment`, PolyNorm); and why the forwards store their row
  statistics before y (a layout change through shared memory is a wait).
* A persistent grid whose loop over tiles Triton software-pipelines
  (``tl.range(..., num_stages=...)``: the next tiles' loads are in flight,
  through shared memory, while the current tile is reduced); and how the
  order of independent work sets register pressure: a row's dw added before
  its reductions lets x and dy die there (the piped rows), a select that no
  sum needs can be what makes a kernel spill (`_load_dy_xhat_g`), and
  narrower vector loads can let the empty end of a tile fold away at compile
  time (`PIPED_VEC_ELEMENTS`, `NARROW_VEC_ELEMENTS`).
* How registers per thread decide programs per SM, and how a register cap
  (``maxnreg``) buys one more where ptxas does not spill under it
  (`_forward_register_cap`, `LONG_BWD_MAX_REGISTERS`); and why the reports
  to read are those of the Triton (ptxas) you run: the same code can take
  64 registers under one and 78 under another (the tile forward's xhat),
  and one plan can be the fastest under one version and spill under the
  other (`PIPED_ALL_TRITON` and `CUDA13_PTXAS_TRITON`, the module's two
  plans keyed on a version).
* What Triton knows of alignment: its launcher marks integer arguments
  divisible by 16 and no others, so a row of 4104 bf16 elements would load
  one element a lane; `_aligned` declares a smaller power of two (ALIGN)
  with one integer division and multiply that the compiler can read. And
  rows that no vector fits (an odd length): each read from the 16-byte
  boundary below it, its masks or-ed with compile-time bounds so that the
  chunks inside a row keep none, w from copies shifted as far, and the
  few lanes left at its ends stored one by one (SKEW, `_row_skew`); the
  forwards and untrained backwards of such rows (and some trained ones)
  leave the tiles, whose rows lie each at another skew, for a row a program
  (SKEW_TILE_ROW_MIN), and the trained tiles give each program rows SKEW
  apart, which lie alike, so that its dw and db sums keep one frame of
  lanes (and so do some shorter rows' tiles, and the dw/db kernel of long
  rows).
* Rows too long for registers: two passes over chunks, the first summing per
  lane (no barrier in the loop) and hinting L2 to keep what it reads, the
  second running backwards so it re-reads that from L2; the row length as a
  compile-time constant, as torch.compile's generated kernels do; a pass of
  few chunks, or the backward's first pass alone, unrolled on request
  (``tl.range(..., loop_unroll_factor=...)``, UNROLL and UNROLL_SUMS), not
  left to LLVM, whose choice changed between Triton versions;
  and several row sums reduced as one tuple (`tl.reduce` with `_add2`), one
  exchange between warps, where a program is alone on its SM (JOINT). And,
  trained, rows too long for L2 too: the row sums first, then dx beside the
  dw and db sums, by blocks of columns (COLUMNS_DX_ROW_BYTES).
* Filling the GPU when a tensor has fewer rows than SMs (GroupNorm, small
  batches): each row split over programs, by channels and by pieces of
  them, in two launches, the partial moments merged by Chan's formula, and
  the second, elementwise launch cut into as many runs as fill the SMs.
  And the opposite, rows of a few hundred elements: several whole rows a
  program, in a 3-D tile whose middle axis is the channel. And a per-channel
  w where a channel may start inside a vector (odd HW): two loads per group
  of 8 elements and a select per element, not a load per element
  (`_spans_channels`).
* Two kernels side by side on two CUDA streams, so that one finds in L2 what
  the other read (the dw/db kernel of long rows beside their dx kernel), and
  why that pays only where they start together: in a CUDA graph.
* How torch.compile can take such a module into one graph: each host-side
  launcher registered as a torch custom op, with a fake (section 9).
* How to compile a kernel for an NVIDIA GPU on a machine without one and look
  at what the compiler removed (section 11).

Contents (the section banners below)
------------------------------------
 1. Notation
 2. Tuning constants, launch helpers and input checks
 3. Shared Triton helpers: tile addressing, statistics merge, partial sums
 4. RMSNorm            (introduces the row kernels shared by 5, 6 and 7)
 5. FusedAddRMSNorm    (delta: the residual add, a second output)
 6. LayerNorm          (delta: centring and a bias)
 7. GroupNorm          (short rows: tiles of rows; many rows: the long-row kernels, w per
                       channel; else own kernels)
 8. PolyNorm           (own kernels: three statistics per row)
 9. torch.compile: the launchers as custom ops
10. Swapping modules in place: replace_norms
11. Seeing the dead code go: compiling for a GPU without one

Tested with torch 2.11 and Triton 3.6, 3.8 or 3.9 (NVIDIA H200, compiled) and
torch 2.14 / Triton 3.8 and 2.15 / Triton 3.9 (CPU, through Triton's interpreter).
NOTES.md has the figures.

Vendoring
---------
Copy this one file into your code base. It imports only torch, triton and the
standard library. Importing it compiles no kernel and reads or sets no
environment variable; what it does is register six custom ops with
torch.library, in a namespace named after the module (section 9).
To run it on a CPU (slowly, for tests), set ``TRITON_INTERPRET=1`` before the
first ``import triton``.
"""

import functools
import math
import numbers
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

__all__ = [
    "rms_norm", "fused_add_rms_norm", "layer_norm", "group_norm", "poly_norm",
    "RMSNorm", "FusedAddRMSNorm", "LayerNorm", "GroupNorm", "PolyNorm",
    "replace_norms",
    "rms_norm_forward", "rms_norm_backward",
    "fused_add_rms_norm_forward", "fused_add_rms_norm_backward",
    "layer_norm_forward", "layer_norm_backward",
    "group_norm_forward", "group_norm_backward",
    "poly_norm_forward", "poly_norm_backward",
    "compile_for_gpu",
]

# =============================================================================
# 1. Notation
# =============================================================================
#
#   x      input, viewed as M rows of N elements (the normalized dims last)
#   M, N   rows and row length; for GroupNorm a "row" is one (sample, group)
#   w, b   weight and bias (gamma and beta), N elements (GroupNorm: C)
#   o      the weight offset: the scale is (o + w); o = 1 gives Gemma's (1 + w)
#   mean   row mean (LayerNorm, GroupNorm only)
#   rstd   1 / sqrt(var + eps), one fp32 number per row
#   xhat   normalized input: (x - mean) * rstd, or x * rstd for RMSNorm
#   xc     the centred input x - mean (x for RMSNorm), so xhat = xc * rstd
#   y      output: xhat * (o + w) + b
#   dy     gradient of the loss with respect to y
#   g      dy * (o + w): the gradient arriving at xhat ("wdy")
#   c1, c2 the row means mean(xhat * g) and mean(g) that every dx needs
#   dx, dw, db   gradients of x, w, b
#   r, s   FusedAddRMSNorm: residual r and the sum s = x + r it returns
#   B, C, G, HW  GroupNorm: batch, channels, groups, spatial elements; Cg = C/G
#   P      number of programs (kernel instances) of a launch
#
# Kernel arguments are capitalised when they are pointers (X, DY, W, Rstd...),
# lower case when they are numbers (M, N, eps, stride_x...), upper case again
# when they are compile-time constants (BLOCK_N, COMPUTE_DW; OFFSET is o, a
# compile-time constant in every row kernel: see `_load_scale`).


# =============================================================================
# 2. Tuning constants, launch helpers and input checks
# =============================================================================
#
# Every tuning number lives here, named, with what it sets and why. NOTES.md
# has the evidence: section 8 each constant's full story (what else was tried,
# and where it measured slower), sections 2 and 6 the measurements (ptxas
# register reports, kernel-time sweeps on an H200). TILE_ELEMENTS and the
# partial-sum tile are first choices; the others come from such sweeps.

# --- Tiles of whole rows (N <= ROW_BLOCK_MAX) --------------------------------

# Longest row a program holds in registers, in one tile: the backward holds it
# beside its dw/db accumulators, and ptxas spills from 16384 (LayerNorm, 16
# warps). Longer rows take the long-row kernels (LONG_* below).
ROW_BLOCK_MAX = 8192
# Shorter rows are batched into tiles of at least this many elements, so that
# each program moves enough bytes to amortise its launch and its reductions.
TILE_ELEMENTS = 4096
# The backward's tiles (the row norms' and PolyNorm's): half the forward's,
# so that rows of 2048 and less make 4-warp programs, four to an SM.
LOOP_TILE_ELEMENTS = 2048
# Elements of each tensor a thread holds, which sets a program's warps: 32
# where a program reads one tile and exits (four 16-byte bf16 loads a tensor
# in flight); 16 in the backward, whose programs loop over the tiles of a
# persistent grid and keep registers for the dw/db accumulators. GroupNorm's
# rows of one tile, a row a program, size their warps by them too
# (`_group_long_rows`).
ELEMENTS_PER_THREAD = 32
LOOP_ELEMENTS_PER_THREAD = 16
# The row norms' forward tiles that one row fills whole (rows of exactly
# ROW_BLOCK_MAX, and RMSNorm's and LayerNorm's fp32 ones of TILE_ELEMENTS;
# neither in narrow vectors nor skewed) take this many a thread: 16 and 8
# warps, not 8 and 4, twice the loads of a row in flight. FusedAdd's rows of
# 4096, which read x and the residual, gained nothing, LayerNorm's 16-bit
# ones lost on the H200; padded tiles and tiles of several rows measured
# slower on more warps (NOTES.md, section 6).
FULL_TILE_ELEMENTS_PER_THREAD = 16

# --- Long rows (N > ROW_BLOCK_MAX): a program per row, two passes ------------

# A program walks its row twice in chunks, the second time from L2: a quarter
# row (LONG_MIN_CHUNKS) rounded up to a power of two, at most LONG_CHUNK_MAX
# elements, LONG_ELEMENTS_PER_THREAD a thread (32 warps at 8192), halved once
# where that pads the row less (20480 = 5 x 4096, not 3 x 8192 with the last
# half empty). Rows on this plan because they fill a tile poorly (below) halve
# while that pads less, down to LONG_CHUNK_MIN (LayerNorm's 4608 = 9 x 512).
# The backwards with several row sums take six chunks of 4096, not three of
# 8192, on 16-bit rows of 20481 to 24576 (`_min_chunks`): two 16-warp
# programs per SM under LONG_BWD_MAX_REGISTERS, not one of 32.
LONG_CHUNK_MAX = 8192
LONG_CHUNK_MIN = 512
LONG_MIN_CHUNKS = 4
LONG_ELEMENTS_PER_THREAD = 8
# The forwards with several row sums and the long-row backwards of RMSNorm,
# LayerNorm and PolyNorm halve the chunks of 16-bit rows further, down to
# LONG_CHUNK_MIN, where that makes at most this many whole ones: 18432 = 9 x
# 2048, not 5 x 4096 with the last half empty. Not where UNROLL unrolls the
# partial last chunk (below): 9216 stays 4.5 x 2048, not 9 x 1024 in a loop.
WHOLE_MAX_CHUNKS = 9
# Chunks of up to this many elements (16 a thread on MAX_WARPS) for 16-bit rows
# they fit whole (49152 = 3 x 16384), in the long-row forwards with one row sum
# and the backwards with several: twice the bytes in flight, where one or two
# programs per row hold an SM.
LONG_WIDE_CHUNK_MAX = 16384
# The passes of a long-row kernel over chunks of at most UNROLL_MAX_BLOCK_N
# elements (8 warps) are unrolled whole (UNROLL, `_unrolled`), so that
# each issues all its chunks' loads before their arithmetic, where there are
# at most UNROLL_MAX_CHUNKS chunks or the last one is partial: the padded
# rows' plans (5376 = 3 x 2048, 4352 = 8.5 x 512). Triton 3.6's LLVM unrolled
# loops of about three chunks unasked, Triton 3.8's none. More whole chunks,
# and wider ones (16 and 32 warps), measured mixed unrolled (NOTES.md,
# section 6).
UNROLL_MAX_CHUNKS = 8
UNROLL_MAX_BLOCK_N = 2048
# The long-row kernels with one row sum on 16-bit rows (RMSNorm's forward,
# its and FusedAdd's dx backward on rows in 16-byte vectors), and the
# forwards of fp32 rows, keep chunks of 4096 where halving them would make
# more than HALVED_MAX_CHUNKS chunks of UNROLL_MAX_BLOCK_N (rows of 12289 to
# 14336, `_unhalved_chunks`): unrolled, seven such chunks take more registers
# a thread than four of 4096 (ptxas), so fewer warps per SM (the backward:
# three 8-warp programs under LONG_BWD_8_WARP_MAX_REGISTERS, not two of 16
# warps), and measured slower. LayerNorm's and PolyNorm's 16-bit rows
# measured mixed so, and the trained dx launch on rows not in vectors slower:
# they keep the halving, as do the backwards of fp32 rows (not measured;
# NOTES.md, section 2).
HALVED_MAX_CHUNKS = 6
# The long-row backward's pass 1 (its row sums) alone is unrolled whole where a
# row has at most UNROLL_SUMS_MAX_CHUNKS chunks of up to LONG_CHUNK_MAX
# (UNROLL_SUMS, `_unrolled_sums`: rows of up to 16384 in chunks of 4096, and
# 24576 and 32768 in chunks of 8192), so that its loads all issue before the
# sums, as Triton 3.6's LLVM did unasked in RMSNorm's rows of 16384 but not in
# LayerNorm's, and Triton 3.8's in neither. Both passes unrolled, and chunks
# of LONG_WIDE_CHUNK_MAX, measured slower; five to eight chunks mixed
# (NOTES.md, section 6).
UNROLL_SUMS_MAX_CHUNKS = 4

# --- Padded rows: rows that fill their power-of-two tile poorly --------------

# A row that fills at most PADDED_ROW_FILL of its tile (5120 of 8192) leaves
# the rest of every thread's lanes masked. Longer than PADDED_ROW_MIN, it takes
# the long-row plan instead, whose chunks fit it closely (5120 = 5 x 1024): in
# the forwards (not FusedAdd's, RESIDUAL_ROW_BLOCK_MAX, nor 16-bit rows that
# NARROW_VEC_ELEMENTS fits), the row norms' backwards without dw/db and
# PolyNorm's backward. A trained row-norm backward keeps the tile, whose
# registers hold dw and db.
PADDED_ROW_FILL = 0.75
PADDED_ROW_MIN = 2048
# Shorter padded rows stay in a tile, but in PolyNorm's kernels and RMSNorm's
# frozen backward, which take the long-row plan from this length on: chunks of
# 256 on one warp (rows up to 1024; PolyNorm's up to POLY_WARP_ROW_MAX), whose
# row sums need no barrier.
PADDED_SHORT_ROW_MIN = 512
# Triton spreads a tile's columns over its warps, so padding idles whole warps
# (a row of 576 in a 4-warp tile 1024 wide leaves one warp nothing to load).
# LayerNorm's forward and frozen backward run padded tiles on PADDED_TILE_WARPS
# warps, and on one warp (half the rows) up to PADDED_WARP_ROW_MAX columns,
# where a row's sums stay in its warp.
PADDED_TILE_WARPS = 2
PADDED_WARP_ROW_MAX = 1024
# RMSNorm's and FusedAdd's kernels (one row sum) halve the chunks of padded
# 16-bit rows down to this length only: 4 warps of 16-byte loads, not 8-byte
# ones.
RMS_PADDED_CHUNK_MIN = 1024
# RMSNorm's and LayerNorm's forwards keep 16-bit rows of PADDED_ROW_MIN to
# ROW_BLOCK_MAX in one tile, N a compile-time constant, where 16-byte vectors
# would leave a thread's last repeat of lanes partial (`_narrow_forward`): in
# the widest of these vectors (elements) that cuts the row into whole repeats
# (4: 2560, 5120, 7168), else the narrowest (4608), so that the lanes past N
# fold away at compile time (`_narrow_vec`). LayerNorm's rows wherever so,
# RMSNorm's padded ones only. Padded 16-bit rows of PADDED_ROW_MIN and less
# take the same vectors and N_CONST where their tile is at least one repeat of
# 16-byte vectors wide (`_short_narrow_vec`): LayerNorm's forward (its
# PADDED_TILE_WARPS tiles: 576 = 9 repeats of 64 on one warp) and the row
# norms' frozen tile backwards (LayerNorm's; FusedAdd's with ds, whose 4-warp
# tiles qualify past 512); not the trained ones, whose accumulators N_CONST
# reorders (measured mixed).
NARROW_VEC_ELEMENTS = (4, 2)
# Register caps on LayerNorm's 16-bit tile forward where one more program per
# SM fits without a spill and measured faster (`_forward_register_cap`): tiles
# FWD_SHORT_BLOCK_N wide on MIN_WARPS warps (rows of 385 to 512), 56 registers
# for 64 (nine programs per SM, not eight), and tiles of ROW_BLOCK_MAX in
# 4-element vectors up to FWD_NARROW_ROW_MAX (so 5120), 40 for 48 (six, not
# five). ptxas of Triton 3.6; Triton 3.8's spills 16 bytes under the first.
FWD_SHORT_BLOCK_N = 512
FWD_SHORT_MAX_REGISTERS = 56
FWD_NARROW_ROW_MAX = 6144
FWD_NARROW_MAX_REGISTERS = 40

# --- The long-row backward: registers, reductions, pre-sums ------------------

# Registers a thread of the long-row backward may use (ptxas's .maxnreg): 64,
# so that its programs make 1024 threads per SM (one of 32 warps, two of 16);
# uncapped, ptxas took 41 to 103, and spilled at 65536. Kernels that spill
# under it take LONG_BWD_SPILL_MAX_REGISTERS, on chunks of at most 16 warps
# (REGISTERS_PER_SM): RMSNorm's and FusedAdd's per-lane sums on 16-bit rows of
# at least LONG_BWD_SPILL_CHUNKS whole chunks of 1024 or more, RMSNorm's
# pre-summed rows and the row norms' fp32 rows. RMSNorm's frozen backward of
# 16-bit rows up to LONG_BWD_PRESUM_AFTER halves its chunks down to
# LONG_BWD_SPILL_CHUNK_MIN where that makes them whole (9216 = 9 x 1024).
# The per-lane rows of whole chunks on 8 warps (10240 = 5 x 2048) take
# LONG_BWD_8_WARP_MAX_REGISTERS instead: three programs per SM, not two, and
# ptxas spills nothing there (4-warp chunks under 96, five programs, and fp32
# rows under 80 measured slower). So do the 16-bit rows on 8 warps whose
# passes are unrolled over at least LONG_BWD_8_WARP_MIN_CHUNKS chunks
# (LayerNorm's and PolyNorm's of 12289 to 14336; those with one sum keep
# chunks of 4096 there, HALVED_MAX_CHUNKS), which ptxas spills under 64; with
# fewer chunks it does not, and four programs per SM measured faster than three.
LONG_BWD_MAX_REGISTERS = 64
LONG_BWD_SPILL_CHUNKS = 5
LONG_BWD_SPILL_MAX_REGISTERS = 128
LONG_BWD_SPILL_CHUNK_MIN = 1024
LONG_BWD_8_WARP_MAX_REGISTERS = 80
LONG_BWD_8_WARP_MIN_CHUNKS = 7
# From this Triton (major, minor) on, sm_90 is assembled by the CUDA 13 ptxas
# of Triton's wheel, which spills RMSNorm's and FusedAdd's long-row dx kernel
# on 16-bit rows whose loads vectorize (`vec16` in `_row_norm_backward`; not
# the others) where the CUDA 12 one did not: on 4 and 8 warps under
# LONG_BWD_MAX_REGISTERS in LONG_BWD_SPILL_CHUNKS unrolled chunks (rows of
# 4097 to 5119 and 8193 to 10239). From it on those chunks take
# CUDA13_MAX_REGISTERS, which they fit without a spill (six and three
# programs per SM, not eight and four). RMSNorm's frozen rows of whole chunks
# under LONG_BWD_8_WARP_MAX_REGISTERS (10240 = 5 x 2048) take
# LONG_BWD_SPILL_MAX_REGISTERS (two programs per SM, not three), which
# measured faster; FusedAdd's keep it (128 measured slower: `_ptxas_cap`;
# NOTES.md, 5.5). RMSNorm's 4-warp chunks among them (4097 to 5119) take
# CUDA13_MAX_REGISTERS from PIPED_ALL_TRITON on: Triton 3.8's CUDA 12.9
# ptxas already spills them 16 to 32 bytes under LONG_BWD_MAX_REGISTERS.
# FusedAdd's keep 64 under 3.8: raised, they measured no faster.
CUDA13_PTXAS_TRITON = (3, 9)
CUDA13_MAX_REGISTERS = 80
# JOINT (a kernel flag). The long-row backwards with several row sums
# (LayerNorm's and GroupNorm's two, PolyNorm's three or four) reduce them
# across warps as one tuple, one exchange through shared memory instead of one
# a sum, where a program holds all of its SM's registers (`_holds_sm`): no
# other program's work hides its barriers there (where two share an SM it
# measured mixed). The trained LayerNorm tile backward pairs its c1 and c2 so
# where its persistent grid runs one program per SM, and the frozen one on
# tiles of ROW_BLOCK_MAX (16 warps, two programs per SM): there Triton 3.8's
# code with a sum each issues one of its six vector loads behind the
# arithmetic, so each thread waits on memory twice (NOTES.md, section 5.7).
#
# Pass 1 of a long-row kernel may first add each thread's LONG_PRESUM
# consecutive elements of a chunk, in registers, keeping one float per sum and
# thread instead of 8: fewer registers under a cap. The backwards with several
# sums always do, RMSNorm's past LONG_BWD_PRESUM_AFTER; the forwards with
# several sums past LONG_FWD_PRESUM_AFTER (at 65536, two 32-warp programs per
# SM instead of one). GroupNorm's rows there pre-sum in groups of one channel
# or two, forward and backward, each group loading its channels' w and b once
# (`_group_long_presum`, GROUP_ONE_CHANNEL_PRESUM_MIN).
LONG_PRESUM = LONG_ELEMENTS_PER_THREAD
LONG_BWD_PRESUM_AFTER = 16384
LONG_FWD_PRESUM_AFTER = 24576

# Rows of an odd length or stride start anywhere against a 16-byte vector,
# so no vector fits every row and Triton loads them one element a lane. The
# row norms' long-row kernels read each such row from the vector boundary
# below it instead, in whole vectors, skew < SKEW lanes early (SKEW,
# `_row_skew`): lanes outside the row are masked out of sums, stores write
# the whole vectors inside it, and the at most 2 (SKEW - 1) lanes at its
# ends go one by one after pass 2; w and b come from SKEW copies shifted by
# 0 .. SKEW - 1 lanes (`_skewed_copies`, skew times their bytes: the frozen
# backward's one allocation besides dx). Loading w one element a lane
# instead costs a layout change through shared memory each chunk, and
# spilled 1072 to 1256 bytes a thread (ptxas, Triton 3.6).
# Such rows that a tile would hold take the long-row kernels too, in the
# forwards and in the backwards that train nothing (`_row_tiling`'s
# `skewed`): a program a row in vectors against a tile of rows one element
# a lane. From SKEW_TILE_ROW_MIN elements on; FusedAdd's later, its tiles
# measured faster on shorter odd rows (NOTES.md, section 6): its forward's
# from SKEW_RESIDUAL_FWD_ROW_MIN, its backward's with ds from
# SKEW_RESIDUAL_BWD_ROW_MIN. The trained backward mostly keeps its tiles (a
# row a program leaves dw and db to a kernel reading x and dy again) and
# reads them skewed there: rows SKEW apart lie alike against a vector, so
# each program takes the rows of one residue class and its accumulators
# keep one frame of lanes (`_row_norm_bwd_kernel`'s SKEW). But where such
# tiles measured slower than that second read (NOTES.md, section 2), its
# rows take a row a program too (`_skewed_trained_row_each`). In 16-bit
# dtypes: every op's without dx from SKEW_TRAINED_NODX_ROW_MIN elements on
# (then the dw/db kernel alone, one read of x and dy; shorter rows, not
# measured, keep their tiles), and with dx LayerNorm's whose row and the
# lanes before it span more than SKEW_TRAINED_TILE_BLOCK_MAX lanes (its
# skewed tiles lose from there on; RMSNorm's and FusedAdd's win, capped at
# TILE_BWD_MAX_REGISTERS). In fp32, only LayerNorm's past
# SKEW_TRAINED_FP32_TILE_BLOCK_MAX lanes. The shorter rows' untrained
# tiles read them skewed too, a class of rows a tile, where that measured
# faster than one element a lane (NOTES.md, section 6), in tiles of
# SKEW_TILE_BLOCK_MIN lanes or more (narrower ones measured slower; our guess:
# rows SKEW apart, of a few dozen bytes each, scatter a tile's loads over many
# DRAM bursts): the forwards of FusedAdd's rows from
# SKEW_RESIDUAL_TILE_FWD_ROW_MIN on and of RMSNorm's whose own tile has room
# for the lanes before the row too, and the frozen backwards of both where the
# row and those lanes do not leave the tile padded (PADDED_ROW_FILL).
# LayerNorm's measured slower or faster by the row length, with no rule we
# found: one element a lane.
SKEW_TILE_ROW_MIN = 512
SKEW_RESIDUAL_FWD_ROW_MIN = 4096
SKEW_RESIDUAL_BWD_ROW_MIN = 1024
SKEW_RESIDUAL_TILE_FWD_ROW_MIN = 384
SKEW_TILE_BLOCK_MIN = 128
SKEW_TRAINED_TILE_BLOCK_MAX = 256
SKEW_TRAINED_FP32_TILE_BLOCK_MAX = 4096
SKEW_TRAINED_NODX_ROW_MIN = 128

# --- Trained backward of rows past ROW_BLOCK_MAX -----------------------------

# With one trained parameter (RMSNorm's and FusedAdd's w, LayerNorm's w or b
# alone) and 16-bit x and dy, rows up to RELOAD_ROW_BLOCK_MAX stay in the tile
# kernel, a row per tile at RELOAD_ELEMENTS_PER_THREAD (16 warps at 16384),
# whose registers hold dw: the long-row plan's dw/db kernel would read x and
# dy from DRAM again. Rows that are not piped (below) would spill holding x
# and dy through the row sums, so they load them a second time, from L1/L2,
# without a pipeline (RELOAD); LayerNorm's with dw, which still spills
# holding w, loads w per tile (W_PER_TILE).
RELOAD_ROW_BLOCK_MAX = 16384
RELOAD_ELEMENTS_PER_THREAD = 32
# Piped rows run the same tile kernel through its software pipeline, with dw
# or db added *before* the row sums, so that x and dy die there, and N a
# compile-time constant (N_CONST), so that the tile's empty end folds away.
# Which rows: every one from PIPED_ALL_TRITON on; before it, those up to
# PIPED_ROW_MAX, at RELOAD_ROW_BLOCK_MAX, in narrow vectors (below), and past
# PIPED_ROW_MAX FusedAdd's with ds and LayerNorm's with db, whose RELOAD
# spills more than their pipe does (Triton 3.6: 56 and 184 bytes, against 0
# and 128): RMSNorm's and LayerNorm's rows that train w take RELOAD there.
# Past PIPED_ROW_MAX w is loaded per row (held, it spills; at
# RELOAD_ROW_BLOCK_MAX, whose full tile has no masked lane to zero, no
# variant spills without that select); up to it, where its buffers fit at
# full depth too (but up to W_HELD_ROW_MAX, below), else held. Whole tiles
# and RELOAD add dw and db after dx, which measured faster for them.
PIPED_ROW_MAX = 12288
# From this Triton (major, minor) on, every one-parameter row is piped, in
# 16-byte vectors: its code for those loops fits in 128 registers without a
# spill (past PIPED_ROW_MAX with w loaded per row: held, RMSNorm's and
# FusedAdd's spill 104 and 128 bytes there), where Triton 3.6's spills 24 to
# 184 bytes and its narrow vectors and RELOAD measured faster (NOTES.md,
# section 6).
PIPED_ALL_TRITON = (3, 8)
# From PIPED_ALL_TRITON on, piped rows up to this length hold w (32 fp32
# registers a thread) whatever their pipeline's depth: faster than loading it
# per row there, slower past it (RMSNorm's rows of 9984 and 10240 at 8192
# rows and more; NOTES.md, section 6). Before it, Triton 3.6's code spills
# holding w on rows not in narrow vectors (below).
W_HELD_ROW_MAX = 9728
# Before PIPED_ALL_TRITON, piped rows load vectors of PIPED_VEC_ELEMENTS (8
# bytes of a 16-bit row), with w held, where the row ends in the first half
# of a 4096 (`_narrow_vectors`: RMSNorm's and FusedAdd's 8704 to 10240, and
# 14336): a thread's lanes then repeat every 2048 elements, and the empty
# half folds away instead of staying masked.
PIPED_VEC_ELEMENTS = 4
# FusedAdd's forward holds rows up to this length in one tile (32 warps, no
# spill): the long-row kernel's pass 2 would read back the s its pass 1 wrote.
RESIDUAL_ROW_BLOCK_MAX = 32768

# --- PolyNorm ----------------------------------------------------------------

# PolyNorm's forward keeps whole rows in a tile up to POLY_FWD_ROW_BLOCK_MAX
# (longer ones take the long-row plan); its backward with dw or db up to
# POLY_ROW_BLOCK_MAX, since its dw sums are scalars, not an N-wide accumulator
# (longer ones: `_long_poly_norm_bwd_kernel`). Without dw and db, 16-bit rows
# take the long-row plan past ROW_BLOCK_MAX, as the row norms' do: a tile of
# 16384 is one 16-warp program per SM (fp32 rows of 12800 to 14336 measured
# slower so). Rows past ROW_BLOCK_MAX that fill the tile poorly (trained, or
# fp32) halve their chunks down to UNROLL_MAX_BLOCK_N only, whose partial
# last chunk UNROLL unrolls (9216 = 4.5 x 2048, not 9 x 1024 in a loop).
POLY_FWD_ROW_BLOCK_MAX = 1024
POLY_ROW_BLOCK_MAX = 16384
# 16-bit rows up to this length on PolyNorm's long-row plan, but powers of two
# (which 4-warp chunks of 512 fit), walk chunks of one warp (32 x
# LONG_ELEMENTS_PER_THREAD = 256 elements): a row's sums stay in its warp, no
# barrier, and a partial last chunk is a block of its own (`_tail_block`).
POLY_WARP_ROW_MAX = 2304
# Bytes one warp loads side by side: 32 lanes of a 16-byte vector. Triton lays
# a tile's row longer than that across warps, and every row sum then crosses
# them through shared memory. PolyNorm's tile kernels, with three or four sums
# a row, load lines of this many bytes instead (`_segment_tile`), a row in one
# warp, where a tile holds at least as many rows as warps.
WARP_LOAD_BYTES = 32 * 16
# Shorter lines put several in a warp (32 x vec / SEG of them, vec: the
# elements of a lane's vector; `_segment_tile`), so that a row's sums take
# fewer shuffle steps and each step serves several rows. The forward's lines,
# and the backward's of padded rows (PADDED_ROW_FILL; rows that fill their
# tile measured slower so), are halved down to 64 bytes (two whole 32-byte
# sectors of a warp's load), while the tile's rows keep all their lines in
# one warp (`_row_segment`).
LINE_MIN_BYTES = 64
# Registers a thread of the row norms' persistent tile backward may use,
# where its rows are skewed (odd rows, SKEW) or fp32: REGISTERS_PER_SM /
# THREADS_PER_SM, so that the programs the grid plans run side by side.
# Uncapped, ptxas gave those tiles up to 194: three or two programs an SM
# where the grid plans four, the rest a second wave once those are done.
# Other tiles stay uncapped: they take fewer, and a cap above what a kernel
# needs still changes ptxas's allocation (it spends the budget).
TILE_BWD_MAX_REGISTERS = 128
# Registers a thread of PolyNorm's tile backward may use: 128, so that
# THREADS_PER_SM threads fit an SM and the programs the persistent grid plans
# run side by side (uncapped, ptxas of Triton 3.6 gave 140: three programs
# where the grid plans four).
POLY_BWD_MAX_REGISTERS = 128
# PolyNorm's backward on tiles of at least this many rows keeps its dw and db
# sums per tile row through its loop and sums across rows once, after it, as
# the row norms keep their accumulators: a sum across a tile's rows crosses
# warps. Tiles of fewer rows sum per tile, which measured faster there.
POLY_ROW_ACCUMULATOR_ROWS = 4
# PolyNorm's backward of 16-bit padded rows whose last chunk of 4096 is
# partial (10241 to 12287; frozen, 14337 to 16383 too: its long-row plan
# above) walks chunks of UNROLL_MAX_BLOCK_N instead, six to eight, unrolled
# (UNROLL: a partial last chunk), not three or four that stay a loop (fp32
# rows measured slower so). Its frozen backward of 16-bit rows of more than
# UNROLL_MAX_CHUNKS whole chunks walks chunks twice as long, the last one
# partial and unrolled (4608 = 4.5 x 1024, not 9 x 512; trained, that
# measured slower under Triton 3.6). Both `_poly_unrolled_chunks`; no
# constant of their own.

# --- Programs, warps and pipelines -------------------------------------------

# Warps per program: at least 4 to keep a tile's loads wide (padded tiles and
# short chunks take fewer: PADDED_TILE_WARPS, or one), at most 32 (1024
# threads, the hardware limit).
MIN_WARPS, MAX_WARPS = 4, 32
# Persistent grids aim at this many threads per SM: their programs loop over
# tiles through a software pipeline, so 512 keep memory busy, and at up to 128
# registers each they fit an SM's 64K registers.
THREADS_PER_SM = 512
REGISTERS_PER_SM = 64 * 1024   # sm_80 and sm_90: a program launches only if its threads' registers fit
# Depth of the software pipeline of a persistent program's loop over tiles
# (and of the dw/db, GroupNorm and partial-sum loops): Triton copies the next
# PIPELINE_STAGES - 1 iterations' loads into shared memory (cp.async) while the
# current one computes, so memory stays busy through the reductions.
PIPELINE_STAGES = 3
# A padded tile fills its pipeline buffers 1/2 to 3/4 with bytes that load:
# one stage more keeps as many bytes in flight (the row norms' trained
# backward of padded rows).
PADDED_PIPELINE_STAGES = PIPELINE_STAGES + 1
# The trained backward of RMSNorm's and FusedAdd's 16-bit rows of 4097 to 5120
# (FusedAdd's with ds to 4608, frozen too): a full tile of 4096 and a tail
# tile of this many columns, not a tile of 8192 whose masked lanes issue every
# instruction of a loop bound by instruction issue. On 16 warps that is 2
# elements a thread: a 4-byte copy, the narrowest that cp.async pipelines.
PADDED_TAIL_BLOCK_N = 1024
# LayerNorm's trained backward (dw and db: two accumulators) of 16-bit rows of
# ROW_BLOCK_MAX + 1 to ROW_BLOCK_MAX + this: a tile of ROW_BLOCK_MAX and a
# tail of the rest's power of two (at least PADDED_TAIL_BLOCK_N), w per tile,
# one row per tile on the persistent grid, not the long-row kernels, whose
# dw/db kernel reads x and dy from DRAM again. ptxas (Triton 3.8): no spill
# up to a tail of 2048, 236 bytes at 4096 (3.6: none up to 1024).
TWO_ACC_TAIL_MAX = 2048
# LayerNorm's trained 16-bit rows of exactly this length (GPT-3's hidden size)
# take both accumulators into the one-parameter rows' tile of
# RELOAD_ROW_BLOCK_MAX, piped: on 16 warps the last of each thread's four
# 16-byte vectors lies past N in every thread, so with N_CONST its mask is
# known false, and ptxas's code keeps no select and spills less (Triton 3.8:
# 80 bytes, 3.6: 56; at 11264 88 and 288). That measured faster than the
# long-row kernels; other rows past TWO_ACC_TAIL_MAX (the last vectors
# masked in some threads only, or at RELOAD_ROW_BLOCK_MAX twice the
# accumulators) measured slower in it under Triton 3.6. From PIPED_ALL_TRITON
# on the rows between the tail's and this one take it too: its code spills
# 88 bytes at 10752 and 11264 and measured faster than the long-row kernels
# all the same (NOTES.md, section 6).
TWO_ACC_FOLDED_ROW = 12288
# Shared memory an SM keeps back from the pipeline buffers: the 1 KB per-block
# system reserve and Triton's scratch for cross-warp reductions.
SMEM_RESERVE = 8192

# --- The long rows' dw/db kernel, and the partial sums -----------------------

# The dw/db kernel of long rows, after the dx kernel: each program sums the
# rows of one column block, in [DW_BLOCK_M, DW_BLOCK_N] tiles (a 128-byte bf16
# row segment) on DW_WARPS warps: small programs, several to an SM (ptxas of
# Triton 3.6: 5 with one accumulator, DW_WAVE_PROGRAMS_PER_SM with two). The
# tiles are made flatter (half the rows, twice the columns, down to
# DW_MIN_BLOCK_M rows) until the column blocks fit one wave of that many
# programs per SM, and while a program would take fewer than DW_FLAT_ROW_STEPS
# steps (a loop too short to fill its pipeline), as long as every SM keeps one.
DW_BLOCK_M, DW_BLOCK_N = 64, 64
DW_WARPS = 4
DW_WAVE_PROGRAMS_PER_SM = 3
DW_FLAT_ROW_STEPS = 32
DW_MIN_BLOCK_M = 4
# While a CUDA graph is captured (DW_BESIDE_GRAPH), that kernel runs beside
# the dx kernel instead, on a second stream (`_run_beside`), both walking the
# rows first to last, so that much of what one reads from DRAM the other finds
# in L2. An eager call would launch the second kernel tens of µs after the
# first: on an idle GPU the first is far ahead by then, and the second reads
# from DRAM what it left in L2. That measured slower, so eager calls run it
# after (DW_BESIDE_EAGER, for tests and measurements). Beside, it takes about
# DW_BESIDE_PROGRAMS_PER_SM programs per SM (RMSNorm's, beside the lightest
# dx kernel, DW_BESIDE_RMS_PROGRAMS_PER_SM), each a power-of-two slab of
# columns in tiles of DW_BESIDE_TILE elements, on DW_BESIDE_WARPS warps per
# accumulator, under DW_BESIDE_MAX_REGISTERS. Both ways are deterministic;
# they sum dw and db in different orders.
DW_BESIDE_GRAPH = True
DW_BESIDE_EAGER = False
DW_BESIDE_PROGRAMS_PER_SM = 0.62
DW_BESIDE_RMS_PROGRAMS_PER_SM = 0.5
DW_BESIDE_TILE = 16384
DW_BESIDE_WARPS = 16
DW_BESIDE_MAX_REGISTERS = 64
# Trained rows of more than COLUMNS_DX_ROW_BYTES of x, with dx asked (not
# odd rows): the rows' programs in flight hold more than L2 gives back, so
# the long-row kernel's pass 2 reads x and dy from DRAM again, and the dw/db
# kernel a third time. There the long-row kernel keeps pass 1 alone
# (CONSTANTS_ONLY) and the dw/db kernel writes dx in its own tiles
# (COMPUTE_DX): x and dy read twice, not three times. So also while a CUDA
# graph is captured: such rows never run the dw/db kernel beside. Rows of
# exactly COLUMNS_DX_ROW_BYTES take that path too, but run the dw/db kernel
# beside under a graph, which measured no slower there (NOTES.md, section 8).
COLUMNS_DX_ROW_BYTES = 2**17
# Stand-in SM count when no GPU runs the kernels (Triton's interpreter): small,
# so that tests exercise programs that loop over several tiles.
INTERPRETER_SMS = 3
# The final sum of the partial sums (`_sum_partials_kernel`): PARTIAL_ROWS
# partial rows a step over PARTIAL_COLS columns a program (a 128-byte line of
# fp32 a row), PARTIAL_WARPS warps, a PIPELINE_STAGES-deep pipeline: N / 32
# programs spread a (P, 4096) partial over the SMs. A step keeps PARTIAL_ROWS x
# PARTIAL_COLS elements but follows the partial's shape: fewer rows, wider
# steps; fewer columns (PolyNorm's 4), more rows a step.
PARTIAL_ROWS, PARTIAL_COLS = 64, 32
PARTIAL_WARPS = 4
# A tall, narrow partial makes few programs, each walking many rows (PolyNorm's
# (M, 4) partial of long rows): one of more than PARTIAL_FOLD_ROWS rows is first
# folded, bands of that many rows summed side by side into a row a band.
PARTIAL_FOLD_ROWS = 1024

# --- GroupNorm ---------------------------------------------------------------

# Elements of GroupNorm's (channels x spatial) tile: 8-warp programs, two to
# an SM. GROUP_PROGRAMS_PER_SM is the aim where a batch has fewer (sample,
# group) rows than SMs: each row is then split over programs by channels, and
# by pieces of them where channels run short (`_group_tiling`, `_group_runs`).
GROUP_TILE_ELEMENTS = 4096
GROUP_PROGRAMS_PER_SM = 2
# With dw or db trained, a tile spans at least this many channels: its
# per-channel sums reduce once per tile, 16 times fewer reductions than tiles
# of one channel of 4096 (without dw/db, one channel a tile measured best).
GROUP_SUM_CHANNELS = 16
# GroupNorm's rows take the long-row kernels (forward, and backward with dx)
# when there are at least GROUP_LONG_ROWS_PER_SM rows per SM and a row's Cg *
# HW elements are a multiple of GROUP_LONG_MIN_RUN (the flat row loads in
# vectors of that many or more, `_align`), long rows and short ones that the
# short-row kernels leave them; fewer rows are split over programs by
# GroupNorm's own kernels. Rows that fit a tile go there too: the own
# kernels' [BLOCK_C, BLOCK_HW] tiles mask the lanes past HW in every channel
# (BLOCK_HW is a power of two), the flat row masks only its end.
GROUP_LONG_ROWS_PER_SM = 0.5
GROUP_LONG_MIN_RUN = 2
# Rows whose [pow2(Cg), pow2(HW)] block holds at most GROUP_SHORT_ROW_MAX
# elements take the short-row kernels: whole rows, several a program, in
# [ROWS, BLOCK_C, BLOCK_HW] tiles. A program per row of a few hundred
# elements is mostly overhead; from blocks of 2048 on, the long-row kernels
# measured as fast or faster. But the long-row kernels keep the rows they
# take of at least GROUP_LONG_ROW_MIN elements whose block is poorly filled
# (PADDED_ROW_FILL) or whose HW is no multiple of GROUP_SHORT_MIN_RUN: the
# tile masks most lanes, or loads a channel's positions in vectors of fewer
# than 4 elements, where the flat row masks only its end and loads in vectors
# of its row length's `_align`. Shorter rows are mostly overhead there.
GROUP_SHORT_ROW_MAX = 1024
GROUP_LONG_ROW_MIN = 256
GROUP_SHORT_MIN_RUN = 4
# With w or b trained, that long-row backward's pass 1 forms the per-channel
# sums (`_group_channel_sums`) over tiles of a block of channels and
# 1 / GROUP_SUM_TILES of their positions, reduced once per block.
GROUP_SUM_TILES = 4
# Those tiles hold at most GROUP_SUM_ELEMENTS_PER_THREAD elements a thread,
# and at most half of a row of one chunk: A and D are two fp32 accumulators
# of the tile's size, and at a chunk's 32 a thread (HW odd: x and dy loaded
# an element at a time) ptxas spilled hundreds of bytes under the long-row
# backward's register cap; rows of one chunk of 8 a thread measured faster
# with two steps of half of it (NOTES.md, section 6).
GROUP_SUM_ELEMENTS_PER_THREAD = 8
# Their loop over a block of channels' positions is unrolled whole where it
# takes at most GROUP_SUMS_UNROLL_MAX_STEPS tiles (UNROLL_SUMS of the long-row
# backward; GROUP_SUM_TILES steps unless a quarter of a channel is more than
# a tile), so that all its loads issue before the sums, which Triton 3.8's
# compiler did not do unasked, nor 3.6's at every HW. Loops of 8 steps
# measured faster unrolled too; longer ones are left to the compiler (not
# measured; NOTES.md, section 6).
GROUP_SUMS_UNROLL_MAX_STEPS = 8
# The long-row kernels' groups of LONG_PRESUM elements (`_group_long_presum`)
# may span two channels where HW is no multiple of LONG_PRESUM: w and b are
# then loaded per group, not per element (HW odd). Where groups of
# GROUP_ONE_CHANNEL_PRESUM_MIN or more stay in one channel (HW a multiple of
# 4), they are kept: there spanning measured slower, by a few points.
GROUP_ONE_CHANNEL_PRESUM_MIN = 4
# With w or b trained, that backward also halves the chunks of 16-bit rows of
# fewer than GROUP_TRAINED_MIN_CHUNKS chunks of LONG_CHUNK_MAX whose channels
# have at least GROUP_TRAINED_MIN_HW positions: LONG_MIN_CHUNKS' rule carried
# further (40960 = 10 x 4096: two 16-warp programs per SM, not 5 x 8192 on
# one of 32).
GROUP_TRAINED_MIN_CHUNKS = 6
GROUP_TRAINED_MIN_HW = 2048

# --- Every launch -------------------------------------------------------------

# a * b + c compiled as one fused multiply-add (one rounding, one instruction):
# the code every kernel here was written, tested and tuned with. Triton fuses
# by default through 3.9, but 3.9 warns when a launch leaves it unset (its
# default turns fusion off from 3.10), so every launch, and `compile_for_gpu`,
# asks for it.
FP_FUSION = True

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (major, minor), which the planner compares with PIPED_ALL_TRITON and CUDA13_PTXAS_TRITON.
_TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _num_sms_of(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (cached: the query is slow)."""
    if device.type == "cuda":
        return _num_sms_of(_device_index(device))
    return INTERPRETER_SMS


@functools.lru_cache(maxsize=None)
def _smem_per_sm_of(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).shared_memory_per_multiprocessor


def _pipeline_stages(bytes_per_iteration: int, programs_per_sm: int, device: torch.device,
                     depth: int = PIPELINE_STAGES, exact: bool = False) -> int:
    """Pipeline depth for a loop loading `bytes_per_iteration`: `depth`, or
    less such that the shared-memory buffers of `programs_per_sm` programs fit
    in an SM. Triton allocates depth - 1 buffers; the budget counts depth, for
    headroom, or with `exact` depth - 1 (the piped rows' buffers, a row each)."""
    if device.type != "cuda":
        return depth
    budget = _smem_per_sm_of(_device_index(device)) // programs_per_sm - SMEM_RESERVE
    fit = budget // bytes_per_iteration   # buffers that fit
    return max(1, min(depth, fit + 1 if exact else fit))


def _warps_for(elements: int, elements_per_thread: int) -> int:
    return max(MIN_WARPS, min(MAX_WARPS, elements // (32 * elements_per_thread)))


def _programs_per_sm(num_warps: int) -> int:
    """Programs of `num_warps` warps that make up THREADS_PER_SM threads (at least 1)."""
    return max(1, THREADS_PER_SM // (32 * num_warps))


def _holds_sm(num_warps: int, max_registers: int) -> bool:
    """Whether a program of `num_warps` warps, `max_registers` a thread, takes all of an SM's registers."""
    return 32 * num_warps * max_registers >= REGISTERS_PER_SM


def _element_bytes(*tensors) -> int:
    """Bytes a loop loads per element index: one element of each tensor given (None skipped)."""
    return sum(t.element_size() for t in tensors if t is not None)


def _pow2(n: int) -> int:
    """Smallest power of two >= n (triton.next_power_of_2, without its call overhead)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _fills_poorly(N: int, block_n: int, fill: float) -> bool:
    """Whether a row of N elements fills at most `fill` (PADDED_ROW_FILL) of
    its tile of block_n columns: a padded row."""
    return N <= fill * block_n


def _lane_repeat(t: "_RowTiling", vec: int) -> int:
    """Elements along a one-row tile of `t` after which a thread's lanes
    repeat, in vectors of `vec` elements: each of its warps' 32 threads
    loads one vector per repeat."""
    return 32 * t.num_warps * vec


def _narrow_vectors(t: "_RowTiling", N: int, center: bool) -> bool:
    """Whether a one-accumulator row of N elements in the tile kernel's tiling
    `t` loads narrow vectors (PIPED_VEC_ELEMENTS); the caller asks only under
    a Triton before PIPED_ALL_TRITON. A thread's lanes repeat
    along the tile every `narrow` elements in narrow vectors, every 2 * narrow
    in 16-byte ones; `tail` is where the row ends in its last 16-byte repeat.
    Narrow vectors where it ends in that repeat's first half for RMSNorm's and
    FusedAdd's piped rows (not `center`), and past PIPED_ROW_MAX where it ends
    exactly at the half, so that no narrow repeat is partly masked (14336).
    Never in a tile with fewer elements than threads x 16 bytes (small test
    limits)."""
    narrow = _lane_repeat(t, PIPED_VEC_ELEMENTS)
    tail = N % (2 * narrow)
    if t.block_n < 2 * narrow:
        return False
    if N <= PIPED_ROW_MAX:
        return not center and 0 < tail <= narrow
    return tail == narrow


def _narrow_forward(x: torch.Tensor, M: int, N: int, stride_x: int, center: bool) -> tuple:
    """By the rule of NARROW_VEC_ELEMENTS, a row norm's forward of x's M rows
    of N elements (row stride stride_x) in one tile of narrower vectors: the
    tiling and the vectors' elements (VEC), or (None, 0) where the forward
    plans as before (16-bit rows aligned for vectors only, `_vector_aligned`;
    LayerNorm's if `center`). LayerNorm's padded rows of PADDED_ROW_MIN and
    less: `_short_narrow_vec`, on the tile the forward plans for them."""
    if x.element_size() != 2 or not PADDED_ROW_MIN < N <= ROW_BLOCK_MAX or not _vector_aligned((N, stride_x), 2):
        return None, 0
    tile = _row_tiling(M, N)
    if N % _lane_repeat(tile, 16 // x.element_size()) == 0:
        return None, 0   # whole repeats of 16-byte vectors
    if not (center or _fills_poorly(N, tile.block_n, PADDED_ROW_FILL)):
        return None, 0   # RMSNorm's full tile
    # The widest that cuts the row in whole repeats, else the narrowest.
    return tile, _narrow_vec(tile, N)


def _narrow_vec(t: "_RowTiling", N: int) -> int:
    """VEC of a row of N in tiles `t` by the rule of NARROW_VEC_ELEMENTS:
    the widest vector that cuts the row into whole repeats of a thread's
    lanes, else the narrowest."""
    return next((v for v in NARROW_VEC_ELEMENTS if N % _lane_repeat(t, v) == 0), NARROW_VEC_ELEMENTS[-1])


def _short_narrow_vec(t: "_RowTiling", N: int, tensors: tuple, strides: tuple) -> int:
    """VEC of a tile `t` of padded rows of N up to PADDED_ROW_MIN, with
    N_CONST (see NARROW_VEC_ELEMENTS), or 0 where it keeps 16-byte vectors
    and N at run time: `tensors` (those a row is loaded from) 16-bit and
    their row `strides` aligned for vectors, and the tile at least one
    repeat of its threads' 16-byte vectors wide (Triton lays a narrower
    tile's warps across rows, where no lane is empty for N_CONST to fold)."""
    if (N > PADDED_ROW_MIN or not _fills_poorly(N, t.block_n, PADDED_ROW_FILL)
            or any(u.element_size() != 2 for u in tensors) or not _vector_aligned((N, *strides), 2)
            or t.block_n < _lane_repeat(t, 16 // 2)):
        return 0
    return _narrow_vec(t, N)


def _forward_register_cap(t: "_RowTiling", x: torch.Tensor, N: int, vec: int, center: bool) -> Optional[int]:
    """The register cap of a row forward in one tile (`_row_norm_fwd_kernel`,
    tiling t, VEC vec): FWD_SHORT_MAX_REGISTERS or FWD_NARROW_MAX_REGISTERS for
    the LayerNorm tiles those constants name, else None (ptxas's choice)."""
    if not center or x.element_size() != 2:
        return None
    if t.block_n == FWD_SHORT_BLOCK_N and t.num_warps == MIN_WARPS:
        return FWD_SHORT_MAX_REGISTERS
    if vec == NARROW_VEC_ELEMENTS[0] and t.block_n == ROW_BLOCK_MAX and N <= FWD_NARROW_ROW_MAX:
        return FWD_NARROW_MAX_REGISTERS
    return None


def _padded_floor(x: torch.Tensor, center: bool) -> Optional[int]:
    """`_row_tiling`'s padded_floor for the row norms' rows of x: RMS_PADDED_CHUNK_MIN
    for RMSNorm's and FusedAdd's (one row sum, not `center`) 16-bit rows, else
    None (LONG_CHUNK_MIN)."""
    return RMS_PADDED_CHUNK_MIN if not center and x.element_size() == 2 else None


def _long_forward_presum(N: int, sums: int) -> int:
    """PRESUM of a long-row forward whose pass 1 keeps `sums` per-lane sums:
    pre-summed with several sums past LONG_FWD_PRESUM_AFTER (see the constant)."""
    return LONG_PRESUM if sums > 1 and N > LONG_FWD_PRESUM_AFTER else 1


def _unrolled(N: int, block_n: int) -> bool:
    """UNROLL of a long-row kernel in chunks of block_n: its passes unrolled
    whole (UNROLL_MAX_BLOCK_N, UNROLL_MAX_CHUNKS)."""
    return block_n <= UNROLL_MAX_BLOCK_N and (N % block_n > 0 or N // block_n <= UNROLL_MAX_CHUNKS)


def _eight_warp_cap(t: "_RowTiling", x: torch.Tensor, N: int, whole_per_lane: bool = False) -> bool:
    """Whether the long-row backward of x's 16-bit rows in `t`'s chunks of 8
    warps takes LONG_BWD_8_WARP_MAX_REGISTERS: RMSNorm's and FusedAdd's
    per-lane rows of whole chunks (`whole_per_lane`, see
    LONG_BWD_SPILL_CHUNKS), or rows unrolled (`_unrolled`) over at least
    LONG_BWD_8_WARP_MIN_CHUNKS chunks."""
    if t.num_warps != 8 or x.element_size() != 2:
        return False
    return whole_per_lane or (_unrolled(N, t.block_n) and _cdiv(N, t.block_n) >= LONG_BWD_8_WARP_MIN_CHUNKS)


def _ptxas_cap(cap: int, t: "_RowTiling", N: int, fused_add: bool, rms_frozen: bool) -> int:
    """The register cap of RMSNorm's and FusedAdd's long-row dx kernel on
    16-bit rows whose loads vectorize, given the cap it takes before (the
    caller asks from PIPED_ALL_TRITON on). Raised where ptxas spills: under
    Triton 3.8 RMSNorm's 4-warp chunks alone, from CUDA13_PTXAS_TRITON on
    the 4- and 8-warp chunks of both, and then also RMSNorm's frozen rows of
    whole 8-warp chunks (see the constant)."""
    if _TRITON_VERSION >= CUDA13_PTXAS_TRITON:
        warps = (4, 8)
    else:   # Triton 3.8's ptxas: FusedAdd's measured no faster raised
        warps = () if fused_add else (4,)
    if t.num_warps not in warps:
        return cap
    if cap == LONG_BWD_MAX_REGISTERS and _unrolled(N, t.block_n) and _cdiv(N, t.block_n) >= LONG_BWD_SPILL_CHUNKS:
        return CUDA13_MAX_REGISTERS
    if cap == LONG_BWD_8_WARP_MAX_REGISTERS and rms_frozen:
        return LONG_BWD_SPILL_MAX_REGISTERS
    return cap


def _unhalved_chunks(t: "_RowTiling", x: torch.Tensor, N: int, sums: int,
                     backward: bool = False) -> "_RowTiling":
    """The plan `t` of a long-row kernel with `sums` row sums on x's rows, or,
    with one sum on 16-bit rows or in a forward on fp32 rows, where its one
    halving cut chunks of 4096 into more than HALVED_MAX_CHUNKS of
    UNROLL_MAX_BLOCK_N (rows of 12289 to 14336), chunks of 4096."""
    takes = sums == 1 if x.element_size() == 2 else not backward
    if not takes or t.one_pass or t.block_n != UNROLL_MAX_BLOCK_N or _cdiv(N, t.block_n) <= HALVED_MAX_CHUNKS:
        return t
    return _in_chunks(t, 2 * t.block_n)


def _unrolled_sums(N: int, block_n: int) -> bool:
    """UNROLL_SUMS of the long-row backward in chunks of block_n: its pass 1
    unrolled whole (UNROLL_SUMS_MAX_CHUNKS)."""
    return block_n <= LONG_CHUNK_MAX and _cdiv(N, block_n) <= UNROLL_SUMS_MAX_CHUNKS


class _RowTiling(NamedTuple):
    """How the row kernels cut an (M, N) tensor: into [ROWS, BLOCK_N] tiles of
    whole rows (N <= ROW_BLOCK_MAX), or into one row per program, walked in
    BLOCK_N-element chunks (longer rows)."""
    rows: int        # rows per tile (a power of two; 1 for long rows)
    block_n: int     # columns per tile, or per chunk (a power of two)
    one_pass: bool   # True when a whole row fits in one tile; False: the long-row kernels
    num_warps: int
    num_tiles: int


def _row_tiling(M: int, N: int, backward: bool = False, block_max: Optional[int] = None,
                elements_per_thread: Optional[int] = None, padded_long: bool = False,
                padded_tile: bool = False, padded_min: Optional[int] = None,
                long_floor: Optional[int] = None, padded_floor: Optional[int] = None,
                chunk_max: Optional[int] = None, skewed: bool = False) -> _RowTiling:
    """Tiles for the row kernels: the forward's (TILE_ELEMENTS and
    ELEMENTS_PER_THREAD), or with `backward` the backward's, which its
    persistent grid loops over and its frozen per-tile grid keeps
    (LOOP_TILE_ELEMENTS and LOOP_ELEMENTS_PER_THREAD); `elements_per_thread`
    overrides either's. One row per program beyond `block_max` (default
    ROW_BLOCK_MAX), and with `padded_long` also for rows that fill their
    tile poorly (PADDED_ROW_FILL) and are longer than `padded_min` (default
    PADDED_ROW_MIN); with `padded_tile`, the tiles of such rows that stay in
    one run on at most PADDED_TILE_WARPS warps (one up to PADDED_WARP_ROW_MAX).
    Rows past `block_max` take chunks of up to LONG_CHUNK_MAX (or `chunk_max`)
    and halve them once at most where that pads the row less, or with
    `long_floor` down to that length; padded rows down to LONG_CHUNK_MIN, or
    `padded_floor`. With `skewed` (rows read skewed, SKEW_TILE_ROW_MIN),
    rows that would take a tile take the long-row plan instead, as if
    `block_max` were N - 1."""
    if backward:
        tile_elements, ept = LOOP_TILE_ELEMENTS, elements_per_thread or LOOP_ELEMENTS_PER_THREAD
    else:
        tile_elements, ept = TILE_ELEMENTS, elements_per_thread or ELEMENTS_PER_THREAD
    padded = None
    if padded_long or padded_tile:
        padded = (PADDED_ROW_FILL, (padded_min or PADDED_ROW_MIN) if padded_long else None,
                  (PADDED_TILE_WARPS, PADDED_WARP_ROW_MAX) if padded_tile else None, padded_floor)
    limits = ((LONG_CHUNK_MIN, chunk_max or LONG_CHUNK_MAX, long_floor), LONG_MIN_CHUNKS,
              LONG_ELEMENTS_PER_THREAD, (MIN_WARPS, MAX_WARPS), padded)
    t = _row_tiling_cached(M, N, block_max or ROW_BLOCK_MAX, tile_elements, ept, *limits)
    if skewed and t.one_pass:
        t = _row_tiling_cached(M, N, N - 1, tile_elements, ept, *limits)
    return t


@functools.lru_cache(maxsize=4096)   # the autograd wrapper runs every step: plan each shape once
def _row_tiling_cached(M, N, block_max, tile_elements, elements_per_thread, chunk_limits, min_chunks,
                       long_elements_per_thread, warp_limits, padded):
    # Every constant the plan depends on is an argument, so that a changed
    # constant (the benchmark's --set) plans afresh; warp_limits only keys the
    # cache (_warps_for reads MIN_WARPS and MAX_WARPS).
    # padded = (PADDED_ROW_FILL, the length past which padded rows take the
    # long-row plan or None, (PADDED_TILE_WARPS, PADDED_WARP_ROW_MAX) or None,
    # the padded rows' shortest chunk or None for LONG_CHUNK_MIN).
    # A padded row: one the tile would hold, but poorly (rows past block_max
    # take the long-row plan anyway, and keep its one halving).
    fill, long_min, tile, padded_floor = padded or (0.0, None, None, None)
    padded_row = N <= block_max and _fills_poorly(N, _pow2(N), fill)
    if N > block_max or (padded_row and long_min is not None and N > long_min):
        chunk = min(chunk_limits[1], max(1, _pow2(N) // min_chunks))
        # Halving: padded rows down to LONG_CHUNK_MIN (or padded_floor), longer ones once (or down to long_floor).
        floor = (padded_floor or chunk_limits[0]) if padded_row else min(chunk // 2, chunk_limits[2] or chunk)
        while chunk // 2 >= floor and _cdiv(N, chunk // 2) * (chunk // 2) < _cdiv(N, chunk) * chunk:
            chunk //= 2   # a half chunk pads the row less (24576 = 3 x 8192, not 2 x 16384)
        # A chunk shorter than LONG_CHUNK_MIN (256: PolyNorm's forward of rows
        # of 1025 to 1280, padded rows of 1024 and less) takes one warp, not
        # MIN_WARPS of 2-element loads: measured faster in 16-bit dtypes,
        # slower in fp32 at PolyNorm's forward (NOTES.md, section 6).
        warps = _warps_for(chunk, long_elements_per_thread) if chunk >= chunk_limits[0] else 1
        return _RowTiling(1, chunk, False, warps, M)
    block_n = _pow2(N)
    rows = min(max(1, tile_elements // block_n), _pow2(M))
    warps = _warps_for(rows * block_n, elements_per_thread)
    if padded_row and tile:
        tile_warps, warp_row_max = tile
        warps = min(warps, tile_warps)
        if block_n <= warp_row_max:   # one warp, as many elements per thread
            rows, warps = max(1, rows // warps), 1
    return _RowTiling(rows, block_n, True, warps, _cdiv(M, rows))


def _whole_chunks(t: _RowTiling, M: int, N: int, long_floor: int, max_chunks: Optional[int] = None,
                  **plan) -> _RowTiling:
    """The long-row plan `t`, or where it leaves a partial last chunk, the plan
    `_row_tiling(M, N, long_floor=long_floor, **plan)`, whose chunks halve
    down to long_floor while that pads the row less, if they fit it whole
    (and number at most max_chunks)."""
    if t.one_pass or N % t.block_n == 0:
        return t
    whole = _row_tiling(M, N, long_floor=long_floor, **plan)
    fits = N % whole.block_n == 0 and (max_chunks is None or N // whole.block_n <= max_chunks)
    return whole if fits else t


def _few_whole_chunks(t: _RowTiling, x: torch.Tensor, M: int, N: int, **plan) -> _RowTiling:
    """`_whole_chunks` by the rule of WHOLE_MAX_CHUNKS: for x's 16-bit rows,
    at most that many whole chunks, down to LONG_CHUNK_MIN, except where the
    passes over `t`'s own chunks are unrolled (`_unrolled`: its last chunk is
    partial, or it has few)."""
    if x.element_size() != 2 or t.one_pass or _unrolled(N, t.block_n):
        return t
    return _whole_chunks(t, M, N, LONG_CHUNK_MIN, WHOLE_MAX_CHUNKS, **plan)


def _wide_chunks(t: _RowTiling, x: torch.Tensor, M: int, N: int, **plan) -> _RowTiling:
    """The long-row plan `t`, or for x's 16-bit rows, by the rule of
    LONG_WIDE_CHUNK_MAX, the plan of chunks up to that length where they fit
    the row whole. A plan of chunks shorter than LONG_CHUNK_MAX is kept
    without planning again: there the cap did not bind, or the row is no
    multiple of LONG_CHUNK_MAX, which a wider plan would leave partial."""
    if t.one_pass or x.element_size() != 2 or t.block_n < LONG_CHUNK_MAX:
        return t
    wide = _row_tiling(M, N, chunk_max=LONG_WIDE_CHUNK_MAX, **plan)
    return wide if N % wide.block_n == 0 else t


def _in_chunks(t: _RowTiling, block_n: int) -> _RowTiling:
    """The long-row plan `t` in chunks of block_n, on the warps such a chunk
    takes (LONG_ELEMENTS_PER_THREAD a thread)."""
    return t._replace(block_n=block_n, num_warps=_warps_for(block_n, LONG_ELEMENTS_PER_THREAD))


def _min_chunks(t: _RowTiling, x: torch.Tensor, N: int, min_chunks: Optional[int] = None) -> _RowTiling:
    """The long-row plan `t`, or for x's 16-bit rows of fewer than min_chunks
    (LONG_MIN_CHUNKS unless given) chunks of LONG_CHUNK_MAX (20481 to 24576:
    three), twice as many chunks, half as long, by the rule of LONG_MIN_CHUNKS
    (GROUP_TRAINED_MIN_CHUNKS gives more)."""
    min_chunks = min_chunks or LONG_MIN_CHUNKS
    if t.one_pass or x.element_size() != 2 or t.block_n != LONG_CHUNK_MAX or _cdiv(N, t.block_n) >= min_chunks:
        return t
    return _in_chunks(t, t.block_n // 2)


def _align(*ints: int) -> int:
    """ALIGN of a launch whose row length and row strides are `ints` (0s
    skipped), the hint of `_aligned`: the largest power of two that divides
    them all where it is 2, 4 or 8; else 1 (multiples of 16 need none, odd
    ones allow none)."""
    g = functools.reduce(math.gcd, ints, 0)
    low = g & -g   # its lowest set bit
    return low if 1 < low < 16 else 1


def _vector_aligned(strides: tuple, size: int, tensors: tuple = ()) -> bool:
    """Whether Triton can prove 16-byte vector loads of `size`-byte elements
    on rows of these `strides` (the row length among them; and at these
    `tensors`' addresses, None skipped): its launcher specialises pointers on
    divisibility by 16 bytes, and with ALIGN (`_align`) a launch declares
    the multiples of 16 // size elements."""
    return (all(s % (16 // size) == 0 for s in strides)
            and all(p.data_ptr() % 16 == 0 for p in tensors if p is not None))


def _row_skew(N: int, strides: tuple, tensors: tuple) -> int:
    """SKEW of a launch on rows of N elements (row `strides`, 0s
    skipped, of the `tensors`, None skipped); where it is not 0, odd rows a
    tile would hold may leave it for the long-row kernels (SKEW_TILE_ROW_MIN),
    and the tiles read the rest skewed where their rules allow (`_skewed_tiles`).
    Where the greatest common divisor of N and the strides is odd, no
    vector fits every row; then, if the tensors share an element size,
    each starts on a 16-byte boundary and their strides agree modulo a
    16-byte vector (their rows lie alike against one), the elements of
    such a vector: each row is read whole vectors at a time, starting at
    the boundary at or below it (`_skewed_row`), and w and b from copies
    that start as far in (`_skewed_copies`), instead of one element a
    lane. Else 0: rows of multiples of 2, 4 or 8 elements keep ALIGN's
    vectors (`_align`), and so do the multiples of 16."""
    strides = [s for s in strides if s]
    if math.gcd(N, *strides) % 2 == 0:
        return 0
    tensors = [t for t in tensors if t is not None]
    size = tensors[0].element_size()
    vec = 16 // size
    if (any(t.element_size() != size or t.data_ptr() % 16 for t in tensors)
            or any((s - strides[0]) % vec for s in strides)):
        return 0
    return vec


def _skewed_tiles(M: int, N: int, skew: int, **plan) -> Optional["_RowTiling"]:
    """The tiling (`_row_tiling` with `plan`) of M odd rows of N read skewed
    in a tile kernel (their SKEW = skew > 0): a tile with room for the
    skew - 1 lanes before a row, num_tiles counting the tiles of each of
    the skew classes of rows (r % skew: a tile holds rows of one class,
    which lie alike against a vector), a multiple of skew. None where no
    tile holds N + skew - 1 lanes."""
    room = _row_tiling(M, _lanes_walked(N, skew), **plan)
    return room._replace(num_tiles=skew * _cdiv(_cdiv(M, skew), room.rows)) if room.one_pass else None


def _skewed_trained_row_each(N: int, skew: int, center: bool, compute_dx: bool) -> bool:
    """Whether the trained backward takes odd rows of N read skewed (SKEW =
    skew > 0) that a tile would hold a row a program, in the long-row
    kernels and the dw/db kernel (`_row_tiling`'s `skewed`), not in skewed
    tiles. 16-bit rows (SKEW 8): without dx, every op's of
    SKEW_TRAINED_NODX_ROW_MIN elements or more (the dw/db kernel alone);
    with dx, LayerNorm's (`center`) where the row and the skew - 1
    lanes before it span more than SKEW_TRAINED_TILE_BLOCK_MAX lanes. fp32
    rows (SKEW 4): LayerNorm's past SKEW_TRAINED_FP32_TILE_BLOCK_MAX lanes,
    no others."""
    sixteen_bit = skew == 8   # `_row_skew`: the elements of a 16-byte vector
    if sixteen_bit and not compute_dx:
        return N >= SKEW_TRAINED_NODX_ROW_MIN
    block_max = SKEW_TRAINED_TILE_BLOCK_MAX if sixteen_bit else SKEW_TRAINED_FP32_TILE_BLOCK_MAX
    return center and _lanes_walked(N, skew) > block_max


def _skewed_copies(v: Optional[torch.Tensor], N: int, skew: int) -> Optional[torch.Tensor]:
    """For SKEW = skew > 0, w or b (N elements) as `skew` copies of
    `_skewed_copy_length` L elements each, copy k holding v from lane k on
    and zeros around it, so that a row read k lanes before its start
    (`_skewed_row`) finds its w and b lane for lane, in vectors: skew times
    v's bytes (and a few), one allocation and two launches (zeros, then v
    written at a stride of L + 1, which puts copy k's start k lanes in).
    v itself for v None or skew 0."""
    if v is None or not skew:
        return v
    L = _skewed_copy_length(N, skew)
    copies = v.new_zeros(skew * L)
    copies.as_strided((skew, N), (L + 1, 1)).copy_(v.reshape(-1))
    return copies


def _row_segment(t: _RowTiling, tensors: tuple, strides: tuple, narrow: bool = True) -> int:
    """SEG of `_segment_tile` for tiles `t` of `tensors` (x first; None
    skipped) of row `strides`: the elements of x a warp loads side by side
    (WARP_LOAD_BYTES), or 32 (one a lane) without 16-byte vectors
    (`_vector_aligned`), or BLOCK_N, the plain tile, when a tile has fewer
    rows than warps. With `narrow`, halved down to LINE_MIN_BYTES while the
    lines a warp holds (32 * vec / SEG, vec: the elements of a lane's vector)
    times the warps still divide the tile's rows, so that all lines of a row
    stay in one warp (`_segment_tile`)."""
    if t.rows % t.num_warps:
        return t.block_n
    size = tensors[0].element_size()
    aligned = _vector_aligned(strides, size, tensors)
    vec = 16 // size if aligned else 1
    seg = min(t.block_n, WARP_LOAD_BYTES // size if aligned else 32)
    while narrow and seg * size > LINE_MIN_BYTES and t.rows % (t.num_warps * 32 * vec // (seg // 2)) == 0:
        seg //= 2
    return seg


class _Grid(NamedTuple):
    """A launch over a _RowTiling's tiles: P programs, each taking every P-th tile."""
    programs: int
    tiles_per_program: int
    stages: int      # software-pipeline depth of a program's loop over its tiles


def _row_grid(t: _RowTiling, loaded: tuple, device: torch.device, persistent: bool,
              depth: int = PIPELINE_STAGES, exact: bool = False, classes: int = 1) -> _Grid:
    """The grid for `t`: persistent (about THREADS_PER_SM threads per SM, each
    program looping over tiles through a software pipeline at most `depth`
    deep) or one program per tile. `loaded`: the tensors (or None) the loop
    loads a tile of, which set the pipeline's depth (`exact`: see
    `_pipeline_stages`). `classes`: the persistent programs a multiple of
    it, as many for each of that many classes of tiles (the tile kernel's
    SKEW; t.num_tiles a multiple of it)."""
    if not persistent:
        return _Grid(t.num_tiles, 1, 1)
    per_sm = _programs_per_sm(t.num_warps)
    programs = max(classes, min(t.num_tiles, per_sm * _num_sms(device)) // classes * classes)
    tiles_per_program = _cdiv(t.num_tiles, programs)
    stages = 1
    if t.one_pass and tiles_per_program > 1:
        stages = _pipeline_stages(t.rows * t.block_n * _element_bytes(*loaded), per_sm, device, depth, exact)
    return _Grid(programs, tiles_per_program, stages)


def _interpreting() -> bool:
    """True when this module's kernels run in Triton's CPU interpreter."""
    return not isinstance(_sum_partials_kernel, triton.runtime.JITFunction)


def _check_tensor(t, name: str, *, device: Optional[torch.device] = None) -> None:
    """Type, dtype and device checks shared by every public entry point."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        extra = " (float64 is not supported: statistics are computed in float32)" if t.dtype == torch.float64 else ""
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}{extra}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected the input's device {device}")
    if device is None and not t.is_cuda and not _interpreting():
        raise ValueError(
            f"{name} is on {t.device}, but the Triton kernels need a CUDA device. To run on the CPU "
            "(slowly, for testing), set TRITON_INTERPRET=1 before the first `import triton`.")


def _check_param(p, name: str, shape: tuple, x: torch.Tensor) -> None:
    """A weight or bias: None, or a floating tensor of `shape` on x's device."""
    if p is None:
        return
    _check_tensor(p, name, device=x.device)
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(p.shape)}")


def _check_real(value, name: str) -> None:
    """eps or offset: a real number (a Python or NumPy float or int), as the
    launchers pass it to the kernels through float()."""
    if type(value) is not float and not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")


def _is_int(d) -> bool:
    """An int (a Python or NumPy integer, not a bool): a dimension."""
    return type(d) is int or (isinstance(d, numbers.Integral) and not isinstance(d, bool))


def _check_normalized_shape(x: torch.Tensor, normalized_shape) -> tuple:
    """Validates `normalized_shape` (an int, or a tuple, list or torch.Size of
    ints) against x's trailing dims; returns it as a tuple of ints."""
    if isinstance(normalized_shape, (tuple, list)) and all(map(_is_int, normalized_shape)):
        shape = tuple(map(int, normalized_shape))   # torch.Size is a tuple
    elif _is_int(normalized_shape):
        shape = (int(normalized_shape),)
    else:
        kind = type(normalized_shape).__name__
        if isinstance(normalized_shape, (tuple, list)):
            kind += " of " + ", ".join(sorted({type(d).__name__ for d in normalized_shape if not _is_int(d)}))
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {kind}")
    if len(shape) == 0 or x.dim() < len(shape) or tuple(x.shape[-len(shape):]) != shape:
        raise ValueError(
            f"normalized_shape {shape} must be non-empty and match the trailing dims of x, "
            f"whose shape is {tuple(x.shape)}")
    if math.prod(shape) == 0:
        raise ValueError(f"normalized_shape {shape} has no elements")
    return shape


def _as_rows(t: torch.Tensor, N: int) -> tuple:
    """t as M rows of N elements with unit column stride: (t, M, row stride).

    A contiguous t goes to the kernels as it is, whatever its shape: they index
    it flat, and a view would cost host time on every call. Other layouts are
    viewed as (M, N) with their row stride, so sliced rows need no copy; a last
    dim that is not contiguous (transposed, expanded) is copied once.
    """
    if t.is_contiguous():
        return t, t.numel() // N, N
    t = t.reshape(-1, N)
    if t.stride(1) != 1:
        t = t.contiguous()
    return t, t.shape[0], t.stride(0)


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of t's shape, dtype and device. torch.empty_like
    parses fewer arguments than torch.empty(t.shape, dtype=..., device=...),
    which saves host time on every output of every call (NOTES.md, section 6)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _vector(p: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A parameter in contiguous memory, as the kernels index it flat (itself when it is)."""
    return p if p is None or p.is_contiguous() else p.contiguous()


_CUSTOM_OPS = {}   # a launcher's name -> its torch custom op (section 9)


def _launcher(f):
    """Marks f as a launcher: the host code of a forward or a backward, which
    allocates the outputs, plans the grid and launches the kernels. A call
    runs f, except while torch.compile traces the caller: then it is f's
    custom op, one opaque node of the compiled graph (section 9).

    f runs with its first argument's GPU as the current device. Triton
    launches on the current device's current stream, whatever device the
    tensors are on; a model spread over GPUs (`device_map="auto"`) calls a
    norm on cuda:1 while cuda:0 is current, and the kernel would run on the
    wrong GPU, unordered with the stream that made its input."""
    @functools.wraps(f)
    def on_its_device(*args, **kwargs):
        index = args[0].get_device()   # -1 on the CPU (the interpreter); an int is cheaper than .device
        if index >= 0 and index != torch.cuda.current_device():
            with torch.cuda.device(index):
                return f(*args, **kwargs)
        return f(*args, **kwargs)

    @functools.wraps(on_its_device)
    def launch(*args, **kwargs):
        if torch.compiler.is_compiling():
            return _CUSTOM_OPS[f.__name__](*args, **kwargs)
        return on_its_device(*args, **kwargs)
    return launch


# =============================================================================
# 3. Shared Triton helpers: tile addressing, statistics merge, partial sums
# =============================================================================

@triton.jit
def _tile_columns(BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """A tile's column offsets 0 .. BLOCK_N - 1, declared contiguous in runs
    of VEC only (`tl.max_contiguous`) where VEC > 0: Triton then loads
    vectors of VEC elements, narrower than the 16 bytes it would take, and a
    thread's lanes repeat more often along the row (PIPED_VEC_ELEMENTS,
    NARROW_VEC_ELEMENTS)."""
    cols = tl.arange(0, BLOCK_N)
    if VEC:
        cols = tl.max_contiguous(cols, VEC)
    return cols


@triton.jit
def _aligned(v, ALIGN: tl.constexpr):
    """v (a row length or row stride), declared a multiple of ALIGN.

    Triton's launcher marks the integer arguments that are multiples of 16,
    and only those: a row of 4104 bf16 elements (16-byte lines, 8208 bytes)
    would load one element a lane. The launch passes ALIGN = 2, 4 or 8 where
    that power of two divides every row length and stride it hints (`_align`);
    then v // ALIGN * ALIGN is v, and the compiler's alignment analysis knows
    the product a multiple of ALIGN, so the loads vectorize. ALIGN = 1 (the
    multiples of 16, and odd rows) removes the two instructions.
    """
    if ALIGN > 1:
        v = v // ALIGN * ALIGN
    return v


@triton.constexpr_function
def _skewed_copy_length(N, SKEW):
    """The row length of `_skewed_copies`: N + SKEW rounded up to 16 elements,
    so that each row starts on a 16-byte boundary."""
    return (N + SKEW + 15) // 16 * 16


@triton.constexpr_function
def _lanes_walked(N, SKEW):
    """The lanes a row read skewed spans: the row's N, and with SKEW the
    lanes before it in its first vector (at most SKEW - 1). What a long-row
    pass walks, a skewed tile must hold, the dw/db kernel's column blocks
    cover."""
    return N + SKEW - 1 if SKEW else N


@triton.jit
def _skewed_base(start, SKEW: tl.constexpr):
    """`start` (a row's first element) rounded down to a multiple of SKEW that
    the compiler can see (`_aligned`'s division and multiply); start itself
    for SKEW = 0."""
    if SKEW:
        start = start // SKEW * SKEW
    return start


@triton.jit
def _vector_lanes(skew, N, SKEW: tl.constexpr):
    """The lanes a row read `skew` lanes early spans in whole vectors of
    SKEW: skew + N rounded up to a multiple of SKEW."""
    return (skew + N + SKEW - 1) // SKEW * SKEW


@triton.jit
def _skewed_row(start, N, SKEW: tl.constexpr):
    """A row of N elements from element `start` of its tensor, read as SKEW >
    0 whole vectors (`_row_skew`): (base, skew, n), base = start - skew the
    SKEW boundary at or below the row (a multiple of SKEW the compiler can
    see, by `_aligned`'s division and multiply), skew < SKEW lanes to the
    row's first element, and n = skew + N rounded up to whole vectors, the
    lanes read. SKEW = 0: (start, 0, N), lane c is element c."""
    base = _skewed_base(start, SKEW)
    if SKEW:
        skew = start - base
        n = _vector_lanes(skew, N, SKEW)
    else:
        skew, n = 0, N
    return base, skew, n


@triton.jit
def _skewed_lanes(cols, skew, n, N, SKEW: tl.constexpr):
    """Masks of lanes `cols` of a row read by `_skewed_row` (its skew and n):
    (load, inside, body). load: the lanes below n, whole vectors. inside:
    the row's own elements, lane c holding element c - skew (the other
    lanes loaded hold a neighbour's elements, or the bytes after the tensor
    in the same 16-byte line, which never faults: sums and selects must
    drop them). body: the whole vectors inside the row, what a store may
    write in vectors; the at most 2 (SKEW - 1) lanes left over,
    `_skew_edges`, are stored one by one. SKEW = 0: all three cols < N.
    Each test is or-ed with one on compile-time bounds that implies it
    (skew < SKEW, n >= N), so that in an unrolled pass the chunks inside
    every row need no mask at all, as without SKEW."""
    if SKEW:
        whole = N // SKEW * SKEW   # a compile-time constant where N is (the long-row kernels)
        load = (cols < whole) | (cols < n)
        inside = ((cols >= SKEW) | (cols >= skew)) & ((cols < N) | (cols < skew + N))
        body = (((cols >= SKEW) | (cols >= (skew + SKEW - 1) // SKEW * SKEW))
                & ((cols < whole) | (cols < (skew + N) // SKEW * SKEW)))
    else:
        load = cols < N
        inside = load
        body = load
    return load, inside, body


@triton.jit
def _skew_edges(skew, N, SKEW: tl.constexpr):
    """The lanes of a skewed row (`_skewed_row`) that `_skewed_lanes`' body
    leaves out, as [2 * SKEW] lanes and their mask: those of the row in its
    first vector (none for skew = 0: that vector is whole), and those from
    the last vector boundary in it on. A row inside one vector (the tile
    kernel's rows shorter than SKEW) can have a lane in both: stored twice,
    the same value."""
    e = tl.arange(0, 2 * SKEW)
    tail = (skew + N) // SKEW * SKEW
    lanes = tl.where(e < SKEW, e, tail + e - SKEW)
    # The first vector's lanes only where the row starts inside it. `skew > 0`
    # passes through a select of True and False, which the compiler folds away:
    # Triton's interpreter types a comparison of scalars as its operands (int32
    # here), so or-ed into a block it would make an int32 mask, which the
    # interpreter's loads reject from Triton 3.9 on; a select is typed as its values.
    mask = (lanes >= skew) & (lanes < skew + N) & (tl.where(skew > 0, True, False) | (e >= SKEW))
    return lanes, mask


@triton.jit
def _class_skew(cls, stride, SKEW: tl.constexpr):
    """The lanes before the first element of each row r with r % SKEW = cls
    back to its 16-byte boundary, the same for the whole class: the row
    strides agree modulo SKEW (`_row_skew`) and the tensors start on a
    boundary."""
    return cls * stride % SKEW


@triton.jit
def _class_lanes(cols, cls, stride, N, SKEW: tl.constexpr):
    """The lanes `cols` of the rows r with r % SKEW = cls (the tile kernels'
    SKEW: rows SKEW apart lie alike against a vector) read skewed: (skew, n,
    load, inside, body), skew (`_class_skew`) the lanes before each row's
    first element, n its lanes in whole vectors (`_vector_lanes`), and
    `_skewed_lanes`' masks."""
    skew = _class_skew(cls, stride, SKEW)
    n = _vector_lanes(skew, N, SKEW)
    load, inside, body = _skewed_lanes(cols, skew, n, N, SKEW)
    return skew, n, load, inside, body


@triton.jit
def _tile(rows, cols, M, N, stride):
    """Offsets and mask of a [ROWS, BLOCK] tile of a row-major (M, N) tensor.

    Row offsets are int64: M * N may exceed 2**31 elements.
    """
    offsets = rows[:, None].to(tl.int64) * stride + cols[None, :]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return offsets, mask


@triton.jit
def _skewed_tile(rows, cols, M, N, stride, lanes, SKEW: tl.constexpr):
    """`_tile`, or with SKEW a tile of rows of one skew (the tile kernels'
    SKEW: rows SKEW apart): each row read from the SKEW boundary at or below
    its start (`_skewed_base`: the compiler sees the multiple), so lane c
    holds element c - skew; `lanes` is then the column mask (unused without
    SKEW)."""
    if SKEW:
        offsets = _skewed_base(rows[:, None].to(tl.int64) * stride, SKEW) + cols[None, :]
        mask = (rows < M)[:, None] & lanes[None, :]
    else:
        offsets, mask = _tile(rows, cols, M, N, stride)
    return offsets, mask


@triton.jit
def _skewed_copy(V, skew, N, SKEW: tl.constexpr):
    """Copy `skew` of w's or b's `_skewed_copies` (a tile kernel's: N at run
    time, `_skewed_copy_length`'s formula written out)."""
    return V + skew * ((N + SKEW + 15) // 16 * 16)


@triton.jit
def _segment_tile(tile, M, N, stride, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr):
    """Offsets and mask of tile `tile` (ROWS whole rows of a row-major (M, N)
    tensor) as BLOCK_N / SEG * ROWS lines of SEG elements: line h * ROWS + r
    holds row r's segment h, its columns h * SEG to h * SEG + SEG - 1.

    Why: Triton lays a 2-D tile out by lines, each warp holding L = 32 * vec /
    SEG whole lines (vec: the elements of a lane's vector; L = 1 where SEG is
    what its lanes load side by side, WARP_LOAD_BYTES), lines i to i + L - 1
    going to warp (i / L) % num_warps; with ROWS a multiple of L times the
    warps (`_row_segment`), all segments of a row are in one warp. `_by_row`
    then views the tile as [segment, row, lane] without moving data, and
    `_row_sums` reduces a row in registers and shuffles, with no exchange
    between warps. SEG = BLOCK_N is the plain [ROWS, BLOCK_N] tile of `_tile`.
    """
    line = tl.arange(0, BLOCK_N // SEG * ROWS)
    rows = tile * ROWS + line % ROWS
    cols = (line // ROWS)[:, None] * SEG + tl.arange(0, SEG)[None, :]
    return rows[:, None].to(tl.int64) * stride + cols, (rows < M)[:, None] & (cols < N)


@triton.jit
def _by_row(lines, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr):
    """A `_segment_tile` tile as [BLOCK_N / SEG, ROWS, SEG]: [h, r] is row r's segment h."""
    return tl.reshape(lines, [BLOCK_N // SEG, ROWS, SEG])


@triton.jit
def _as_lines(t, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr):
    """The inverse of `_by_row`: back to the lines `_segment_tile` addresses."""
    return tl.reshape(t, [BLOCK_N // SEG * ROWS, SEG])


@triton.jit
def _row_sums(t):
    """Row sums of a `_by_row` tile: over a lane's segments, then across lanes."""
    return tl.sum(tl.sum(t, axis=0), axis=1)


@triton.jit
def _per_row(r):
    """A [ROWS] vector of `_row_sums` broadcast against a `_by_row` tile. The
    expansions mirror the two sums, so the layout matches and no data moves."""
    return tl.expand_dims(tl.expand_dims(r, 1), 0)


@triton.jit
def _load_vector(P, offs, n):
    """Elements `offs` of an n-element parameter vector (w, b), in fp32; 0 past n."""
    return tl.load(P + offs, mask=offs < n, other=0.0).to(tl.float32)


@triton.jit
def _lane_groups(BLOCK_N: tl.constexpr, PRESUM: tl.constexpr):
    """Offsets 0..BLOCK_N-1 of a chunk viewed as [BLOCK_N / PRESUM, PRESUM]: a
    row holds PRESUM consecutive elements, which one thread holds when PRESUM
    is at most its share of the chunk, so a `tl.sum(axis=1)` adds them in
    registers (the long-row kernels' PRESUM; PRESUM = 1 keeps one per lane)."""
    return tl.arange(0, BLOCK_N // PRESUM)[:, None] * PRESUM + tl.arange(0, PRESUM)[None, :]


@triton.constexpr_function
def _unroll_factor(stop, step, unroll):
    """`loop_unroll_factor` of a long-row pass `for start in range(0, stop,
    step)`: with UNROLL every step (the loop unrolled whole, `tl.range` then
    emits straight-line code), else 1 (none asked: the compiler's choice)."""
    return max(1, -(-stop // step)) if unroll else 1


@triton.jit
def _chunk_moments(x, mask, n, CENTER: tl.constexpr):
    """Mean and sum of squared deviations (m2) of each row of a masked tile.

    With CENTER=False the mean is taken to be 0 and m2 is the sum of squares:
    the RMSNorm statistic.
    """
    if CENTER:
        mean = tl.sum(x, axis=1) / n
        d = tl.where(mask, x - mean[:, None], 0.0)
        m2 = tl.sum(d * d, axis=1)
    else:
        m2 = tl.sum(x * x, axis=1)
        mean = tl.zeros_like(m2)
    return mean, m2


@triton.jit
def _merge_moments(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    """Chan et al.'s merge of the moments of two disjoint parts of a row.

    Robust where sum(x^2) - sum(x)^2 / n cancels catastrophically (a large mean
    over a small spread). With both means 0 it reduces to m2_a + m2_b; two empty
    parts (n_a = n_b = 0) merge to mean_a and m2 0.
    """
    n = n_a + n_b
    delta = mean_b - mean_a
    frac_b = n_b / tl.maximum(n, 1.0)
    mean = mean_a + delta * frac_b
    m2 = m2_a + m2_b + delta * delta * n_a * frac_b
    return mean, m2


# Combiners of a `tl.reduce` over a tuple: several row sums reduced at once,
# with one exchange between warps (through shared memory, between barriers)
# instead of one per sum.
@triton.jit
def _add2(a1, a2, b1, b2):
    """Elementwise sum of two pairs."""
    return a1 + b1, a2 + b2


@triton.jit
def _add3(a1, a2, a3, b1, b2, b3):
    """Elementwise sum of two triples."""
    return a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _add4(a1, a2, a3, a4, b1, b2, b3, b4):
    """Elementwise sum of two quadruples."""
    return a1 + b1, a2 + b2, a3 + b3, a4 + b4


@triton.jit
def _sum_partials(Partial, Out, P, N, stride_p, band_rows, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                  STAGES: tl.constexpr):
    band = tl.program_id(2)   # rows band * band_rows on, into row `band` of Out
    end = tl.minimum(P, (band + 1) * band_rows)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in tl.range(band * band_rows, end, BLOCK_P, num_stages=STAGES):
        offsets, mask = _tile(p0 + tl.arange(0, BLOCK_P), cols, end, N, stride_p)
        acc += tl.load(Partial + offsets, mask=mask, other=0.0)
    tl.store(Out + band * N + cols, tl.sum(acc, axis=0).to(Out.dtype.element_ty), mask=cols < N)


@triton.jit
def _sum_partials_kernel(
    PartialA, OutA, PartialB, OutB,   # (P, N_a) fp32 -> (bands, N_a) ; (P, N_b) fp32 -> (bands, N_b)
    P, N_a, N_b, stride_a, stride_b, band_rows,
    HAS_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """Out[band, n] = sum of Partial[p, n] over the rows p of band `band`
    (band_rows of them), for one or two (Partial, Out) pairs.

    The deterministic second half of every weight gradient: the backward kernels
    leave one fp32 row of partial sums per program, and this kernel sums them in
    a fixed order. With one band (band_rows >= P), Out is the gradient, written
    in its own dtype (the parameter's); with several, Out is an fp32 partial of
    one row per band, which a second launch sums (`_reduce_partials`).

    Grid: (cdiv(max(N_a, N_b), BLOCK_N), 2 if HAS_B else 1, bands); axis 1
    picks the pair.
    HAS_B: False removes the second pair (one trained parameter).
    STAGES: the software pipeline's depth over the [BLOCK_P, BLOCK_N] steps.
    """
    if tl.program_id(1) == 0:
        _sum_partials(PartialA, OutA, P, N_a, stride_a, band_rows, BLOCK_P, BLOCK_N, STAGES)
    elif HAS_B:
        _sum_partials(PartialB, OutB, P, N_b, stride_b, band_rows, BLOCK_P, BLOCK_N, STAGES)


def _sum_targets(rows: int, dw: Optional[torch.Tensor], db: Optional[torch.Tensor]) -> tuple:
    """Where a backward kernel leaves its `rows` rows of dw and db sums.

    Several rows: a new (rows, numel) fp32 partial per gradient asked for (None
    for None), which `_reduce_partials` then sums into dw and db. One row is
    the gradient itself: the kernel stores into dw and db directly (its stores
    cast to their dtype, as `_sum_partials` would), and no reduction is
    launched. The long-row dw/db kernel leaves one row for rows longer than
    8384 elements on an H200 (`_row_norm_dwdb`), GroupNorm's kernels for a
    batch of one sample.
    """
    if rows == 1:
        return dw, db
    return tuple(None if out is None else torch.empty((rows, out.numel()), dtype=torch.float32, device=out.device)
                 for out in (dw, db))


def _reduce_partials(*pairs) -> None:
    """Sums each (partial, out) pair's partial rows into out, by
    `_sum_partials_kernel`: one launch for up to two pairs, and before it one
    more for each fold of a partial taller than PARTIAL_FOLD_ROWS.

    A pair whose partial is None (a parameter that does not train) or the
    output itself (one row, stored there by the kernel: `_sum_targets`) is
    skipped; with none left, nothing is launched.
    """
    pairs = [(partial, out) for partial, out in pairs if partial is not None and partial is not out]
    while pairs and pairs[0][0].shape[0] > PARTIAL_FOLD_ROWS:
        # Fold: bands of PARTIAL_FOLD_ROWS rows, summed side by side into a
        # (bands, N) partial, which then takes the partial's place.
        bands = _cdiv(pairs[0][0].shape[0], PARTIAL_FOLD_ROWS)
        folded = [partial.new_empty((bands, partial.shape[1])) for partial, _ in pairs]
        _launch_sum_partials([(partial, f) for (partial, _), f in zip(pairs, folded)], PARTIAL_FOLD_ROWS, bands)
        pairs = [(f, out) for f, (_, out) in zip(folded, pairs)]
    if pairs:
        _launch_sum_partials(pairs, pairs[0][0].shape[0], 1)


def _launch_sum_partials(pairs, band_rows: int, bands: int) -> None:
    """One `_sum_partials_kernel` launch over the (partial, out) pairs (one or
    two, partials of the same height), in `bands` bands of `band_rows` rows."""
    (partial_a, out_a), (partial_b, out_b) = pairs[0], pairs[1] if len(pairs) > 1 else (None, None)
    n_b = 0 if partial_b is None else partial_b.shape[1]
    N = max(partial_a.shape[1], n_b)
    step = PARTIAL_ROWS * PARTIAL_COLS   # elements per step, shaped to the partial
    block_n = min(_pow2(N), step // min(PARTIAL_ROWS, _pow2(band_rows)))
    _sum_partials_kernel[(_cdiv(N, block_n), 1 if partial_b is None else 2, bands)](
        partial_a, out_a, partial_b, out_b, partial_a.shape[0], partial_a.shape[1], n_b,
        partial_a.stride(0), 0 if partial_b is None else partial_b.stride(0), band_rows,
        HAS_B=partial_b is not None, BLOCK_P=step // block_n, BLOCK_N=block_n,
        STAGES=PIPELINE_STAGES, num_warps=PARTIAL_WARPS, enable_fp_fusion=FP_FUSION)


# =============================================================================
# 4. RMSNorm
# =============================================================================
#
# The math. For one row x of N elements:
#
#     rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   y = xhat * (o + w)
#
# The backward. Write g = dy * (o + w), the gradient arriving at xhat. Since
# xhat_i = x_i * rstd and d(rstd)/d(x_j) = -rstd^3 * x_j / N,
#
#     dx_i = rstd * g_i - x_i * rstd^3 * sum_j(g_j * x_j) / N
#          = rstd * (g_i - xhat_i * c1),          c1 = mean(xhat * g)      (1)
#
#     dw   = sum over rows of dy * xhat                                    (2)
#
# (1) is a row reduction (c1) followed by an elementwise update: each program
# does it for its own rows. (2) is a column reduction over all M rows: each
# program of a persistent grid keeps an fp32 accumulator tile of its tiles'
# shape for the rows it walks, sums the tile's rows once at the end, writes
# that N-wide row to a (P x N) scratch buffer, and `_sum_partials_kernel` adds
# the P rows in a fixed order (no atomics, so the result is the same bit for
# bit on every run). Rows longer than ROW_BLOCK_MAX leave no room in registers
# for both the row (x and dy, live through the c1 reduction) and that
# accumulator. Up to RELOAD_ROW_BLOCK_MAX, with one accumulator, the tile
# kernel makes room by not keeping the row: it adds the row to the
# accumulator first, so that only xhat and g live through the reduction, and
# pipelines the rows; under Triton 3.6, whose code for that spills past
# PIPED_ROW_MAX, RMSNorm's and LayerNorm's rows that train w load x and dy
# again after the reduction there instead (RELOAD), from L1/L2 (see
# PIPED_ALL_TRITON). Longer rows, or two accumulators (LayerNorm's dw and
# db; but its 16-bit rows of up to ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX, a tile
# and a tail, and of TWO_ACC_FOLDED_ROW), take dw and db from
# `_row_norm_dwdb_kernel`, which swaps the loops (each program owns a block
# of columns and walks the rows), at the price of reading x and dy a second
# time from DRAM. Where its programs walk all the rows (one row slice), their
# sums are dw itself: no scratch, no reduction launch. While a CUDA graph is
# captured it runs beside the dx kernel, on part of the SMs and a second
# stream, so that it finds much of x and dy in L2 (DW_BESIDE_GRAPH). Rows so
# long that the dx kernel's second pass no longer finds them in L2 either
# (COLUMNS_DX_ROW_BYTES) keep its first pass alone, and the dw/db kernel
# writes dx in its tiles as it sums (COMPUTE_DX): x and dy read twice, not
# three times.
#
# A persistent program walks its tiles one after another, and each tile ends in
# row reductions that leave memory idle. `tl.range(..., num_stages=STAGES)`
# asks Triton to pipeline the loop: it issues the loads of the next STAGES - 1
# tiles as asynchronous copies into shared memory (cp.async) before it computes
# the current one, so the few programs an SM holds keep memory busy. A backward
# with nothing to accumulate (w and b frozen) needs no loop: it runs one
# program per tile, as the forward does, and the GPU keeps as many tiles in
# flight as fit (measured faster than the pipelined loop, NOTES.md, section 6).
#
# What a frozen w removes: all of (2), i.e. the accumulator's registers, the
# multiply-add per element, the (P x N) fp32 scratch and its writes, and the
# second launch. g still needs the *value* of w. What an x without grad
# removes: (1), i.e. the c1 reduction and the dx stores.
#
# Rows longer than ROW_BLOCK_MAX do not fit in a program's registers. Their
# kernels (`_long_row_norm_fwd_kernel`, `_long_row_norm_bwd_kernel`) give each
# row a program that reads it twice in chunks: pass 1 for the statistic (rstd,
# or c1), pass 2 for the output, mostly from L2. Pass 1 sums per lane (or per
# group of a thread's elements: PRESUM) and reduces across the program once at
# the end, so its loop has no barrier.
#
# The same kernels also serve FusedAddRMSNorm (HAS_RESIDUAL, HAS_DS),
# LayerNorm (CENTER, HAS_B) and GroupNorm's many rows (HW: w and b per
# channel); sections 5, 6 and 7 explain those deltas.
#
# On a first reading, follow three kernels: `_row_norm_fwd_kernel` (a tile of
# whole rows: load, reduce, store), `_row_norm_bwd_kernel` with its COMPUTE_*
# flags in mind, and `_sum_partials_kernel`. Their other constexprs (N_CONST,
# VEC, RELOAD, W_PER_TILE, JOINT, TAIL) and the long-row kernels are tuning
# for particular row lengths: for rows of powers of two up to 4096 every one
# of those flags is off, and the code it guards is not compiled.


def rms_norm_reference(x, normalized_shape, weight=None, eps=None, offset=0.0):
    """Plain-torch RMSNorm, computed in the dtype of x (use float64 to check)."""
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * (offset + weight)


@triton.jit
def _load_scale(W, cols, N, OFFSET: tl.constexpr):
    """o + w at `cols` (0 past N), fp32. o is a compile-time constant, so for
    o = 0 there is no add: one instruction per element less, in kernels whose
    instruction count shows in their speed (NOTES.md, section 2)."""
    w = _load_vector(W, cols, N)
    if OFFSET != 0.0:
        w = w + OFFSET
    return w


@triton.jit
def _xhat(x, mean, rstd, CENTER: tl.constexpr):
    """xhat = (x - mean) * rstd, mean and rstd broadcast against x. With
    CENTER, as x * rstd - mean * rstd: the row constant mean * rstd first,
    then one fused multiply-add an element instead of a subtraction and a
    multiply (x * rstd is rounded at the size of x: see the rounding note of
    `_long_row_norm_bwd_kernel`). Without it (RMSNorm's mean: a constant 0,
    whose subtraction the compiler folds away, or the run-time 0 that
    `_load_row_stats` keeps on purpose) the expression stays as it was."""
    if CENTER:
        return x * rstd - mean * rstd
    return (x - mean) * rstd


@triton.jit
def _row_affine(xhat, W, B, cols, N, OFFSET: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """y = xhat * (o + w) + b in fp32, for a [ROWS, BLOCK_N] tile or a [BLOCK_N]
    chunk of one row (w and b broadcast over the rows)."""
    y = xhat
    if HAS_W:
        y = y * _load_scale(W, cols, N, OFFSET)
    if HAS_B:
        y = y + _load_vector(B, cols, N)
    return y


@triton.jit
def _affine_index(cols, N, HW: tl.constexpr):
    """Which element of w and b each element `cols` of a long row uses, and
    how many there are: its column, of N, for the row norms (HW = 0); for
    GroupNorm (section 7), whose chunks are viewed as [BLOCK_N / PRESUM,
    PRESUM], the channel of each group's first element, min(cols) // HW of N
    // HW, taken once per group (one load of w per thread and group, not one
    per element). Where PRESUM divides HW a group's elements share that
    channel; else HW >= PRESUM and a group may end in the next one
    (`_spans_channels`)."""
    if HW > 0:
        index = (tl.min(cols, axis=1) // HW)[:, None]
        n: tl.constexpr = N // HW
    else:
        index = cols
        n: tl.constexpr = N
    return index, n


@triton.jit
def _in_next_channel(cols, index, HW: tl.constexpr):
    """Which elements `cols` of groups that may span two channels
    (`_spans_channels`) lie in the channel after their first one's, `index`
    (`_affine_index`): those at or past that channel's first element."""
    return cols >= (index + 1) * HW


@triton.constexpr_function
def _spans_channels(HW, PRESUM):
    """Whether GroupNorm's groups of PRESUM consecutive elements of a long row
    (`_affine_index`) may reach into the channel after their first one's: HW
    is no multiple of PRESUM (then HW >= PRESUM, `_group_long_presum`, so
    two channels at most). Such a group loads w and b of both channels and
    picks by a select per element (`_in_next_channel`), instead of
    loading each per element (PRESUM 1, where HW is odd). False for the row
    norms (HW = 0)."""
    return HW > 0 and HW % PRESUM != 0


@triton.jit
def _load_row_input(X, R, S, rows, cols, M, N, stride_x, stride_r, stride_s, HAS_RESIDUAL: tl.constexpr,
                    lanes, stored, SKEW: tl.constexpr):
    """x of a tile in fp32, and its mask. With HAS_RESIDUAL: x + r, rounded to S's
    dtype and stored to S, because the next block sees (and we normalize) that.
    With SKEW, rows of one skew (`_skewed_tile`): lanes `lanes` loaded, s
    stored on lanes `stored` (both unused without SKEW)."""
    x_offs, mask = _skewed_tile(rows, cols, M, N, stride_x, lanes, SKEW)
    x = tl.load(X + x_offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r_offs, _ = _skewed_tile(rows, cols, M, N, stride_r, lanes, SKEW)
        s_offs, s_mask = _skewed_tile(rows, cols, M, N, stride_s, stored, SKEW)
        s = (x + tl.load(R + r_offs, mask=mask, other=0.0).to(tl.float32)).to(S.dtype.element_ty)
        tl.store(S + s_offs, s, mask=s_mask)
        x = s.to(tl.float32)
    return x, mask


@triton.jit
def _row_norm_fwd_kernel(
    X, R, S, Y, W, B, Mean, Rstd,        # X, R, S, Y: (M, N); W, B: (N,); Mean, Rstd: (M,) fp32
    M, N, stride_x, stride_r, stride_s, stride_y, eps,
    OFFSET: tl.constexpr,
    CENTER: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_CONST: tl.constexpr, VEC: tl.constexpr,
    ALIGN: tl.constexpr, SKEW: tl.constexpr, W_FIRST: tl.constexpr,
):
    """Row norm forward: y = (x - mean) * rstd * (o + w) + b, one tile of rows.

    RMSNorm is CENTER=False (mean taken as 0, no bias); FusedAddRMSNorm first
    forms x = X + R and stores it to S; LayerNorm is CENTER=True with a bias.

    Grid: (cdiv(M, ROWS),), one [ROWS, BLOCK_N] tile of whole rows per program
    (BLOCK_N >= N: each row is read once).
    Pointers: X, R, S, Y are (M, N) with unit column stride and the given row
    strides; W, B are (N,); Mean, Rstd are (M,) fp32 (Mean only with CENTER).
    Dtypes: X, R, S, Y share one dtype; W and B may each have another. All math
    is fp32; Y and S are rounded to their dtype on store.

    Flags (each False removes code):
      CENTER        the mean and its subtraction; Mean is not written (RMSNorm).
      HAS_RESIDUAL  the load of R, the add and the store of S.
      HAS_W, HAS_B  the load and multiply by (o + w), the load and add of b.
    OFFSET is o; o = 0 removes the add of o to w (`_load_scale`).
    N_CONST is 0, or N as a compile-time constant (NARROW_VEC_ELEMENTS), so
    that a thread's lanes past N fold away: their loads, stores and mask tests.
    VEC is 0, or the elements of the vectors loaded (`tl.max_contiguous`
    caps what Triton may assume contiguous); 0 removes the hint.
    ALIGN: `_aligned`'s hint, a power of two dividing N and the row strides; 1 removes it.
    SKEW (0, or the elements of a 16-byte vector, `_row_skew`: odd rows;
    without N_CONST and VEC): the grid is (SKEW * cdiv(cdiv(M, SKEW), ROWS),),
    program p taking the rows r with r % SKEW = p % SKEW, its tile the
    (p // SKEW)-th ROWS of them (rows SKEW apart lie alike against a vector).
    Each row is read in whole vectors from the boundary at or below its
    start (`_skewed_tile`), W and B are the class's copies (`_skewed_copies`),
    the lanes outside the row are set to 0 before the sums, y (and s) are
    stored in whole vectors, and their at most 2 (SKEW - 1) other lanes one
    by one from loads of their own (`_skew_edges`). 0 removes it all: a lane
    a column, loads in vectors only where ALIGN allows.
    W_FIRST loads w and b before x and holds them through the row sums, so
    that their latency passes behind x's; False removes those early loads
    (w and b are loaded after the sums, where y needs them, and hold no
    registers meanwhile).
    """
    N, stride_x, stride_r = _aligned(N, ALIGN), _aligned(stride_x, ALIGN), _aligned(stride_r, ALIGN)
    stride_s, stride_y = _aligned(stride_s, ALIGN), _aligned(stride_y, ALIGN)
    if N_CONST:
        N = N_CONST   # the row length as a compile-time constant
    tl.static_assert(SKEW == 0 or not (N_CONST or VEC))
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    eps = tl.cast(eps, tl.float32)   # under torch.compile a Python float may arrive as fp64
    cols = _tile_columns(BLOCK_N, VEC)
    skew, load, inside, body, n_w = 0, None, None, None, N   # SKEW's (0 and None: unused without it)
    if SKEW:   # the rows of the program's class, and their lanes
        cls = pid % SKEW
        rows = (pid // SKEW * ROWS + tl.arange(0, ROWS)) * SKEW + cls
        skew, n_w, load, inside, body = _class_lanes(cols, cls, stride_x, N, SKEW)
        if HAS_W:
            W = _skewed_copy(W, skew, N, SKEW)
        if HAS_B:
            B = _skewed_copy(B, skew, N, SKEW)
    if W_FIRST and HAS_W:   # o + w
        w_first = _load_scale(W, cols, n_w, OFFSET)
    if W_FIRST and HAS_B:
        b_first = _load_vector(B, cols, n_w)
    x, mask = _load_row_input(X, R, S, rows, cols, M, N, stride_x, stride_r, stride_s, HAS_RESIDUAL,
                              load, body, SKEW)
    if SKEW:   # the row's own lanes: the others hold a neighbour's elements
        mask = (rows < M)[:, None] & inside[None, :]
        x = tl.where(mask, x, 0.0)
    mean, m2 = _chunk_moments(x, mask, N, CENTER)
    rstd = 1.0 / tl.sqrt(m2 / N + eps)
    # The statistics before y: a [ROWS] store first moves the values through
    # shared memory into a layout for the store (a barrier). Issued here, that
    # wait overlaps y's arithmetic rather than ending the program.
    tl.store(Rstd + rows, rstd, mask=rows < M)
    if CENTER:
        tl.store(Mean + rows, mean, mask=rows < M)
    y_offs, y_mask = _skewed_tile(rows, cols, M, N, stride_y, body, SKEW)
    # Not `_xhat`: x - mean is the subtraction `_chunk_moments` made for m2,
    # and reused it leaves one tile of values live through the row reductions
    # where x * rstd - mean * rstd keeps x and x - mean both (ptxas of Triton
    # 3.6: 78 registers instead of 63 at BLOCK_N 8192, three 8-warp programs
    # per SM instead of four; NOTES.md, section 6).
    y = (x - mean[:, None]) * rstd[:, None]
    if W_FIRST and HAS_W:
        y = y * w_first
    if W_FIRST and HAS_B:
        y = y + b_first
    if not W_FIRST:
        y = _row_affine(y, W, B, cols, n_w, OFFSET, HAS_W, HAS_B)
    tl.store(Y + y_offs, y.to(Y.dtype.element_ty), mask=y_mask)
    if SKEW:   # the lanes in no whole vector, one by one, from loads of their own
        e_cols, e_lanes = _skew_edges(skew, N, SKEW)
        x_e, _ = _load_row_input(X, R, S, rows, e_cols, M, N, stride_x, stride_r, stride_s, HAS_RESIDUAL,
                                 e_lanes, e_lanes, SKEW)
        y_e = _row_affine((x_e - mean[:, None]) * rstd[:, None], W, B, e_cols, n_w, OFFSET, HAS_W, HAS_B)
        ye_offs, e_mask = _skewed_tile(rows, e_cols, M, N, stride_y, e_lanes, SKEW)
        tl.store(Y + ye_offs, y_e.to(Y.dtype.element_ty), mask=e_mask)


@triton.jit
def _long_row_chunk(X, R, S, cols, mask, store_mask, HAS_RESIDUAL: tl.constexpr):
    """Pass 1's load of a long-row chunk, in fp32: x, kept in L2 for pass 2
    (evict_last); with HAS_RESIDUAL, s = x + r, stored to S where store_mask
    (and x, r evicted first: pass 2 reads s)."""
    if HAS_RESIDUAL:
        x = tl.load(X + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(R + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        s = (x + r).to(S.dtype.element_ty)
        tl.store(S + cols, s, mask=store_mask)
        return s.to(tl.float32)
    return tl.load(X + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)


@triton.jit
def _long_row_y(x, Y, W, B, cols, mask, mean, rstd, N, HW: tl.constexpr, PRESUM: tl.constexpr,
                OFFSET: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                SKEW: tl.constexpr):
    """Pass 2 of the long-row forward on lanes `cols` of x (or s), fp32: y,
    stored where mask; w and b as `_affine_index` says (HW), or with SKEW
    lane for lane from their copies (`_skewed_copies`)."""
    xhat = _xhat(x, mean, rstd, CENTER)
    if SKEW:
        index, n = cols, _skewed_copy_length(N, SKEW)
    else:
        index, n = _affine_index(cols, N, HW)
    y = _row_affine(xhat, W, B, index, n, OFFSET, HAS_W, HAS_B)
    # A group's elements in the next channel take its w and b: y of
    # both channels, then a select (selecting w and b first, as the
    # backward selects w, measured slower: NOTES.md, section 6).
    if _spans_channels(HW, PRESUM):
        y = tl.where(_in_next_channel(cols, index, HW),
                     _row_affine(xhat, W, B, index + 1, n, OFFSET, HAS_W, HAS_B), y)
    tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _long_row_norm_fwd_kernel(
    X, R, S, Y, W, B, Mean, Rstd,        # as _row_norm_fwd_kernel
    stride_x, stride_r, stride_s, stride_y, stride_stats, G, eps,
    N: tl.constexpr, OFFSET: tl.constexpr,
    CENTER: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_N: tl.constexpr, PRESUM: tl.constexpr, HW: tl.constexpr, APPLY: tl.constexpr, SPLITS: tl.constexpr,
    UNROLL: tl.constexpr,
    ALIGN: tl.constexpr, SKEW: tl.constexpr,
):
    """Row norm forward of rows longer than ROW_BLOCK_MAX: the delta on
    `_row_norm_fwd_kernel` is that a row no longer fits in registers.

    Pass 1 walks the row in BLOCK_N-element chunks and accumulates the
    statistics *per group* of PRESUM consecutive elements of one thread (a
    [BLOCK_N / PRESUM] vector: the sum of squares, or for CENTER sums shifted
    by each group's first element), reducing across groups once at the end: no
    cross-warp reduction, hence no barrier, inside the loop, so the warps run
    ahead of each other and keep their loads in flight.
    Its loads ask L2 to keep the lines (evict_last); pass 2 reads the row
    again, last chunk first and mostly from L2, with evict_first, and writes y
    through the tile forward's `_row_affine`. N is a compile-time constant, as
    in torch.compile's generated code: the trip counts are known and the
    compiler can unroll and drop masks (one compiled variant per row length,
    and models have few). UNROLL unrolls both passes whole
    (`_unroll_factor`; the wrappers set it by `_unrolled`); False leaves
    it to the compiler.

    Grid: (M,), one row per program. Pointers, dtypes and CENTER / HAS_RESIDUAL
    / HAS_W / HAS_B as in `_row_norm_fwd_kernel`. With HAS_RESIDUAL pass 1
    writes s and pass 2 reads it back (x and r are read once, evict_first).
    PRESUM: a group's size, LONG_PRESUM or 1 (a group is a lane: per-lane
    sums; GroupNorm's: `_group_long_presum`); see the constant. At most the
    elements a thread holds of a chunk (LONG_ELEMENTS_PER_THREAD, or more:
    LONG_WIDE_CHUNK_MAX), so that a group adds up in registers.
    HW: 0 for the row norms. GroupNorm's rows (section 7) set it to the
    positions per channel: a row is one (sample, group), N = Cg * HW, and w
    and b are per channel (`_affine_index`), from the group's first channel,
    (row % G) * Cg; a group spans one channel, or where PRESUM does not divide
    HW two (`_spans_channels`). Mean and Rstd are then columns of the
    (B * G, 2 + 2S pieces) statistics, of row stride stride_stats (else 1).
    APPLY False removes pass 2: GroupNorm's split statistics (section 7),
    where a "row" is one of the SPLITS equal segments (channel ranges, or
    pieces of them) of a (sample, group) row, and Mean, Rstd point at the
    first segment's two floats in the statistics: segment row stores its
    mean and m2 (not rstd) to pair row % SPLITS of statistics row row //
    SPLITS. Else SPLITS = 1.
    ALIGN: `_aligned`'s hint, a power of two dividing the row strides; 1 removes it.
    SKEW (the row norms' rows of an odd length or stride, `_row_skew`): the
    elements of a 16-byte vector. Each row is read from the vector boundary
    at or below its start (`_skewed_row`), its lanes masked by
    `_skewed_lanes`, so loads and stores stay 16-byte vectors; W and B are
    then SKEW copies (`_skewed_copies`), and the lanes in no whole vector
    are stored one by one after pass 2 (`_skew_edges`), FusedAdd's s with
    them. With CENTER, a group that starts before the row shifts by the
    row's first element, and a lane counts only its chunks inside the row.
    0 removes all of it: lane c is element c.
    """
    stride_x, stride_r = _aligned(stride_x, ALIGN), _aligned(stride_r, ALIGN)
    stride_s, stride_y = _aligned(stride_s, ALIGN), _aligned(stride_y, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    base, skew, n = _skewed_row(row * stride_x, N, SKEW)
    X += base
    Y += _skewed_base(row * stride_y, SKEW)
    if HW > 0:   # GroupNorm: the row's group's channels of w and b
        if HAS_W:
            W += (row % G) * (N // HW)
        if HAS_B:
            B += (row % G) * (N // HW)
    if SKEW and HAS_W:   # the copies of w and b that start `skew` lanes in
        W += skew * _skewed_copy_length(N, SKEW)
    if SKEW and HAS_B:
        B += skew * _skewed_copy_length(N, SKEW)
    if HAS_RESIDUAL:
        R += _skewed_base(row * stride_r, SKEW)
        S += _skewed_base(row * stride_s, SKEW)
    LANES: tl.constexpr = _lanes_walked(N, SKEW)
    eps = tl.cast(eps, tl.float32)
    lanes = tl.arange(0, BLOCK_N)
    # Pass 1: per-group statistics, a chunk viewed as [BLOCK_N / PRESUM,
    # PRESUM] (a row of it is a group). For CENTER each group sums its
    # elements shifted by its own first one, k: s1 = sum(x - k), s2 = sum((x -
    # k)^2), and m2 = s2 - s1^2 / n. As k is one of the group's n values, s2
    # <= (n + 1) * m2, so the subtraction loses a few ulps at most however
    # large the mean (n <= PRESUM * N / BLOCK_N). The groups then merge by the
    # parallel-axis theorem, two plain sums: mean = sum(n * mean_v) / N, m2 =
    # sum(m2_v + n * (mean_v - mean)^2), every term >= 0. (A `tl.reduce` with
    # Chan's pairwise merge, which divides at every step, measured slower.)
    # Chunk 0, which the planner makes whole, is taken first: it gives k;
    # elements past N count n = 0 and add nothing. With PRESUM 1 a group is
    # one lane and chunk 0 holds only its k, so x - k = 0: chunk 0 adds
    # nothing to s1 and s2, and the code that would add it is left out.
    groups = _lane_groups(BLOCK_N, PRESUM)
    if CENTER:
        load, inside, body = _skewed_lanes(groups, skew, n, N, SKEW)
        x0 = _long_row_chunk(X, R, S, groups, load, body, HAS_RESIDUAL)
        if SKEW:
            x0 = tl.where(inside, x0, 0.0)
        first_lane = tl.arange(0, PRESUM)[None, :] == 0
        k_v = tl.sum(tl.where(first_lane, x0, 0.0), axis=1)
        if SKEW:   # a group that starts before the row takes k of the row's first element
            k_row = tl.sum(tl.sum(tl.where(groups == skew, x0, 0.0), axis=1), axis=0)
            k_v = tl.where(tl.sum(tl.where(first_lane, groups, 0), axis=1) < skew, k_row, k_v)
        if PRESUM == 1:
            s1_v = tl.zeros([BLOCK_N], dtype=tl.float32)
            m2_v = tl.zeros([BLOCK_N], dtype=tl.float32)
        else:
            d0 = tl.where(inside, x0 - k_v[:, None], 0.0)
            s1_v = tl.sum(d0, axis=1)
            m2_v = tl.sum(d0 * d0, axis=1)
    else:
        m2_v = tl.zeros([BLOCK_N // PRESUM], dtype=tl.float32)
    first: tl.constexpr = BLOCK_N if CENTER else 0
    for start in tl.range(first, LANES, BLOCK_N, loop_unroll_factor=_unroll_factor(LANES - first, BLOCK_N, UNROLL)):
        cols = start + groups
        load, inside, body = _skewed_lanes(cols, skew, n, N, SKEW)
        x = _long_row_chunk(X, R, S, cols, load, body, HAS_RESIDUAL)
        if SKEW:
            x = tl.where(inside, x, 0.0)
        if CENTER:
            d = tl.where(inside, x - k_v[:, None], 0.0)
            s1_v += tl.sum(d, axis=1)
            m2_v += tl.sum(d * d, axis=1)
        else:
            m2_v += tl.sum(x * x, axis=1)
    if CENTER:
        # The chunks in which each lane holds an element: lane c those of
        # elements c - skew, c - skew + BLOCK_N, ... below N.
        n_v = (skew + N - 1 - groups) // BLOCK_N + 1
        if SKEW:
            n_v -= (groups < skew).to(tl.int32)
        n_v = tl.sum(tl.where(groups < skew + N, n_v, 0), axis=1).to(tl.float32)
        # One reciprocal per group, then multiplies, instead of two divisions:
        # a division is several instructions (its range fix-up).
        inv_n_v = 1.0 / tl.maximum(n_v, 1.0)
        mean_v = k_v + s1_v * inv_n_v
        m2_v -= s1_v * s1_v * inv_n_v
        mean = tl.sum(n_v * mean_v, axis=0) / N
        d_v = mean_v - mean
        m2 = tl.sum(m2_v + n_v * d_v * d_v, axis=0)
    else:
        mean = 0.0
        m2 = tl.sum(m2_v, axis=0)
    stats = (row // SPLITS) * stride_stats + 2 * (row % SPLITS)
    if not APPLY:   # GroupNorm's split statistics: merged by the launch that writes y
        tl.store(Mean + stats, mean)
        tl.store(Rstd + stats, m2)
    else:
        rstd = 1.0 / tl.sqrt(m2 / N + eps)
        tl.store(Rstd + stats, rstd)
        if CENTER:
            tl.store(Mean + stats, mean)
        # Pass 2, last chunk first (the one most likely still in L2): y.
        if HW > 0:
            lanes = groups   # GroupNorm: w and b per group (`_affine_index`)
        src = S if HAS_RESIDUAL else X   # the normalized input: s = x + r, or x
        last: tl.constexpr = (LANES - 1) // BLOCK_N * BLOCK_N
        for k in tl.range(0, LANES, BLOCK_N, loop_unroll_factor=_unroll_factor(LANES, BLOCK_N, UNROLL)):
            cols = (last - k) + lanes
            mask, _, store = _skewed_lanes(cols, skew, n, N, SKEW)
            x = tl.load(src + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            _long_row_y(x, Y, W, B, cols, store, mean, rstd, N, HW, PRESUM, OFFSET, CENTER, HAS_W, HAS_B, SKEW)
        if SKEW:   # the lanes in no whole vector, one by one: s (stored here, from x and r) and y
            cols, mask = _skew_edges(skew, N, SKEW)
            x = _long_row_chunk(X, R, S, cols, mask, mask, HAS_RESIDUAL)
            _long_row_y(x, Y, W, B, cols, mask, mean, rstd, N, HW, PRESUM, OFFSET, CENTER, HAS_W, HAS_B, SKEW)


@triton.jit
def _load_row_stats(Mean, Rstd, rows, M, CENTER: tl.constexpr, FOLD: tl.constexpr):
    """mean (0 without CENTER) and rstd of a tile's rows; 0 for rows past M.
    Without CENTER, FOLD makes the mean a constant 0, so that x - mean folds
    away; False keeps a run-time 0 (rstd * 0.0, which may be NaN for all the
    compiler knows) and the subtraction, for ptxas' sake only: see N_CONST in
    `_row_norm_bwd_kernel`."""
    rstd = tl.load(Rstd + rows, mask=rows < M, other=0.0)
    mean = tl.zeros_like(rstd) if FOLD else rstd * 0.0
    if CENTER:
        mean = tl.load(Mean + rows, mask=rows < M, other=0.0)
    return mean, rstd


@triton.jit
def _load_dy_xhat_g(X, DY, x_offs, dy_offs, mask, mean, rstd, w, CENTER: tl.constexpr, HAS_W: tl.constexpr,
                    EVICT: tl.constexpr, ZERO_MASKED: tl.constexpr, inside, SKEW: tl.constexpr):
    """dy, xhat = (x - mean) * rstd (`_xhat`) and g = dy * w of a tile of rows, in fp32
    (g = dy without a weight), x and dy loaded with the eviction policy EVICT
    ("": the default). Masked lanes load x = dy = 0, so their g = 0 and every
    term they add to a sum (dy * xhat, xhat * g, g) is 0. ZERO_MASKED also
    sets their xhat to 0 (a select per element), for ptxas' sake only: see
    N_CONST in `_row_norm_bwd_kernel`. With SKEW the loads are whole vectors
    (`_skewed_tile`) whose lanes outside the row (`inside` False) hold a
    neighbour's elements or bytes past the tensor: dy and xhat are set to 0
    there, two selects an element (None: `inside` unused)."""
    x = tl.load(X + x_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    dy = tl.load(DY + dy_offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    xhat = _xhat(x, mean[:, None], rstd[:, None], CENTER)
    if SKEW:
        dy = tl.where(inside, dy, 0.0)
        xhat = tl.where(inside, xhat, 0.0)
    elif ZERO_MASKED:
        xhat = tl.where(mask, xhat, 0.0)
    g = dy
    if HAS_W:
        g = dy * w[None, :]
    return dy, xhat, g


@triton.jit
def _accumulate(dw_acc, db_acc, dy, xhat, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr):
    """A tile's terms added to the dw (dy * xhat) and db (dy) accumulators asked for."""
    if COMPUTE_DW:
        dw_acc += dy * xhat
    if COMPUTE_DB:
        db_acc += dy
    return dw_acc, db_acc


@triton.jit
def _rms_dx(g, xhat, c1, rstd):
    """dx = rstd * (g - xhat * c1) of a tile's rows, without CENTER (no c2)."""
    return (g - xhat * c1[:, None]) * rstd[:, None]


@triton.jit
def _center_dx(g, xhat, c1, c2, rstd):
    """dx = rstd * (g - xhat * c1 - c2) of a tile's rows (CENTER), rstd taken
    into the row constants first: two FMAs an element, not an FMA, a
    subtraction and a multiply."""
    return g * rstd[:, None] - (c2 * rstd)[:, None] - xhat * (c1 * rstd)[:, None]


@triton.jit
def _tile_dx(g, xhat, c1, c2, rstd, CENTER: tl.constexpr):
    """dx of a tile's rows: `_center_dx` with CENTER, else `_rms_dx` (c2 unused)."""
    if CENTER:
        dx = _center_dx(g, xhat, c1, c2, rstd)
    else:
        dx = _rms_dx(g, xhat, c1, rstd)
    return dx


@triton.jit
def _store_dx(DX, DS, dx, rows, cols, M, N, stride_ds, stride_dx, HAS_DS: tl.constexpr, lanes, SKEW: tl.constexpr):
    """dx (+ ds with HAS_DS) of a tile's rows and columns, stored in DX's
    dtype; with SKEW, lanes `lanes` of rows of one skew (`_skewed_tile`)."""
    if HAS_DS:
        ds_offs, mask = _skewed_tile(rows, cols, M, N, stride_ds, lanes, SKEW)
        dx += tl.load(DS + ds_offs, mask=mask, other=0.0).to(tl.float32)
    dx_offs, mask = _skewed_tile(rows, cols, M, N, stride_dx, lanes, SKEW)
    tl.store(DX + dx_offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _store_sums(DWp, DBp, dw_acc, db_acc, pid, cols, N, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                skew, SKEW: tl.constexpr):
    """A program's dw and db accumulators, summed over their rows, to its row
    of DWp and DBp; with SKEW, lane c to column c - skew (the lanes in the row)."""
    offs, mask = pid.to(tl.int64) * N + cols, cols < N
    if SKEW:
        offs, mask = offs - skew, (cols >= skew) & (cols < skew + N)
    if COMPUTE_DW:
        tl.store(DWp + offs, tl.sum(dw_acc, axis=0).to(DWp.dtype.element_ty), mask=mask)
    if COMPUTE_DB:
        tl.store(DBp + offs, tl.sum(db_acc, axis=0).to(DBp.dtype.element_ty), mask=mask)


@triton.jit
def _tail_row_sum(t, t_tail, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """Row sums of a row held as a [ROWS, BLOCK_N] tile and a [ROWS, TAIL] tail
    (`_row_norm_bwd_kernel`'s TAIL). A thread holds BLOCK_N / TAIL times as
    many of the tile's elements as of the tail's, side by side: viewed as
    [ROWS, TAIL, BLOCK_N / TAIL], the tile is first summed in registers into
    the tail's shape, so that one reduction, not two, crosses the warps."""
    return tl.sum(tl.sum(tl.reshape(t, [ROWS, TAIL, BLOCK_N // TAIL]), axis=2) + t_tail, axis=1)


@triton.jit
def _row_norm_bwd_kernel(
    DY, X, W, Mean, Rstd, DS, DX, DWp, DBp,   # DY, X, DS, DX: (M, N); W: (N,); Mean, Rstd: (M,); DWp, DBp: (P, N) fp32
    M, N, stride_dy, stride_x, stride_ds, stride_dx, tiles_per_program,
    OFFSET: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_DS: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, RELOAD: tl.constexpr,
    W_PER_TILE: tl.constexpr, N_CONST: tl.constexpr, VEC: tl.constexpr, JOINT: tl.constexpr, TAIL: tl.constexpr,
    ALIGN: tl.constexpr, SKEW: tl.constexpr,
):
    """Row norm backward: dx = rstd * (g - xhat * c1 - c2) [+ ds], and dw, db partials.

    g = dy * (o + w), c1 = mean(xhat * g), c2 = mean(g) (CENTER only).
    dw = sum over rows of dy * xhat, db = sum over rows of dy: each program adds
    its rows into fp32 registers and writes one row of DWp / DBp.

    Grid: (P,), a persistent grid of about THREADS_PER_SM threads per SM (at
    most one program per tile; skewed or fp32, at most TILE_BWD_MAX_REGISTERS
    registers a thread, so that they fit side by side); with neither
    COMPUTE_DW nor COMPUTE_DB, one program per tile (tiles_per_program = 1,
    STAGES = 1), but with TAIL (FusedAdd's frozen rows: the persistent
    grid). Program p handles the [ROWS, BLOCK_N] tiles p, p + P, p + 2P, ...
    (tiles_per_program of them) of whole rows (BLOCK_N >= N; with TAIL,
    BLOCK_N + TAIL >= N).
    Pointers: DY, X, DX, DS are (M, N) with unit column stride (for
    FusedAddRMSNorm, X is the saved sum s and DS the gradient of s); W is (N,);
    Mean, Rstd are (M,) fp32; DWp, DBp are (P, N) fp32, contiguous, or with
    P = 1 dw and db themselves (`_sum_targets`).
    Dtypes: DX, DWp, DBp are written in their own dtype; DY, X, DS, W may each
    differ. fp32 math.

    Flags (each False removes code):
      COMPUTE_DX  the c1/c2 row reductions, the dx arithmetic and the DX stores.
      COMPUTE_DW  the dy * xhat accumulator ([ROWS, BLOCK_N] fp32 registers),
                  its multiply-adds and the DWp stores.
      COMPUTE_DB  the dy accumulator and the DBp stores.
      CENTER      the mean, c2 and their subtractions (RMSNorm has neither).
      HAS_W       the load of w: g = dy when there is no weight.
      HAS_DS      the load and add of ds (FusedAddRMSNorm's second output).
      OFFSET      o; o = 0 removes the add of o to w (`_load_scale`).
      STAGES      the software pipeline's depth over a program's tiles; 1
                  removes it and its shared-memory buffers.
      RELOAD      True loads x and dy a second time for dx, dw and db, after
                  the row reductions (from L1/L2: the first loads are marked
                  evict_last), instead of keeping them in registers through
                  the reductions; for rows too long to hold there beside the
                  dw accumulator under Triton 3.6 (RELOAD_ROW_BLOCK_MAX,
                  PIPED_ALL_TRITON). False removes the second loads.
      W_PER_TILE  True loads w for every tile (from L1/L2, or through the
                  pipeline with STAGES > 1) instead of once per program: its
                  BLOCK_N / (32 * num_warps) fp32 registers are free between
                  tiles. False removes the per-tile loads.
      N_CONST     0, or N as a compile-time constant, for the piped rows
                  (PIPED_ROW_MAX, PIPED_ALL_TRITON) and the frozen tiles of
                  short padded rows (NARROW_VEC_ELEMENTS): lanes past N fold
                  away, and dw and db are added before the row reductions
                  instead of after dx, so that x and dy need not live through
                  them. Where N fills the tile (N_CONST = BLOCK_N), also the
                  select that zeroes xhat's masked lanes (`_load_dy_xhat_g`):
                  ptxas (Triton 3.6) spills 128 bytes of RMSNorm's there with
                  it, none without, while in rows shorter than the tile it
                  spills more without it (at 9216: 112 bytes, against 40); and
                  there, and only there, RMSNorm's x - 0 stays (FOLD in
                  `_load_row_stats`): those 128-register loops measured slower
                  without it (NOTES.md, section 6). 0 keeps N a run-time
                  number (one compile serves every N of a tile).
      VEC         0, or the elements per vector load (PIPED_VEC_ELEMENTS,
                  NARROW_VEC_ELEMENTS): the columns are declared contiguous
                  in runs of VEC only, so Triton loads narrower vectors and
                  a thread's lanes repeat more often along the row, which
                  lets more of a padded tile fold away under N_CONST. 0
                  removes the hint.
    JOINT (with CENTER and COMPUTE_DX): a row's c1 and c2 sums reduced as one
    pair (`_add2`), one exchange between warps; False: a `tl.sum` each (see
    the JOINT rule beside LONG_BWD_MAX_REGISTERS).
    TAIL (0, or a power of two from PADDED_TAIL_BLOCK_N to TWO_ACC_TAIL_MAX;
    ROWS = 1, without RELOAD, N_CONST and JOINT): the row is a full tile of
    BLOCK_N columns and a tail tile of TAIL columns after it (BLOCK_N < N <=
    BLOCK_N + TAIL), each with its own accumulators, instead of one tile of
    2 * BLOCK_N with masked lanes; the tail's c1 terms (with CENTER, and
    c2's) are added to the tile's in registers before each reduction
    (`_tail_row_sum`). 0 removes the tail's loads, sums and stores.
    ALIGN: `_aligned`'s hint, a power of two dividing N and the row strides; 1 removes it.
    SKEW (0, or the elements of a 16-byte vector, `_row_skew`: odd rows;
    without TAIL, RELOAD, N_CONST, VEC and W_PER_TILE): rows SKEW apart lie
    alike against a vector, so program p takes the rows r with r % SKEW =
    p % SKEW, in tiles of ROWS such rows: that class's tiles p // SKEW,
    p // SKEW + P / SKEW, ... (P a multiple of SKEW; tiles_per_program
    counts the class's tiles). Each row is read in whole vectors from the
    boundary at or below its start, `skew` lanes before it (`_skewed_tile`),
    W is the class's copy of w (`_skewed_copies`), the lanes outside the
    row are set to 0 (`_load_dy_xhat_g`), dx is stored in whole vectors and
    its at most 2 (SKEW - 1) other lanes one by one (`_skew_edges`), and the
    dw and db sums leave lane c for column c - skew (`_store_sums`), so the
    accumulators keep one lane frame for all of a program's rows. 0 removes
    it all: a lane a column, loads in vectors only where ALIGN allows.
    """
    N, stride_dy, stride_x = _aligned(N, ALIGN), _aligned(stride_dy, ALIGN), _aligned(stride_x, ALIGN)
    stride_ds, stride_dx = _aligned(stride_ds, ALIGN), _aligned(stride_dx, ALIGN)
    if N_CONST:
        N = N_CONST   # the row length as a compile-time constant
    tl.static_assert(TAIL == 0 or (ROWS == 1 and not RELOAD and not N_CONST and not JOINT))
    tl.static_assert(SKEW == 0 or not (TAIL or RELOAD or N_CONST or VEC or W_PER_TILE))
    padded: tl.constexpr = N_CONST != BLOCK_N   # the row may leave lanes of the tile empty (see N_CONST)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = _tile_columns(BLOCK_N, VEC)
    # With a tail the tile lies inside the row: BLOCK_N as its bound folds the column tests away.
    n_tile = BLOCK_N if TAIL else N
    tail = BLOCK_N + tl.arange(0, TAIL if TAIL else 1)   # the tail's columns (unused without TAIL)
    first, step = pid, num_programs   # the program's first tile, and the step to its next
    skew, load, inside, body, n_w = 0, None, None, None, n_tile   # SKEW's (0 and None: unused without it)
    if SKEW:   # the tiles of the program's class, and its rows' lanes
        first, step, cls = pid // SKEW, num_programs // SKEW, pid % SKEW
        skew, n_w, load, inside, body = _class_lanes(cols, cls, stride_x, N, SKEW)
        if HAS_W:
            W = _skewed_copy(W, skew, N, SKEW)
    if HAS_W and not W_PER_TILE:
        w_held = _load_scale(W, cols, n_w, OFFSET)   # in registers through the loop
        if TAIL:
            w_tail = _load_scale(W, tail, N, OFFSET)
    # The accumulators are tiles, summed over their rows once at the end: a
    # sum over the rows of every tile would cross warps (a shared-memory
    # round trip and a barrier per tile) when a tile holds several rows.
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32) if COMPUTE_DW else 0.0   # 0.0: a placeholder, unused
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32) if COMPUTE_DB else 0.0
    dw_tail = tl.zeros([ROWS, TAIL], dtype=tl.float32) if COMPUTE_DW and TAIL else 0.0
    db_tail = tl.zeros([ROWS, TAIL], dtype=tl.float32) if COMPUTE_DB and TAIL else 0.0
    for i in tl.range(0, tiles_per_program, num_stages=STAGES):
        rows = (first + i * step) * ROWS + tl.arange(0, ROWS)
        if SKEW:
            rows = rows * SKEW + cls   # the class's rows
        mean, rstd = _load_row_stats(Mean, Rstd, rows, M, CENTER, padded)
        x_offs, mask = _skewed_tile(rows, cols, M, n_tile, stride_x, load, SKEW)
        dy_offs, _ = _skewed_tile(rows, cols, M, n_tile, stride_dy, load, SKEW)
        w = 1.0   # a placeholder, unused without HAS_W
        if HAS_W:
            w = _load_scale(W, cols, n_tile, OFFSET) if W_PER_TILE else w_held
        dy, xhat, g = _load_dy_xhat_g(X, DY, x_offs, dy_offs, mask, mean, rstd, w, CENTER, HAS_W,
                                      "evict_last" if RELOAD else "", padded and not TAIL, inside, SKEW)
        if TAIL:
            xt_offs, tail_mask = _tile(rows, tail, M, N, stride_x)
            dyt_offs, _ = _tile(rows, tail, M, N, stride_dy)
            wt = 1.0
            if HAS_W:
                wt = _load_scale(W, tail, N, OFFSET) if W_PER_TILE else w_tail
            dy_t, xhat_t, g_t = _load_dy_xhat_g(X, DY, xt_offs, dyt_offs, tail_mask, mean, rstd, wt, CENTER, HAS_W,
                                                "", True, None, 0)
            dw_tail, db_tail = _accumulate(dw_tail, db_tail, dy_t, xhat_t, COMPUTE_DW, COMPUTE_DB)
        if N_CONST:   # dw and db first: past the row reductions only xhat and g stay live
            dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, COMPUTE_DW, COMPUTE_DB)
        if COMPUTE_DX:
            c2 = 0.0   # a placeholder, unused without CENTER
            if TAIL:
                c1 = _tail_row_sum(xhat * g, xhat_t * g_t, ROWS, BLOCK_N, TAIL) / N
                if CENTER:
                    c2 = _tail_row_sum(g, g_t, ROWS, BLOCK_N, TAIL) / N
                dx_t = _tile_dx(g_t, xhat_t, c1, c2, rstd, CENTER)
                _store_dx(DX, DS, dx_t, rows, tail, M, N, stride_ds, stride_dx, HAS_DS, None, 0)
            elif CENTER and JOINT:
                sum_xhat_g, sum_g = tl.reduce((xhat * g, g), 1, _add2)
                c1 = sum_xhat_g / N
                c2 = sum_g / N
            else:
                c1 = tl.sum(xhat * g, axis=1) / N
                if CENTER:
                    c2 = tl.sum(g, axis=1) / N
            if RELOAD:
                dy, xhat, g = _load_dy_xhat_g(X, DY, x_offs, dy_offs, mask, mean, rstd, w, CENTER, HAS_W,
                                              "evict_first", True, None, 0)
            dx = _tile_dx(g, xhat, c1, c2, rstd, CENTER)
            _store_dx(DX, DS, dx, rows, cols, M, n_tile, stride_ds, stride_dx, HAS_DS, body, SKEW)
            if SKEW:   # the lanes in no whole vector, one by one, from loads of their own
                e_cols, e_lanes = _skew_edges(skew, N, SKEW)
                ex_offs, e_mask = _skewed_tile(rows, e_cols, M, N, stride_x, e_lanes, SKEW)
                edy_offs, _ = _skewed_tile(rows, e_cols, M, N, stride_dy, e_lanes, SKEW)
                w_e = _load_scale(W, e_cols, n_w, OFFSET) if HAS_W else 1.0
                _, xhat_e, g_e = _load_dy_xhat_g(X, DY, ex_offs, edy_offs, e_mask, mean, rstd, w_e, CENTER, HAS_W,
                                                 "", False, None, 0)
                dx_e = _tile_dx(g_e, xhat_e, c1, c2, rstd, CENTER)
                _store_dx(DX, DS, dx_e, rows, e_cols, M, N, stride_ds, stride_dx, HAS_DS, e_lanes, SKEW)
        if not N_CONST:
            dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, COMPUTE_DW, COMPUTE_DB)
    _store_sums(DWp, DBp, dw_acc, db_acc, pid, cols, N, COMPUTE_DW, COMPUTE_DB, skew, SKEW)
    if TAIL:
        _store_sums(DWp, DBp, dw_tail, db_tail, pid, tail, N, COMPUTE_DW, COMPUTE_DB, 0, 0)


@triton.jit
def _load_x_g(X, DY, W, cols, N, OFFSET: tl.constexpr, HAS_W: tl.constexpr, EVICT: tl.constexpr,
              HW: tl.constexpr, skew, n_lanes, SKEW: tl.constexpr):
    """x and g = dy * (o + w) of a chunk of one row of N, in fp32; x and dy
    loaded with the eviction policy EVICT; w as `_affine_index` says (HW).
    Lanes past N have x = g = 0, so they add nothing to sums of g or x * g.
    With SKEW the row is read by `_skewed_row` (its skew and n_lanes), and
    so are the copies of w (`_row_skew`): lanes outside the row are 0 too."""
    mask, inside, _ = _skewed_lanes(cols, skew, n_lanes, N, SKEW)
    x = tl.load(X + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    g = tl.load(DY + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if SKEW:
        x = tl.where(inside, x, 0.0)
        g = tl.where(inside, g, 0.0)
        if HAS_W:
            g = g * _load_scale(W, cols, _skewed_copy_length(N, SKEW), OFFSET)
    elif HAS_W:
        index, n = _affine_index(cols, N, HW)
        w = _load_scale(W, index, n, OFFSET)
        if _spans_channels(HW, cols.shape[-1]):   # a group's elements in the next channel take its w
            w = tl.where(_in_next_channel(cols, index, HW), _load_scale(W, index + 1, n, OFFSET), w)
        g = g * w
    return x, g


@triton.jit
def _dx_constants(c1, c2, mean, rstd, CENTER: tl.constexpr):
    """The row constants k1, k0 of dx = rstd * (g - xhat * c1 - c2) regrouped
    with x uncentred, dx = rstd * g + k1 * x + k0: k1 = -rstd^2 * c1 and k0 =
    -rstd * c2, less mean * k1 with CENTER (k1 * xc = k1 * x - mean * k1).
    The long-row and GroupNorm backwards' pass 2."""
    k1 = -rstd * rstd * c1
    k0 = -rstd * c2
    if CENTER:
        k0 -= mean * k1
    return k1, k0


@triton.jit
def _group_channel_sums(X, DY, W, DWp, DBp, c_first, out, n_c, HW, mean, rstd,
                        HAS_W: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                        BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr,
                        UNROLL_FACTOR: tl.constexpr):
    """Pass 1 of a GroupNorm backward whose w or b trains (section 7): for
    each of n_c channels c, A[c] = rstd * sum_hw dy * (x - mean) and D[c] =
    sum_hw dy, stored to DWp[out + c] and DBp[out + c] (COMPUTE_DW,
    COMPUTE_DB). Returns the row sums they give, sum(xhat * g) = sum_c w[c] *
    A[c] and sum(g) = sum_c w[c] * D[c] (w = 1 without HAS_W).

    X, DY point at the first channel's first element, the n_c channels of HW
    positions contiguous from there; channel c's w is W[c_first + c]. Tiles
    are [BLOCK_C, BLOCK_HW], accumulated per lane over a block of channels'
    HW positions (a STAGES-deep pipeline, that loop's `loop_unroll_factor`
    UNROLL_FACTOR, 1 for the compiler's choice; loads with eviction policy
    EVICT) and reduced once per block: a reduction per tile is slower (and Triton
    3.6 fails to compile it here). Used by GroupNorm's own backward (a
    split's channels) and by `_long_row_norm_bwd_kernel` (a row's).
    """
    sum_xhat_g = tl.full([], 0.0, tl.float32)
    sum_g = sum_xhat_g
    for c0 in range(0, n_c, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        A_tile = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        D_tile = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        for h0 in tl.range(0, HW, BLOCK_HW, num_stages=STAGES, loop_unroll_factor=UNROLL_FACTOR):
            offs, mask = _tile(c, h0 + tl.arange(0, BLOCK_HW), n_c, HW, HW)
            x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
            A_tile += dy * x   # dy = 0 where masked
            D_tile += dy
        D = tl.sum(D_tile, axis=1)
        A = (tl.sum(A_tile, axis=1) - mean * D) * rstd   # sum dy * (x - mean), the mean taken out
        if HAS_W:
            w = _load_vector(W, c_first + c, c_first + n_c)
            A_w = A * w
            D_w = D * w
        else:
            A_w = A
            D_w = D
        sum_xhat_g += tl.sum(A_w, axis=0)
        sum_g += tl.sum(D_w, axis=0)
        if COMPUTE_DW:
            tl.store(DWp + out + c, A.to(DWp.dtype.element_ty), mask=c < n_c)
        if COMPUTE_DB:
            tl.store(DBp + out + c, D.to(DBp.dtype.element_ty), mask=c < n_c)
    return sum_xhat_g, sum_g


@triton.jit
def _long_row_norm_bwd_kernel(
    DY, X, W, Mean, Rstd, DS, DX, DWp, DBp, K,   # DY, X, DS, DX: (M, N); W: (N,); Mean, Rstd: (M,); K: (M, 2) fp32
    stride_dy, stride_x, stride_ds, stride_dx, stride_stats, G,
    N: tl.constexpr, OFFSET: tl.constexpr,
    CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_DS: tl.constexpr, BLOCK_N: tl.constexpr,
    PRESUM: tl.constexpr, HW: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, JOINT: tl.constexpr, UNROLL: tl.constexpr, UNROLL_SUMS: tl.constexpr,
    ALIGN: tl.constexpr, SKEW: tl.constexpr, CONSTANTS_ONLY: tl.constexpr,
):
    """dx of rows longer than ROW_BLOCK_MAX (dw/db: `_row_norm_dwdb_kernel`),
    unless the tile kernel takes them with RELOAD (see `_row_norm_backward`).

    The delta on `_row_norm_bwd_kernel` is that of `_long_row_norm_fwd_kernel`
    on the forward: one row per program, pass 1 accumulates x * g (and g, for
    CENTER) per lane and reduces to c1 (and c2) once at the end; pass 2 reads x
    and dy again, last chunk first and mostly from L2, and writes dx. There is
    no dw/db accumulator for the row norms: one N wide would not fit in
    registers. (GroupNorm's dw and db are per channel, sums within a row.)

    rstd and the mean are row constants, so both are taken out of the
    passes: c1 = rstd * (sum(x * g) - mean * sum(g)) / N, and dx = rstd * g +
    k1 * x + k0 with the row constants k1 = -rstd^2 * c1 and k0 = -rstd * c2
    - mean * k1: two fused multiply-adds per element once g is known, and no
    x - mean. Instructions are not free here: at the copy's bandwidth this
    kernel's take about half the SMs' issue slots (unpacking bf16 alone is
    one per element and tensor), and the fewer multiplies, then the dropped
    subtractions, measured faster (NOTES.md, sections 2 and 6). The price
    is rounding: x * g and mean * k1 are rounded at the size of x, not of x -
    mean, which matters where the mean is large against the spread; there
    the mean's own rounding (about 6e-8 * |mean| in fp32) bounds dx's error
    in either form, and this one's measured a little larger (NOTES.md,
    section 6). PyTorch's CUDA GroupNorm backward takes x uncentred too:
    per-channel sums of dy * x and dy, and dx = a * dy + b * x + c.

    Grid: (M,), launched with at most LONG_BWD_MAX_REGISTERS registers per
    thread (LONG_BWD_SPILL_MAX_REGISTERS for fp32 rows and where ptxas spills
    under that; see the constants).
    Pointers and dtypes as `_row_norm_bwd_kernel`, but DWp and DBp
    (GroupNorm's only, below) and K (CONSTANTS_ONLY's only, below).
    N is a compile-time constant (see `_long_row_norm_fwd_kernel`), and so is
    the offset o, as in every row kernel (`_load_scale`): here a runtime o
    measured slower (NOTES.md, section 6).
    Flags: CENTER, HAS_W, HAS_DS as in `_row_norm_bwd_kernel`. There is no
    COMPUTE_DX: the wrapper does not launch this kernel when dx is not needed.
    PRESUM: consecutive elements added before pass 1's per-lane sums
    (LONG_PRESUM, or 1, which removes the pre-sum: see the constant); a
    power of two up to BLOCK_N, in registers when a thread holds that many
    (LONG_ELEMENTS_PER_THREAD).
    JOINT (with CENTER, per-lane sums): pass 1's two sums reduced as one
    pair (`_add2`), one exchange between warps; False keeps two `tl.sum`,
    each with its own (see the JOINT rule beside LONG_BWD_MAX_REGISTERS).
    HW, G, stride_stats, UNROLL: as in `_long_row_norm_fwd_kernel` (UNROLL
    applies to the per-lane pass 1 and to pass 2).
    UNROLL_SUMS: pass 1 alone unrolled whole: the per-lane sums' chunks (see
    UNROLL_SUMS_MAX_CHUNKS), or with COMPUTE_DW or COMPUTE_DB the channel
    sums' tiles over a block of channels' HW positions (see
    GROUP_SUMS_UNROLL_MAX_STEPS); False leaves its loop to the compiler.
    SKEW: as in `_long_row_norm_fwd_kernel` (the row norms' only): rows of
    DY, X, DS, DX read and written in whole vectors from the boundary below
    each, W a copy per skew, x and g zeroed outside the row (`_load_x_g`),
    the lanes in no whole vector stored one by one after pass 2. 0 removes it.
    COMPUTE_DW, COMPUTE_DB: GroupNorm's rows only (False for the row norms,
    which removes the code). With either, pass 1 goes by channels instead of
    per lane: `_group_channel_sums` over [BLOCK_C, BLOCK_HW] tiles,
    storing A[c], D[c] into row (sample) of the (B, C) fp32 DWp, DBp (with
    B = 1, dw and db themselves: `_sum_targets`). BLOCK_C, BLOCK_HW: that
    tile (`_group_long_sum_tile`; 1 where neither trains).
    ALIGN: `_aligned`'s hint, a power of two dividing the row strides; 1 removes it.
    CONSTANTS_ONLY (the row norms' trained rows of COLUMNS_DX_ROW_BYTES and
    more; not with SKEW): pass 1 alone, storing the row's k1 and k0 (below)
    into row `row` of K, (M, 2) fp32, for `_row_norm_dwdb_kernel`'s
    COMPUTE_DX, which writes dx; False removes that store, True removes
    pass 2 (DS and DX are not touched).
    """
    stride_dy, stride_x = _aligned(stride_dy, ALIGN), _aligned(stride_x, ALIGN)
    stride_ds, stride_dx = _aligned(stride_ds, ALIGN), _aligned(stride_dx, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    base, skew, n = _skewed_row(row * stride_x, N, SKEW)
    X += base
    DY += _skewed_base(row * stride_dy, SKEW)
    DX += _skewed_base(row * stride_dx, SKEW)
    if HAS_DS:
        DS += _skewed_base(row * stride_ds, SKEW)
    if HW > 0 and HAS_W:   # GroupNorm: the row's group's channels of w
        W += (row % G) * (N // HW)
    if SKEW and HAS_W:   # the copy of w that starts `skew` lanes in
        W += skew * _skewed_copy_length(N, SKEW)
    LANES: tl.constexpr = _lanes_walked(N, SKEW)
    rstd = tl.load(Rstd + row * stride_stats)
    mean = 0.0
    if CENTER:
        mean = tl.load(Mean + row * stride_stats)
    lanes = tl.arange(0, BLOCK_N)
    # Pass 1: c1 = mean(xhat * g) and, for CENTER, c2 = mean(g). Unless
    # GroupNorm's w or b trains (the first branch), from per-lane sums of
    # x * g and g: a chunk is viewed as [BLOCK_N / PRESUM, PRESUM], PRESUM
    # consecutive elements in one thread, which adds them in registers (no
    # shuffle, no barrier) before its lane sum: one float per thread and sum
    # instead of PRESUM.
    sum_lanes = _lane_groups(BLOCK_N, PRESUM)
    if COMPUTE_DW or COMPUTE_DB:
        # GroupNorm with w or b trained: the row's channels, one reduction per
        # block of them; row * Cg = sample * C + the group's first channel.
        sum_xhat_g, sum_g = _group_channel_sums(
            X, DY, W, DWp, DBp, 0, row * (N // HW), N // HW, HW, mean, rstd, HAS_W, COMPUTE_DW, COMPUTE_DB,
            BLOCK_C, BLOCK_HW, 1, "evict_last", _unroll_factor(HW, BLOCK_HW, UNROLL_SUMS))
        c1 = sum_xhat_g / N
        c2 = sum_g / N
    else:
        sum_x_g = tl.zeros([BLOCK_N // PRESUM], dtype=tl.float32)
        if CENTER:
            sum_g = tl.zeros([BLOCK_N // PRESUM], dtype=tl.float32)
        for start in tl.range(0, LANES, BLOCK_N,
                              loop_unroll_factor=_unroll_factor(LANES, BLOCK_N, UNROLL or UNROLL_SUMS)):
            x, g = _load_x_g(X, DY, W, start + sum_lanes, N, OFFSET, HAS_W, "evict_last", HW, skew, n, SKEW)
            sum_x_g += tl.sum(x * g, axis=1)
            if CENTER:
                sum_g += tl.sum(g, axis=1)
        if CENTER and JOINT:
            total_x_g, total_g = tl.reduce((sum_x_g, sum_g), 0, _add2)
        else:
            total_x_g = tl.sum(sum_x_g, axis=0)
            total_g = 0.0
            if CENTER:
                total_g = tl.sum(sum_g, axis=0)
        if CENTER:   # sum(xc * g) = sum(x * g) - mean * sum(g): no x - mean per element
            total_x_g -= mean * total_g
        c1 = total_x_g * rstd / N
        c2 = total_g / N
    # Pass 2, last chunk first (the one most likely still in L2): dx =
    # rstd * (g - xhat * c1 - c2), regrouped as rstd * g + k1 * x + k0.
    k1, k0 = _dx_constants(c1, c2, mean, rstd, CENTER)
    if CONSTANTS_ONLY:   # dx by columns, after this kernel
        tl.store(K + row * 2, k1)
        tl.store(K + row * 2 + 1, k0)
    else:
        if HW > 0:
            lanes = sum_lanes   # GroupNorm: w per group (`_affine_index`)
        last: tl.constexpr = (LANES - 1) // BLOCK_N * BLOCK_N
        for k in tl.range(0, LANES, BLOCK_N, loop_unroll_factor=_unroll_factor(LANES, BLOCK_N, UNROLL)):
            cols = (last - k) + lanes
            x, g = _load_x_g(X, DY, W, cols, N, OFFSET, HAS_W, "evict_first", HW, skew, n, SKEW)
            mask, _, body = _skewed_lanes(cols, skew, n, N, SKEW)
            _long_row_dx(x, g, DS, DX, cols, cols, mask, body, rstd, k1, k0, HAS_DS, "evict_first")
        if SKEW:   # the lanes in no whole vector, one by one
            cols, mask = _skew_edges(skew, N, SKEW)
            x, g = _load_x_g(X, DY, W, cols, N, OFFSET, HAS_W, "evict_first", HW, skew, n, SKEW)
            _long_row_dx(x, g, DS, DX, cols, cols, mask, mask, rstd, k1, k0, HAS_DS, "evict_first")


@triton.jit
def _long_row_dx(x, g, DS, DX, ds_offs, dx_offs, mask, store_mask, rstd, k1, k0, HAS_DS: tl.constexpr,
                 DS_EVICT: tl.constexpr):
    """dx = rstd * g + k1 * x + k0 (+ ds, loaded where mask with the eviction
    policy DS_EVICT) from the row constants of `_dx_constants`, stored where
    store_mask: pass 2 of the long-row backward (a chunk of lanes of one
    row), and the dw/db kernel's COMPUTE_DX (a tile of rows, rstd, k1 and k0
    broadcast by row)."""
    dx = g * rstd + (x * k1 + k0)
    if HAS_DS:
        dx += tl.load(DS + ds_offs, mask=mask, other=0.0, eviction_policy=DS_EVICT).to(tl.float32)
    tl.store(DX + dx_offs, dx.to(DX.dtype.element_ty), mask=store_mask)


@triton.jit
def _row_norm_dwdb_kernel(
    DY, X, W, Mean, Rstd, K, DS, DX, DWp, DBp,   # DY, X, DS, DX: (M, N); K: (M, 2) fp32; DWp, DBp: (S, N) fp32
    M, N, stride_dy, stride_x, stride_ds, stride_dx, rows_per_split,
    OFFSET: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr, HAS_DS: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, LAST_FIRST: tl.constexpr,
    ALIGN: tl.constexpr, SKEW: tl.constexpr,
):
    """Partial dw = sum of dy * xhat and db = sum of dy over a slice of rows,
    for long rows; with COMPUTE_DX, rows too long for L2
    (COLUMNS_DX_ROW_BYTES), dx of the same tiles on the way.

    The delta on `_row_norm_bwd_kernel`'s accumulators: the loops are swapped.
    Each program owns BLOCK_N columns and walks BLOCK_M rows at a time, so its
    accumulator is a register tile of any row length. The price is a second
    read of x and dy (no c1/c2 is needed here, so nothing else is recomputed).
    With COMPUTE_DX that read is also dx's: dx = rstd * g + k1 * x + k0 (g =
    dy * (o + w), `_long_row_dx`), from the row constants k1, k0 that
    `_long_row_norm_bwd_kernel` (CONSTANTS_ONLY) stored in K. So x and dy
    are read twice in all, once for the row sums and once here, where the
    long-row kernel's pass 2 would read them again (from DRAM, on such
    rows) and this kernel a third time.

    Grid: (cdiv(N, BLOCK_N), S); program (j, s) sums rows [s * rows_per_split,
    (s + 1) * rows_per_split) of column block j into row s of DWp and DBp,
    BLOCK_M rows at a time, from the last block to the first (LAST_FIRST:
    launched after the dx kernel, or the row sums' with COMPUTE_DX, which
    ended on the last rows, whose x and dy may still be in L2) or from the
    first to the last (launched beside it, `_run_beside`: both read the same
    rows at about the same time).
    Pointers: DY, X (M, N) with unit column stride; Mean, Rstd (M,) fp32;
    DWp, DBp contiguous (S, N) fp32, or with S = 1 dw and db themselves
    (`_sum_targets`), written in their dtype. COMPUTE_DX's alone: W (N,),
    K (M, 2) fp32 contiguous, DS and DX (M, N) with unit column stride and
    row strides stride_ds, stride_dx. Any float dtypes for DY, X, W and DS;
    dx is written in DX's.
    Flags: COMPUTE_DW / COMPUTE_DB False removes that accumulator and its
    store; COMPUTE_DX False removes w, K, DS, DX and dx's arithmetic (x is
    then loaded only for dw); CENTER False removes the mean (RMSNorm);
    OFFSET, HAS_W, HAS_DS as in `_row_norm_bwd_kernel` (COMPUTE_DX's only).
    STAGES is the software pipeline's depth over the row blocks. LAST_FIRST:
    the order of the rows (above).
    ALIGN: `_aligned`'s hint, a power of two dividing N and the row strides; 1 removes it.
    SKEW (0, or the elements of a 16-byte vector, `_row_skew`: odd rows; not
    with COMPUTE_DX):
    the grid is (cdiv(N + SKEW - 1, BLOCK_N), S * SKEW), program (j, s)
    summing the rows r of slice s // SKEW with r % SKEW = s % SKEW (rows
    SKEW apart lie alike against a vector; rows_per_split a multiple of
    SKEW * BLOCK_M) into row s. Each row is read in whole vectors from the
    boundary at or below its start (`_skewed_tile`), lane c of column block
    j holding column j * BLOCK_N + c - skew; the lanes outside the row sum
    a neighbour's elements, or bytes past the tensor, into accumulators of
    their own, which no store writes, so no select is needed. 0 removes it.
    """
    N, stride_dy, stride_x = _aligned(N, ALIGN), _aligned(stride_dy, ALIGN), _aligned(stride_x, ALIGN)
    stride_ds, stride_dx = _aligned(stride_ds, ALIGN), _aligned(stride_dx, ALIGN)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    first, step, skew, load, lanes = 0, 1, 0, None, cols   # SKEW's (unused without it)
    if SKEW:   # the rows of one class of the slice split // SKEW
        first, step = split % SKEW, SKEW
        skew = _class_skew(first, stride_x, SKEW)
        load = cols < _vector_lanes(skew, N, SKEW)   # the row's whole vectors
        lanes = cols - skew   # the columns the lanes hold
    row_start = split // step * rows_per_split
    row_end = tl.minimum(M, row_start + rows_per_split)
    blocks = tl.cdiv(tl.cdiv(row_end - row_start - first, step), BLOCK_M)
    scale = 1.0
    if COMPUTE_DX and HAS_W:
        scale = _load_scale(W, cols, N, OFFSET)[None, :]
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in tl.range(0, blocks, num_stages=STAGES):
        block = i
        if LAST_FIRST:
            block = blocks - 1 - i
        rows = row_start + first + (block * BLOCK_M + tl.arange(0, BLOCK_M)) * step
        mean, rstd = _load_row_stats(Mean, Rstd, rows, row_end, CENTER, True)   # dw's and dx's alone
        if COMPUTE_DX:   # the rows' dx constants
            k1 = tl.load(K + rows * 2, mask=rows < row_end, other=0.0)[:, None]
            k0 = tl.load(K + rows * 2 + 1, mask=rows < row_end, other=0.0)[:, None]
        dy_offs, mask = _skewed_tile(rows, cols, row_end, N, stride_dy, load, SKEW)
        dy = tl.load(DY + dy_offs, mask=mask, other=0.0).to(tl.float32)
        if COMPUTE_DW or COMPUTE_DX:
            x_offs, _ = _skewed_tile(rows, cols, row_end, N, stride_x, load, SKEW)
            x = tl.load(X + x_offs, mask=mask, other=0.0).to(tl.float32)
        if COMPUTE_DX:
            ds_offs, _ = _tile(rows, cols, row_end, N, stride_ds)
            dx_offs, _ = _tile(rows, cols, row_end, N, stride_dx)
            _long_row_dx(x, dy * scale, DS, DX, ds_offs, dx_offs, mask, mask, rstd[:, None], k1, k0, HAS_DS, "")
        if COMPUTE_DW:
            dw_acc += dy * tl.where(mask, _xhat(x, mean[:, None], rstd[:, None], CENTER), 0.0)
        if COMPUTE_DB:
            db_acc += dy
    out, in_row = split.to(tl.int64) * N + lanes, lanes < N
    if SKEW:
        in_row = in_row & (lanes >= 0)
    if COMPUTE_DW:
        tl.store(DWp + out, tl.sum(dw_acc, axis=0).to(DWp.dtype.element_ty), mask=in_row)
    if COMPUTE_DB:
        tl.store(DBp + out, tl.sum(db_acc, axis=0).to(DBp.dtype.element_ty), mask=in_row)


def _row_norm_outputs(x, residual, center, N):
    """What `_row_norm_forward` returns, allocated: y and s (or None) shaped as
    x, contiguous (row stride N), mean (or None) and rstd, (M,) fp32."""
    M = x.numel() // N
    y = _empty_like(x)
    s = _empty_like(x) if residual is not None else None
    mean = torch.empty((M,), dtype=torch.float32, device=x.device) if center else None
    return y, s, mean, torch.empty((M,), dtype=torch.float32, device=x.device)


@_launcher
def _row_norm_forward(x, residual, weight, bias, eps, offset, center, N):
    """Launches the row forward on the rows of N elements of x (and of residual).

    Returns y, s, mean, rstd (`_row_norm_outputs`).
    """
    y, s, mean, rstd = _row_norm_outputs(x, residual, center, N)
    x, M, stride_x = _as_rows(x, N)
    stride_r = 0
    if residual is not None:
        residual, _, stride_r = _as_rows(residual, N)
    if M == 0:
        return y, s, mean, rstd
    strides = (stride_x, stride_r, 0 if s is None else N, N)
    skew = _row_skew(N, strides, (x, residual, s, y))
    # Odd rows a tile would hold, in the long-row kernel (SKEW_TILE_ROW_MIN, SKEW_RESIDUAL_FWD_ROW_MIN).
    skewed = skew > 0 and N >= (SKEW_TILE_ROW_MIN if residual is None else SKEW_RESIDUAL_FWD_ROW_MIN)
    if residual is None:
        t, vec = _narrow_forward(x, M, N, stride_x, center)   # one tile in narrower vectors, or:
        if not vec:
            # PADDED_TILE_WARPS for LayerNorm's padded rows, RMS_PADDED_CHUNK_MIN for RMSNorm's.
            plan = dict(padded_long=True, padded_tile=center, padded_floor=_padded_floor(x, center),
                        skewed=skewed)
            # Long rows: LayerNorm's two sums by WHOLE_MAX_CHUNKS, RMSNorm's one by LONG_WIDE_CHUNK_MAX.
            t = (_few_whole_chunks if center else _wide_chunks)(_row_tiling(M, N, **plan), x, M, N, **plan)
            t = _unhalved_chunks(t, x, N, 2 if center else 1)   # HALVED_MAX_CHUNKS
            if center:   # LayerNorm's padded tiles of short rows: N_CONST, NARROW_VEC_ELEMENTS
                vec = _short_narrow_vec(t, N, (x,), (stride_x,))
    else:   # FusedAdd's forward holds longer rows in a tile (RESIDUAL_ROW_BLOCK_MAX), 16-byte vectors; one sum
        plan = dict(block_max=RESIDUAL_ROW_BLOCK_MAX, skewed=skewed)
        t, vec = _wide_chunks(_row_tiling(M, N, **plan), x, M, N, **plan), 0
    # Odd rows a tile holds (too short for the long-row kernel): read skewed
    # there (`_row_norm_fwd_kernel`'s SKEW), in a tile with room for the
    # lanes before a row, where that measured faster: FusedAdd's from
    # SKEW_RESIDUAL_TILE_FWD_ROW_MIN, RMSNorm's where that room is the row's
    # own tile, of SKEW_TILE_BLOCK_MIN lanes or more; not LayerNorm's.
    tile_skew = 0
    if skew and t.one_pass and not vec and not center:
        room = _skewed_tiles(M, N, skew, **plan)
        if room and (N >= SKEW_RESIDUAL_TILE_FWD_ROW_MIN if residual is not None
                     else room.block_n == t.block_n >= SKEW_TILE_BLOCK_MIN):
            t, tile_skew = room, skew
    # A row that fills its tile: FULL_TILE_ELEMENTS_PER_THREAD, at TILE_ELEMENTS RMSNorm's and
    # LayerNorm's fp32 rows alone; those LayerNorm rows load w and b first (W_FIRST). LayerNorm's
    # 16-bit rows of TILE_ELEMENTS measured faster with neither, and its tiles of ROW_BLOCK_MAX,
    # holding w and b from the start, take more registers than fit its programs.
    fills = t.one_pass and N == t.block_n and not (vec or tile_skew)
    w_first = center and fills and N == TILE_ELEMENTS and x.element_size() == 4
    if fills and (N == ROW_BLOCK_MAX or N == TILE_ELEMENTS and residual is None and (w_first or not center)):
        t = t._replace(num_warps=_warps_for(t.rows * t.block_n, FULL_TILE_ELEMENTS_PER_THREAD))
    meta = dict(OFFSET=float(offset), CENTER=center, HAS_RESIDUAL=residual is not None, HAS_W=weight is not None,
                HAS_B=bias is not None, BLOCK_N=t.block_n, ALIGN=_align(N, *strides), num_warps=t.num_warps,
                enable_fp_fusion=FP_FUSION)
    launch_skew = tile_skew if t.one_pass else skew   # the SKEW of the launch below
    w_copies, b_copies = _skewed_copies(weight, N, launch_skew), _skewed_copies(bias, N, launch_skew)
    if t.one_pass:
        _row_norm_fwd_kernel[(t.num_tiles,)](x, residual, s, y, w_copies, b_copies, mean, rstd, M, N, *strides,
                                             float(eps), ROWS=t.rows, N_CONST=N if vec else 0, VEC=vec,
                                             SKEW=tile_skew, W_FIRST=w_first,
                                             maxnreg=_forward_register_cap(t, x, N, vec, center), **meta)
    else:
        _long_row_norm_fwd_kernel[(M,)](x, residual, s, y, w_copies, b_copies, mean, rstd, *strides, 1, 1,
                                        float(eps), N=N,
                                        PRESUM=_long_forward_presum(N, 2 if center else 1), HW=0, APPLY=True,
                                        SPLITS=1, UNROLL=_unrolled(N, t.block_n), SKEW=skew, **meta)
    return y, s, mean, rstd


def _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db):
    """A backward's outputs, allocated: dx, dw, db shaped as x, weight, bias
    (contiguous), None where not asked or without the parameter (the
    launchers take their flags from what this returns)."""
    return (_empty_like(x) if compute_dx else None,
            _empty_like(weight) if compute_dw and weight is not None else None,
            _empty_like(bias) if compute_db and bias is not None else None)


@_launcher
def _row_norm_backward(dy, x, weight, bias, mean, rstd, ds, offset, compute_dx, compute_dw, compute_db):
    """Launches the row backward on x's rows. Returns dx, dw, db (`_new_grads`).
    `bias` gives db its shape and dtype; the kernels do not read it.

    Rows up to ROW_BLOCK_MAX: one kernel; with dw/db asked, on a persistent
    grid of P = min(tiles, SMs x THREADS_PER_SM / threads per program)
    programs, which leaves one (P, N) fp32 buffer per trained parameter (264
    rows on an H200 at N = 4096: 4.3 MB); with neither, one program per tile,
    or one per row by `_long_row_norm_bwd_kernel` for rows that fill their
    tile poorly (PADDED_ROW_FILL) and odd rows read skewed
    (SKEW_TILE_ROW_MIN); trained (and RMSNorm's and FusedAdd's shorter
    frozen rows that do not pad their tile), odd rows read skewed in the
    tile kernel, a program the tiles of one residue class of rows (its
    SKEW), but where such tiles measured slower, a row a program
    (`_skewed_trained_row_each`), as the longer rows below. RMSNorm's and
    FusedAdd's trained 16-bit rows just past 4096 (and FusedAdd's frozen
    ones) as a tile of 4096 and a tail (PADDED_TAIL_BLOCK_N), on the
    persistent grid; LayerNorm's just past ROW_BLOCK_MAX with dw and db
    both (TWO_ACC_TAIL_MAX) as a tile of ROW_BLOCK_MAX and a tail, one row
    per tile.
    Rows up to RELOAD_ROW_BLOCK_MAX with dx and one of dw, db asked (and
    LayerNorm's with both, of ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX + 1 to
    TWO_ACC_FOLDED_ROW from PIPED_ALL_TRITON on, of TWO_ACC_FOLDED_ROW alone
    before it): the same kernel, one row per tile, one program per SM (132
    partial rows on an H200 at N = 16384: 8.7 MB), piped; before
    PIPED_ALL_TRITON, RMSNorm's and LayerNorm's rows that train w past
    PIPED_ROW_MAX with RELOAD, but at 14336 (in narrow vectors,
    PIPED_VEC_ELEMENTS) and at RELOAD_ROW_BLOCK_MAX; when x and dy are 16-bit
    and N and the row strides are multiples of 8 (else its loads
    would not vectorize: `_aligned`). Longer rows: dx from
    `_long_row_norm_bwd_kernel`, and dw/db from `_row_norm_dwdb` into an (S,
    N) fp32 buffer, S about SMs / (N / DW_BLOCK_N), at least 1; with S = 1 (P
    = 1 for the tile kernel) the kernel writes dw and db themselves, with no
    buffer and no reduction launch (`_sum_targets`): on an H200 that is every
    row longer than 8384. Rows of COLUMNS_DX_ROW_BYTES or more with dx
    and dw/db asked (not odd rows, nor those beside, below): the long-row
    kernel's pass 1 alone (CONSTANTS_ONLY, the rows' k1 and k0 into an (M,
    2) fp32 buffer), then `_row_norm_dwdb_kernel` for dw/db and, in the
    same tiles, dx (COMPUTE_DX).
    While a CUDA graph is captured, with dx asked too, the dw/db kernel runs
    beside the dx kernel in one slice (`_run_beside`, DW_BESIDE_GRAPH), but
    on odd rows and those longer than COLUMNS_DX_ROW_BYTES.
    With no dw/db asked, nothing but dx is allocated and one kernel is launched.
    """
    M = rstd.shape[0]
    N = x.numel() // M if M else 1
    dx, dw, db = _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db)
    compute_dw, compute_db = dw is not None, db is not None   # none without the parameter
    x, _, stride_x = _as_rows(x, N)
    dy, _, stride_dy = _as_rows(dy, N)
    stride_ds = 0
    if ds is not None:
        ds, _, stride_ds = _as_rows(ds, N)
    if M == 0 or not (compute_dx or compute_dw or compute_db):
        return dx, (dw.zero_() if compute_dw else None), (db.zero_() if compute_db else None)
    trains = compute_dw or compute_db
    strides = (stride_dy, stride_x, stride_ds, N if compute_dx else 0)
    flags = dict(CENTER=mean is not None, HAS_W=weight is not None, HAS_DS=ds is not None, ALIGN=_align(N, *strides))
    rms_frozen = mean is None and ds is None and not trains   # RMSNorm's frozen backward plans its own way
    # The long-row kernel's pass 1 (PRESUM), and whether ptxas can spill it
    # under LONG_BWD_MAX_REGISTERS (per-lane sums of 16-bit rows: LONG_BWD_SPILL_CHUNKS).
    presum = LONG_PRESUM if mean is not None or N > LONG_BWD_PRESUM_AFTER else 1
    may_spill = presum == 1 and x.element_size() == 2
    # 16-bit rows past half a tile whose loads vectorize: the only rows the
    # plans below of a tile and a tail, or of a row per tile, take (tested
    # once, and not at all for the short rows of most calls).
    vec16 = (N > ROW_BLOCK_MAX // 2 and max(x.element_size(), dy.element_size()) == 2
             and _vector_aligned((N, *strides), 2))
    # RMSNorm's and FusedAdd's 16-bit rows just past half a tile of ROW_BLOCK_MAX, with dx asked: that
    # half and a tail (PADDED_TAIL_BLOCK_N; half of it filled at most with ds), trained, and FusedAdd's
    # frozen too, in the tile kernel's persistent grid, not the long-row kernel.
    tail_fill = PADDED_TAIL_BLOCK_N // 2 if ds is not None else PADDED_TAIL_BLOCK_N
    tail_rows = (compute_dx and mean is None and (trains or ds is not None)
                 and ROW_BLOCK_MAX // 2 < N <= ROW_BLOCK_MAX // 2 + tail_fill and vec16)
    # Odd rows a tile would hold, training nothing: the long-row kernel (SKEW_TILE_ROW_MIN,
    # SKEW_RESIDUAL_BWD_ROW_MIN); trained, where its skewed tiles measured slower (`_skewed_trained_row_each`).
    skew = _row_skew(N, strides, (dy, x, ds, dx))
    if trains:
        skewed = skew > 0 and _skewed_trained_row_each(N, skew, mean is not None, compute_dx)
    else:
        skewed = skew > 0 and N >= (SKEW_TILE_ROW_MIN if ds is None else SKEW_RESIDUAL_BWD_ROW_MIN)
    plan = dict(backward=True, padded_long=not (trains or tail_rows), padded_tile=mean is not None and not trains,
                padded_min=PADDED_SHORT_ROW_MIN if rms_frozen else None, skewed=skewed)
    floor = _padded_floor(x, mean is not None)
    t = _row_tiling(M, N, padded_floor=floor, **plan)
    # Odd rows a tile holds, trained, that stay there: read skewed
    # (`_row_norm_bwd_kernel`'s SKEW), in a tile with room for the lanes
    # before a row where that is still a tile (LayerNorm's, in tiles of up
    # to SKEW_TRAINED_TILE_BLOCK_MAX lanes: its wider ones, which with dx and
    # dw in a tile of ROW_BLOCK_MAX also spilled, took a row a program above).
    # Frozen (too short for the long-row kernel), RMSNorm's and FusedAdd's,
    # in a tile of SKEW_TILE_BLOCK_MIN lanes or more that the row and those
    # lanes do not leave padded (PADDED_ROW_FILL); elsewhere, and LayerNorm's,
    # one element a lane, which measured faster. Its tiles count those of
    # each of the SKEW classes of rows (`_skewed_tiles`).
    tile_skew = 0
    if skew and t.one_pass and (trains or mean is None):
        room = _skewed_tiles(M, N, skew, padded_floor=floor, **plan)
        if trains:
            fits = room is not None
        else:
            fits = (room and room.block_n >= SKEW_TILE_BLOCK_MIN
                    and not _fills_poorly(_lanes_walked(N, skew), room.block_n, PADDED_ROW_FILL))
        if fits:
            t, tile_skew = room, skew
    # The long-row dx kernel with one sum on 16-bit rows of 12289 to 14336 in
    # 16-byte vectors (vec16) in chunks of 4096, not seven of 2048
    # (HALVED_MAX_CHUNKS); elsewhere (not FusedAdd's with ds) on whole chunks
    # where they fit the row: RMSNorm's frozen per-lane rows' down to
    # LONG_BWD_SPILL_CHUNK_MIN (9216 = 9 x 1024), its padded rows' below
    # RMS_PADDED_CHUNK_MIN (4608 = 9 x 512); else a few (WHOLE_MAX_CHUNKS).
    # LayerNorm's two sums: six chunks, not three, at 20481 to 24576
    # (LONG_MIN_CHUNKS), wide chunks past 32768 (LONG_WIDE_CHUNK_MAX).
    unhalved = _unhalved_chunks(t, x, N, 1 if mean is None else 2, backward=True) if vec16 else t
    if unhalved is not t:
        t = unhalved
    else:
        if rms_frozen and may_spill:
            t = _whole_chunks(t, M, N, LONG_BWD_SPILL_CHUNK_MIN, **plan)
        if ds is None:
            t = _few_whole_chunks(t, x, M, N, **plan)
    if mean is not None:   # LONG_MIN_CHUNKS, then LONG_WIDE_CHUNK_MAX
        t = _wide_chunks(_min_chunks(t, x, N), x, M, N, **plan)
    # Rows past ROW_BLOCK_MAX with dx asked stay in the tile kernel, a row per
    # tile: with one trained parameter, and LayerNorm's of TWO_ACC_FOLDED_ROW
    # with both (`both`; from PIPED_ALL_TRITON on, those past the tail's too),
    # in a tile of RELOAD_ROW_BLOCK_MAX ("wide"), piped or with RELOAD
    # (PIPED_ROW_MAX, PIPED_ALL_TRITON); LayerNorm's just past ROW_BLOCK_MAX
    # with both as a tile of ROW_BLOCK_MAX and a tail (TWO_ACC_TAIL_MAX).
    all_piped = _TRITON_VERSION >= PIPED_ALL_TRITON
    row_each_dx = not t.one_pass and compute_dx and vec16
    both = mean is not None and compute_dw and compute_db   # LayerNorm's two accumulators
    both_wide = N == TWO_ACC_FOLDED_ROW or all_piped and ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX < N < TWO_ACC_FOLDED_ROW
    wide = (row_each_dx and N <= RELOAD_ROW_BLOCK_MAX
            and (compute_dw + compute_db == 1 or both and both_wide))
    two_acc = row_each_dx and both and ROW_BLOCK_MAX < N <= ROW_BLOCK_MAX + TWO_ACC_TAIL_MAX
    fills_tile = N == RELOAD_ROW_BLOCK_MAX   # a row as wide as its tile: no masked lane
    if wide or two_acc:
        row_tiles = _row_tiling(M, N, backward=True, block_max=RELOAD_ROW_BLOCK_MAX,
                                elements_per_thread=RELOAD_ELEMENTS_PER_THREAD)
        two_acc = two_acc and row_tiles.rows == 1   # TAIL's one row per tile (at tests' small limits, not always)
        t = row_tiles if wide or two_acc else t
    narrow = wide and not all_piped and _narrow_vectors(t, N, mean is not None)   # PIPED_VEC_ELEMENTS
    reload = (wide and not (all_piped or narrow or fills_tile or N <= PIPED_ROW_MAX)
              and compute_dw and ds is None)   # RMSNorm's and LayerNorm's w, before PIPED_ALL_TRITON
    piped = wide and not reload
    # LayerNorm's RELOAD with dw loads w per tile (see RELOAD_ROW_BLOCK_MAX);
    # piped rows past PIPED_ROW_MAX do, and shorter ones where its buffers fit
    # beside x's and dy's at full depth (see PIPED_ROW_MAX), but in narrow
    # vectors (see PIPED_VEC_ELEMENTS) and, from PIPED_ALL_TRITON on, up to
    # W_HELD_ROW_MAX, which hold it.
    w_per_tile = (reload and mean is not None) or two_acc   # two_acc: see TWO_ACC_TAIL_MAX
    if piped and weight is not None and not narrow:
        held_max = W_HELD_ROW_MAX if all_piped else 0
        w_per_tile = N > PIPED_ROW_MAX or N > held_max and _pipeline_stages(
            t.block_n * _element_bytes(x, dy, ds, weight), _programs_per_sm(t.num_warps), x.device,
            exact=True) == PIPELINE_STAGES
    dw_partial = db_partial = None
    if t.one_pass:
        # Rows that fit in registers beside dw/db accumulators (piped or with
        # RELOAD: the accumulator beside one row's loads at a time): a
        # persistent grid, whose programs accumulate dw/db. With neither
        # asked, one program per tile, as in the forward (but the tail's
        # rows, `tail_rows`, which keep the persistent grid). Piped rows and
        # LayerNorm's tile and tail (a row per tile) ask for PIPELINE_STAGES,
        # padded or not: two rows' buffers are what fits (one, for
        # FusedAdd's with ds and w in a tile of 16384: `_pipeline_stages`).
        padded = _fills_poorly(N, t.block_n, PADDED_ROW_FILL)
        # A tile of half the row's tile and a tail of the rest's power of two (PADDED_TAIL_BLOCK_N at least).
        tails = two_acc or (tail_rows and (t.rows, t.block_n, t.num_warps) == (1, ROW_BLOCK_MAX, 16))
        tail = max(PADDED_TAIL_BLOCK_N, _pow2(N - t.block_n // 2)) if tails else 0
        row_each = piped or two_acc   # a row per tile: its buffers counted exactly (`_pipeline_stages`)
        persistent = trains or tail > 0
        capped = persistent and (tile_skew > 0 or x.element_size() == 4)   # TILE_BWD_MAX_REGISTERS
        g = _row_grid(t, (x, dy, ds, weight if w_per_tile else None), x.device, persistent=persistent,
                      depth=PADDED_PIPELINE_STAGES if padded and not row_each else PIPELINE_STAGES, exact=row_each,
                      classes=max(1, tile_skew))
        stages = 1 if reload else g.stages
        if trains:
            dw_partial, db_partial = _sum_targets(g.programs, dw, db)
        # JOINT (see LONG_BWD_MAX_REGISTERS): trained, one program per SM; frozen, tiles of ROW_BLOCK_MAX.
        joint = mean is not None and not tail and (_programs_per_sm(t.num_warps) == 1 and not wide if trains
                                                   else t.block_n == ROW_BLOCK_MAX)
        # Frozen tiles of padded 16-bit rows up to PADDED_ROW_MIN (LayerNorm's
        # padded tiles, FusedAdd's with ds past 512): N a compile-time
        # constant, in vectors of NARROW_VEC_ELEMENTS (see the constant).
        short_vec = 0 if trains else _short_narrow_vec(t, N, (x, dy), strides)
        _row_norm_bwd_kernel[(g.programs,)](
            dy, x, _skewed_copies(weight, N, tile_skew), mean, rstd, ds, dx, dw_partial, db_partial,
            M, N, *strides, g.tiles_per_program, OFFSET=float(offset), **flags,
            COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            ROWS=t.rows, BLOCK_N=t.block_n // 2 if tail else t.block_n, STAGES=stages, RELOAD=reload,
            W_PER_TILE=w_per_tile, N_CONST=N if piped or short_vec else 0,
            VEC=PIPED_VEC_ELEMENTS if narrow else short_vec,
            JOINT=joint, TAIL=tail, SKEW=tile_skew, num_warps=t.num_warps,
            maxnreg=TILE_BWD_MAX_REGISTERS if capped else None, enable_fp_fusion=FP_FUSION)
    else:
        # Longer rows: one program per row computes dx, and `_row_norm_dwdb`
        # sums dw/db by columns: after it, or beside it while a CUDA graph is
        # captured (`_dwdb_beside`).
        # COLUMNS_DX_ROW_BYTES: pass 1 alone in the long-row kernel, dx with dw/db by columns; rows of
        # exactly that many bytes only where the dw/db kernel would not run beside. Odd rows: neither.
        row_bytes = N * x.element_size()
        dx_and_sums = compute_dx and trains and not skew   # what both ways need
        beside = dx_and_sums and row_bytes <= COLUMNS_DX_ROW_BYTES and _dwdb_beside(x.device)
        columns = dx_and_sums and not beside and row_bytes >= COLUMNS_DX_ROW_BYTES
        k = torch.empty((M, 2), dtype=torch.float32, device=x.device) if columns else None
        if compute_dx:
            # LONG_BWD_SPILL_MAX_REGISTERS (see LONG_BWD_MAX_REGISTERS) for LONG_BWD_SPILL_CHUNKS or
            # more whole chunks of LONG_ELEMENTS_PER_THREAD a thread, RMSNorm's pre-summed rows and
            # fp32 rows, where a program's threads have them (REGISTERS_PER_SM); on 8 warps
            # LONG_BWD_8_WARP_MAX_REGISTERS instead (`_eight_warp_cap`).
            whole_per_lane = (may_spill and N % t.block_n == 0 and N // t.block_n >= LONG_BWD_SPILL_CHUNKS
                              and t.block_n >= 32 * MIN_WARPS * LONG_ELEMENTS_PER_THREAD)
            high_cap = ((whole_per_lane or (presum > 1 and mean is None and ds is None) or x.element_size() == 4)
                        and 32 * t.num_warps * LONG_BWD_SPILL_MAX_REGISTERS <= REGISTERS_PER_SM)
            cap = (LONG_BWD_8_WARP_MAX_REGISTERS if _eight_warp_cap(t, x, N, whole_per_lane)   # three programs per SM
                   else LONG_BWD_SPILL_MAX_REGISTERS if high_cap else LONG_BWD_MAX_REGISTERS)
            if mean is None and vec16 and _TRITON_VERSION >= PIPED_ALL_TRITON:
                cap = _ptxas_cap(cap, t, N, ds is not None, rms_frozen)
            launch_dx = functools.partial(
                _long_row_norm_bwd_kernel[(M,)],
                dy, x, _skewed_copies(weight, N, skew), mean, rstd, ds, dx, None, None, k, *strides, 1, 1, N=N,
                OFFSET=float(offset), **flags, CONSTANTS_ONLY=columns,
                BLOCK_N=t.block_n, PRESUM=presum, HW=0, COMPUTE_DW=False, COMPUTE_DB=False, BLOCK_C=1, BLOCK_HW=1,
                JOINT=mean is not None and _holds_sm(t.num_warps, cap), UNROLL=_unrolled(N, t.block_n),
                UNROLL_SUMS=_unrolled_sums(N, t.block_n), num_warps=t.num_warps, maxnreg=cap, SKEW=skew,
                enable_fp_fusion=FP_FUSION)
        if beside:
            share = DW_BESIDE_RMS_PROGRAMS_PER_SM if mean is None and ds is None else DW_BESIDE_PROGRAMS_PER_SM
            _run_beside(x.device, launch_dx, functools.partial(
                _row_norm_dwdb, dy, x, mean, rstd, M, N, stride_dy, stride_x, dw, db, beside_share=share))
        else:
            if compute_dx:
                launch_dx()
            if trains:
                dx_from = (dict(W=weight, K=k, DS=ds, DX=dx, stride_ds=stride_ds, stride_dx=N, OFFSET=float(offset))
                           if columns else None)
                dw_partial, db_partial = _row_norm_dwdb(dy, x, mean, rstd, M, N, stride_dy, stride_x, dw, db, skew,
                                                        dx_from=dx_from)
    _reduce_partials((dw_partial, dw), (db_partial, db))
    return dx, dw, db


# `_row_norm_dwdb_kernel`'s COMPUTE_DX arguments where it is off: placeholders
# the kernel never reads (read-only; shared by every call).
_NO_DX_ARGS = dict(W=None, K=None, DS=None, DX=None, stride_ds=0, stride_dx=0, OFFSET=0.0)


def _row_norm_dwdb(dy, x, mean, rstd, M, N, stride_dy, stride_x, dw, db, skew=0, beside_share=None, dx_from=None):
    """dw/db sums of M long rows by `_row_norm_dwdb_kernel`, for dw and db
    where not None. Returns their targets (`_sum_targets`): (S, N) fp32
    partials, or dw and db themselves, filled, when S = 1. With `dx_from`
    (the kernel's arguments W, K, DS, DX, stride_ds, stride_dx and OFFSET;
    not with `skew` or `beside_share`), its COMPUTE_DX: dx too, in the same
    tiles.

    After the dx kernel: tiles of DW_BLOCK_M x DW_BLOCK_N, flatter where the
    column blocks would not fit one wave (DW_WAVE_PROGRAMS_PER_SM) or a
    program would walk few rows (DW_FLAT_ROW_STEPS), and S row slices,
    enough that (S x column blocks) gives each SM a program, each slice a
    whole number of row steps: one slice where the column blocks alone do
    (N > 8384 on an H200) or M is at most one step. Beside it (a
    `beside_share`): one slice, in about that many programs per SM (see
    DW_BESIDE_GRAPH). With `skew` (SKEW of odd rows; not beside), each
    slice's rows by their classes, SKEW programs a slice and column block,
    whose partial rows the caller reduces.
    """
    compute_dw, compute_db = dw is not None, db is not None
    block_m, block_n, warps, max_registers = DW_BLOCK_M, DW_BLOCK_N, DW_WARPS, None
    per_sm = DW_WAVE_PROGRAMS_PER_SM   # programs sharing an SM's shared memory
    sms = _num_sms(x.device)
    beside = beside_share is not None
    if beside:
        slabs = max(1, round(beside_share * sms))
        block_n = min(DW_BESIDE_TILE, max(DW_BLOCK_N, _pow2(_cdiv(N, slabs))))
        block_m, max_registers = DW_BESIDE_TILE // block_n, DW_BESIDE_MAX_REGISTERS
        warps = DW_BESIDE_WARPS * (compute_dw + compute_db)
        per_sm = 1   # at most one (DW_BESIDE_PROGRAMS_PER_SM)
    else:   # flatter tiles for one wave, or for few rows (see the constants)
        while block_m > DW_MIN_BLOCK_M and (
                _cdiv(N, block_n) > per_sm * sms
                or (_cdiv(M, block_m) < DW_FLAT_ROW_STEPS and _cdiv(N, 2 * block_n) >= sms)):
            block_m, block_n = block_m // 2, block_n * 2
    classes = max(1, skew)
    col_blocks = _cdiv(_lanes_walked(N, skew), block_n)
    splits = 1 if beside else max(1, min(_cdiv(M, block_m * classes), _cdiv(sms, col_blocks * classes)))
    rows_per_split = _cdiv(_cdiv(M, splits), block_m * classes) * block_m * classes
    splits = _cdiv(M, rows_per_split) * classes
    dw_partial, db_partial = _sum_targets(splits, dw, db)
    compute_dx = dx_from is not None
    d = dx_from or _NO_DX_ARGS
    tile_bytes = block_m * block_n * _element_bytes(dy, x if compute_dw or compute_dx else None, d["DS"])
    _row_norm_dwdb_kernel[(col_blocks, splits)](
        dy, x, d["W"], mean, rstd, d["K"], d["DS"], d["DX"], dw_partial, db_partial,
        M, N, stride_dy, stride_x, d["stride_ds"], d["stride_dx"], rows_per_split,
        OFFSET=d["OFFSET"], CENTER=mean is not None, HAS_W=d["W"] is not None, HAS_DS=d["DS"] is not None,
        COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, BLOCK_M=block_m,
        BLOCK_N=block_n, STAGES=_pipeline_stages(tile_bytes, per_sm, x.device),
        LAST_FIRST=not beside, ALIGN=_align(N, stride_dy, stride_x, d["stride_ds"], d["stride_dx"]), SKEW=skew,
        num_warps=warps, maxnreg=max_registers, enable_fp_fusion=FP_FUSION)
    return dw_partial, db_partial


def _dwdb_beside(device: torch.device) -> bool:
    """Whether the long-row dw/db kernel runs beside the dx kernel
    (`_run_beside`): while a CUDA graph is captured, whose replay starts the
    two together (DW_BESIDE_GRAPH), and in every call with DW_BESIDE_EAGER."""
    if DW_BESIDE_EAGER:
        return True
    return DW_BESIDE_GRAPH and device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=None)
def _side_stream(device_index: int) -> "torch.cuda.Stream":
    """The second stream of `_run_beside`, one per device, at the highest
    priority: as the dx kernel's programs end, the GPU starts the dw/db
    kernel's in their place first."""
    return torch.cuda.Stream(device_index, priority=torch.cuda.Stream.priority_range()[1])


def _run_beside(device: torch.device, first, second) -> None:
    """Runs the launches first() on the current stream and second() beside
    them on `_side_stream`: both after what the current stream has queued, and
    before what it queues next, which waits for both. So the allocator cannot
    hand the memory of a tensor second() uses to a later launch before it is
    done. In Triton's interpreter (no streams), one after the other."""
    if device.type != "cuda":
        first()
        second()
        return
    current = torch.cuda.current_stream(device)
    side = _side_stream(_device_index(device))
    side.wait_stream(current)
    first()
    with torch.cuda.stream(side):
        second()
    current.wait_stream(side)


def rms_norm_forward(x, normalized_shape, weight=None, eps=1e-6, offset=0.0):
    """Low-level RMSNorm forward: returns (y, rstd), y like x, rstd (M,) fp32.

    Used by `rms_norm` and the benchmark. It does not validate its arguments.
    """
    y, _, _, rstd = _row_norm_forward(x, None, _vector(weight), None, eps, offset, False,
                                      math.prod(normalized_shape))
    return y, rstd


def rms_norm_backward(dy, x, weight, rstd, offset=0.0, compute_dx=True, compute_dw=True):
    """Low-level RMSNorm backward: returns (dx, dw), None for what is not computed.

    x, weight and rstd as the forward saw and returned them; the flags say which
    gradients to compute (in the autograd Function: ctx.needs_input_grad).
    """
    dx, dw, _ = _row_norm_backward(dy, x, _vector(weight), None, None, rstd, None, offset,
                                   compute_dx, compute_dw, False)
    return dx, dw


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps, offset):
        y, rstd = rms_norm_forward(x, normalized_shape, weight, eps, offset)
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset = offset
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x, weight, rstd, ctx.offset,
                                   ctx.needs_input_grad[0], ctx.needs_input_grad[2])
        return dx, None, dw, None, None


def rms_norm(x, normalized_shape, weight=None, eps=None, *, offset=0.0):
    """RMSNorm as ``torch.nn.functional.rms_norm``: x / sqrt(mean(x^2) + eps) * (offset + w).

    eps=None means torch.finfo(x.dtype).eps, as torch does; offset=1.0 gives
    Gemma's (1 + w) (it has no effect without a weight). dw is computed only
    when weight requires grad.
    """
    _check_tensor(x, "x")
    shape = _check_normalized_shape(x, normalized_shape)
    _check_param(weight, "weight", shape, x)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    _check_real(eps, "eps")
    _check_real(offset, "offset")
    return _RMSNormFunction.apply(x, shape, weight, eps, offset)


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in ``torch.nn.RMSNorm``: same arguments, parameters and state_dict.

    One keyword-only extra, `offset`, for Gemma-style (offset + w) scaling.
    """

    def __init__(self, *args, offset: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.offset = offset

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, offset=self.offset)


# =============================================================================
# 5. FusedAddRMSNorm
# =============================================================================
#
# The delta on RMSNorm. A transformer block ends with `s = residual + h` and the
# next block starts with `rms_norm(s)`. Fused, s is read once instead of twice;
# it is still written, because it is the next block's residual:
#
#     s = x + r   (rounded to x's dtype),    y = rms_norm(s) * (o + w)
#
# Both outputs carry gradients. With ds the gradient arriving at s from the
# rest of the network and dnorm section 4's dx (with s in place of x):
#
#     dx = dr = dnorm + ds,        dw = sum over rows of dy * shat
#
# The kernels are section 4's with HAS_RESIDUAL (forward: load r, add, store s)
# and HAS_DS (backward: add ds into dx). dx and dr are one tensor returned
# twice, as autograd's own add does. One tuning differs: the forward keeps rows
# up to RESIDUAL_ROW_BLOCK_MAX in one tile, where the long-row kernel would
# read back the s it has just written. Freezing w removes what it removes for
# RMSNorm.


def fused_add_rms_norm_reference(x, residual, weight=None, eps=1e-6, offset=0.0):
    """Plain-torch FusedAddRMSNorm: returns (rms_norm(s), s) with s = x + residual."""
    s = x + residual
    return rms_norm_reference(s, (x.shape[-1],), weight, eps, offset), s


def fused_add_rms_norm_forward(x, residual, weight=None, eps=1e-6, offset=0.0):
    """Low-level forward: returns (y, s, rstd). No validation."""
    y, s, _, rstd = _row_norm_forward(x, residual, _vector(weight), None, eps, offset, False, x.shape[-1])
    return y, s, rstd


def fused_add_rms_norm_backward(dy, ds, s, weight, rstd, offset=0.0, compute_dx=True, compute_dw=True):
    """Low-level backward: returns (dx, dw); dx is also the residual's gradient.

    dy and ds are the gradients of y and s; either may be None (an unused output).
    """
    if dy is None:   # y unused: only ds flows back, and w gets no gradient
        return (ds if compute_dx else None), None
    dx, dw, _ = _row_norm_backward(dy, s, _vector(weight), None, None, rstd, ds, offset, compute_dx,
                                   compute_dw, False)
    return dx, dw


class _FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset):
        y, s, rstd = fused_add_rms_norm_forward(x, residual, weight, eps, offset)
        ctx.save_for_backward(s, weight, rstd)
        ctx.offset = offset
        ctx.set_materialize_grads(False)   # an unused y or s costs no tensor of zeros
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            ctx.mark_non_differentiable(s)   # s = x + r does not depend on w
        return y, s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, ds):
        s, weight, rstd = ctx.saved_tensors
        need_x, need_r, need_w = ctx.needs_input_grad[:3]
        dx, dw = fused_add_rms_norm_backward(dy, ds, s, weight, rstd, ctx.offset, need_x or need_r, need_w)
        return (dx if need_x else None), (dx if need_r else None), dw, None, None


def fused_add_rms_norm(x, residual, weight=None, eps=1e-6, *, offset=0.0):
    """s = x + residual (rounded to x's dtype), y = rms_norm(s) * (offset + w). Returns (y, s)."""
    _check_tensor(x, "x")
    _check_tensor(residual, "residual", device=x.device)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"got {tuple(residual.shape)} and {residual.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    _check_param(weight, "weight", (x.shape[-1],), x)
    _check_real(eps, "eps")
    _check_real(offset, "offset")
    return _FusedAddRMSNormFunction.apply(x, residual, weight, eps, offset)


class FusedAddRMSNorm(torch.nn.Module):
    """RMSNorm of (x + residual); forward(x, residual) returns (y, x + residual).

    The weight starts at 1 - offset, so that the scale (offset + w) starts at 1.
    """

    def __init__(self, hidden_size, eps=1e-6, *, offset=0.0, device=None, dtype=None):
        super().__init__()
        self.hidden_size, self.eps, self.offset = hidden_size, eps, offset
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), 1.0 - offset, device=device, dtype=dtype))

    def forward(self, x, residual):
        return fused_add_rms_norm(x, residual, self.weight, self.eps, offset=self.offset)

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}"


# =============================================================================
# 6. LayerNorm
# =============================================================================
#
# The delta on RMSNorm: the row is centred, and there is a bias.
#
#     mean = mean(x),  rstd = 1 / sqrt(mean((x - mean)^2) + eps),
#     xhat = (x - mean) * rstd,  y = xhat * w + b
#
# The backward gains one term: the mean depends on every x_j with weight 1/N,
# which adds the mean of g to section 4's c1 term:
#
#     dx = rstd * (g - xhat * c1 - c2),   c1 = mean(xhat * g),  c2 = mean(g)
#     dw = sum over rows of dy * xhat,    db = sum over rows of dy
#
# The kernels are section 4's with CENTER (mean, c2) and HAS_B (the bias, and
# COMPUTE_DB for its gradient). Freezing w and b removes both column reductions,
# both (P x N) scratch buffers and the second launch; freezing w alone keeps db's.


def layer_norm_reference(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Plain-torch LayerNorm, computed in the dtype of x."""
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    mean = x.mean(dims, keepdim=True)
    y = (x - mean) * torch.rsqrt((x - mean).pow(2).mean(dims, keepdim=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def layer_norm_forward(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Low-level forward: returns (y, mean, rstd). No validation."""
    y, _, mean, rstd = _row_norm_forward(x, None, _vector(weight), _vector(bias), eps, 0.0, True,
                                         math.prod(normalized_shape))
    return y, mean, rstd


def layer_norm_backward(dy, x, weight, bias, mean, rstd, compute_dx=True, compute_dw=True, compute_db=True):
    """Low-level backward: returns (dx, dw, db), None for what is not computed."""
    return _row_norm_backward(dy, x, _vector(weight), bias, mean, rstd, None, 0.0, compute_dx, compute_dw,
                              compute_db)


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = layer_norm_backward(dy, x, weight, bias, mean, rstd, need[0], need[2], need[3])
        return dx, None, dw, db, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """LayerNorm as ``torch.nn.functional.layer_norm``; dw, db only for parameters that require grad."""
    _check_tensor(x, "x")
    shape = _check_normalized_shape(x, normalized_shape)
    _check_param(weight, "weight", shape, x)
    _check_param(bias, "bias", shape, x)
    _check_real(eps, "eps")
    return _LayerNormFunction.apply(x, shape, weight, bias, eps)


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in ``torch.nn.LayerNorm``: same arguments, parameters and state_dict."""

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


# =============================================================================
# 7. GroupNorm
# =============================================================================
#
# The math. x is (B, C, *spatial), viewed as (B, C, HW). The C channels form G
# groups of Cg = C / G; a "row" is one (sample, group): Cg * HW elements, which
# are contiguous. Statistics are per row, the affine per channel c:
#
#     xhat = (x - mean) * rstd  (over the row),   y = xhat * w[c] + b[c]
#
# The backward is LayerNorm's within each row, with g = dy * w[c] and the
# means c1, c2 taken over the row's L = Cg * HW elements:
#
#     dx = rstd * (g - xhat * c1 - c2)
#     dw[c] = sum over samples and spatial positions of dy * xhat,   db[c] = ... of dy
#
# Both c1 and c2 factor through per-(sample, channel) sums:
#     sum(xhat * g) = sum_c w[c] * A[c],  A[c] = sum_hw dy * xhat   (= dw's summand)
#     sum(g)        = sum_c w[c] * D[c],  D[c] = sum_hw dy          (= db's summand)
# so when dw or db trains, the kernel forms A and D per channel, in registers,
# and stores them into a (B, C) fp32 scratch that one more launch sums over B.
# With both frozen, only the two row sums are needed: the kernel accumulates
# w[c] * dy * xhat and w[c] * dy per lane and reduces once per row, with no
# per-channel reduction, no scratch and no second launch.
#
# Three sets of kernels take the rows, chosen by the rows' shape and count,
# in this order of preference (`_group_row_kernels`):
#
# Short rows (a block of GROUP_SHORT_ROW_MAX elements, or less, holds one).
# Several whole rows a program, as the row norms' tiles hold them, with one
# delta: a row is laid out as [channels, positions], so the tile is [ROWS,
# BLOCK_C, BLOCK_HW], w and b are one value per (row, channel) and broadcast
# over the positions, and A and D are sums over the last axis, stored to the
# (B, C) scratch straight from the tile. x is read once; each row's
# statistics, c1 and c2 are reduced inside the tile. The lanes past Cg or HW
# are masked; where they are most of the block, or where HW loads a
# channel's positions in narrow vectors, the long-row kernels keep the rows
# they take of GROUP_LONG_ROW_MIN elements or more (the constants above).
#
# Many rows. A row is contiguous, so with enough rows (the constants above),
# longer or short, the forward and the backward are LayerNorm's long-row kernels
# with one delta: w and b are per channel, not per column (their HW argument,
# `_affine_index`), loaded once per group of a thread's elements, a group in
# one channel or, where HW is odd or twice odd, spanning two
# (`_spans_channels`). Their pass 1 sums per group too, with no barrier in
# the loop (GroupNorm's own forward reduces every tile). With w or b trained
# the backward's pass 1 forms A and D instead, by blocks of channels
# (`_group_channel_sums`, shared with GroupNorm's own backward). A row that
# fits a tile runs on the warps of its own elements (`_group_long_rows`).
#
# Few rows, rows of Cg * HW no multiple of GROUP_LONG_MIN_RUN, and a backward
# without dx (the long-row kernel's pass 2 is dx), where the rows are not
# short. GroupNorm's own kernels loop over [BLOCK_C, BLOCK_HW] tiles in two
# passes (statistics, then the update, backwards for L2 hits). When B * G is
# smaller than the SM count, each row is split over S programs by channels, and
# the two passes become two launches: the first leaves per-split partial
# statistics in spare columns of the saved statistics tensor, the second merges
# them. The second one's work (y, or dx) is elementwise once the statistics are
# known, so where whole channels leave too few splits it cuts each split into
# runs of tiles, one program per run (`_group_runs`). In the forward, equal
# splits longer than ROW_BLOCK_MAX (each a contiguous segment) take their
# statistics from the long-row forward's pass 1 instead, one program per
# segment, or where the splits are too few (a group of one channel is one
# split), one per piece: each split cut into `pieces` equal contiguous pieces.
# The backward's first launch takes as many runs of tiles per split where w and
# b are frozen (its sums are per lane) or a split is one channel (A and D are
# per channel, and each run leaves its share in a row of its own). The
# statistics tensor is (B * G, 2 + 2 S pieces) fp32: mean, rstd, then two
# floats per piece. It is allocated by the forward, so the split backward, too,
# allocates nothing but dx when w and b are frozen.


def group_norm_reference(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Plain-torch GroupNorm, computed in the dtype of x."""
    B, C = x.shape[:2]
    xg = x.reshape(B, num_groups, -1)
    mean = xg.mean(-1, keepdim=True)
    y = ((xg - mean) * torch.rsqrt((xg - mean).pow(2).mean(-1, keepdim=True) + eps)).reshape(x.shape)
    affine_shape = (1, C) + (1,) * (x.dim() - 2)
    y = y if weight is None else y * weight.reshape(affine_shape)
    return y if bias is None else y + bias.reshape(affine_shape)


@triton.jit
def _group_row(pid, S, C, HW, Cg, channels_per_split):
    """Where split `pid` lies: its (sample, group) row, sample, split within the
    row, the sample's first element and the split's channels [c_lo, c_hi)."""
    row = pid // S
    split = pid % S
    G = C // Cg
    sample = row // G
    c_lo = (row % G) * Cg + split * channels_per_split
    c_hi = tl.minimum(c_lo + channels_per_split, (row % G) * Cg + Cg)
    return row, sample, split, sample.to(tl.int64) * C * HW, c_lo, c_hi


@triton.jit
def _group_tile(t, c_lo, c_hi, HW, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """Channels, offsets (from the sample's base), mask and element count (fp32)
    of tile t of a split: its [BLOCK_C, BLOCK_HW] tiles are numbered
    channel-major over [c_lo, c_hi) x HW."""
    num_hw = tl.cdiv(HW, BLOCK_HW)
    c0 = c_lo + (t // num_hw) * BLOCK_C
    h0 = (t % num_hw) * BLOCK_HW
    offs, mask = _tile(c0 + tl.arange(0, BLOCK_C), h0 + tl.arange(0, BLOCK_HW), c_hi, HW, HW)
    count = tl.cast(tl.minimum(c_hi - c0, BLOCK_C) * tl.minimum(HW - h0, BLOCK_HW), tl.float32)
    return c0 + tl.arange(0, BLOCK_C), offs, mask, count


@triton.jit
def _group_num_tiles(c_lo, c_hi, HW, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """How many [BLOCK_C, BLOCK_HW] tiles cover channels [c_lo, c_hi) x HW positions."""
    return tl.cdiv(c_hi - c_lo, BLOCK_C) * tl.cdiv(HW, BLOCK_HW)


@triton.jit
def _group_run(run, runs, num_tiles):
    """Tiles [t_lo, t_hi) of run `run` of a split's num_tiles tiles cut into
    `runs` nearly equal runs (`_group_runs`); all of them for runs = 1."""
    return run * num_tiles // runs, (run + 1) * num_tiles // runs


@triton.jit
def _group_load_x_g(X, DY, W, c, offs, mask, c_hi, HAS_W: tl.constexpr):
    """x and g = dy * w[c] of a GroupNorm tile, in fp32 (g = 0 where masked)."""
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        g = g * _load_vector(W, c, c_hi)[:, None]
    return x, g


@triton.jit
def _group_norm_fwd_kernel(
    X, Y, W, B, Stats,               # X, Y: (B, C, HW); W, B: (C,); Stats: (B*G, 2 + 2S*pieces) fp32
    C, HW, Cg, channels_per_split, S, pieces, runs, stats_stride, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    STAGES: tl.constexpr, DO_STATS: tl.constexpr, DO_APPLY: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """GroupNorm forward: y = (x - mean) * rstd * w[c] + b[c], per (sample, group) row.

    Grid: (B * G * S,); program p handles split p % S of row p // S: channels
    [c_lo, c_hi) of that row, all HW positions, in [BLOCK_C, BLOCK_HW] tiles.
    The DO_APPLY-only launch has `runs` programs per split, (B * G * S *
    runs,): each writes y for one run of the split's tiles (`_group_run`);
    runs = 1 in the other modes.
    Pointers: X, Y contiguous (B, C, HW); W, B (C,); Stats (B*G, stats_stride)
    fp32 holding mean, rstd and 2 partial floats (mean, m2) per statistics
    piece: S * pieces of them, each of a split's pieces (equal, contiguous)
    or, with pieces = 1, of a split (the last one may be shorter).
    Dtypes: Y is X's dtype; W, B any float dtype; fp32 math.

    Launch modes (S = pieces = 1: one launch with both flags; else two):
      DO_STATS and DO_APPLY  pass 1 (moments of the row), pass 2 (y), backwards.
      DO_STATS only          write this split's (mean, m2) to Stats; no y.
                             (`group_norm_forward` launches the long-row
                             forward with APPLY off instead where the
                             splits are equal and long.)
      DO_APPLY only          merge the S * pieces partial moments, then pass 2;
                             programs run in reverse order, to re-read from L2
                             what the stats launch read last.
    HAS_W, HAS_B: False removes the load and use of w (b).
    STAGES: the software pipeline's depth over the tiles of a pass.
    ALIGN: `_aligned`'s hint, a power of two dividing HW; 1 removes it.
    """
    HW = _aligned(HW, ALIGN)
    pid = tl.program_id(0)
    if not DO_STATS:
        pid = tl.num_programs(0) - 1 - pid
    run = pid % runs
    row, _sample, split, base, c_lo, c_hi = _group_row(pid // runs, S, C, HW, Cg, channels_per_split)
    t_lo, t_hi = _group_run(run, runs, _group_num_tiles(c_lo, c_hi, HW, BLOCK_C, BLOCK_HW))
    eps = tl.cast(eps, tl.float32)
    stats_row = Stats + row.to(tl.int64) * stats_stride
    if DO_STATS:
        mean = tl.full([], 0.0, tl.float32)
        m2 = mean
        count = mean
        for t in tl.range(t_lo, t_hi, num_stages=STAGES):
            _, offs, mask, n_b = _group_tile(t, c_lo, c_hi, HW, BLOCK_C, BLOCK_HW)
            x = tl.load(X + base + offs, mask=mask, other=0.0).to(tl.float32)
            mean_b = tl.sum(x) / n_b
            d = tl.where(mask, x - mean_b, 0.0)
            mean, m2 = _merge_moments(mean, m2, count, mean_b, tl.sum(d * d), n_b)
            count += n_b
        if not DO_APPLY:
            tl.store(stats_row + 2 + 2 * split, mean)
            tl.store(stats_row + 3 + 2 * split, m2)
    else:
        piece = channels_per_split * HW // pieces   # elements per pair; a last split may have fewer
        mean = tl.load(stats_row + 2)
        m2 = tl.load(stats_row + 3)
        count = tl.cast(tl.minimum(piece, Cg * HW), tl.float32)
        for s in range(1, S * pieces):
            n_b = tl.cast(tl.minimum(piece, Cg * HW - s * piece), tl.float32)
            mean, m2 = _merge_moments(mean, m2, count, tl.load(stats_row + 2 + 2 * s),
                                      tl.load(stats_row + 3 + 2 * s), n_b)
            count += n_b
    if DO_APPLY:
        rstd = 1.0 / tl.sqrt(m2 / (Cg * HW) + eps)
        if (split == 0) & (run == 0):
            tl.store(stats_row, mean)
            tl.store(stats_row + 1, rstd)
        for k in tl.range(0, t_hi - t_lo, num_stages=STAGES):   # the tiles of pass 1, last first
            c, offs, mask, _ = _group_tile(t_hi - 1 - k, c_lo, c_hi, HW, BLOCK_C, BLOCK_HW)
            y = _xhat(tl.load(X + base + offs, mask=mask, other=0.0).to(tl.float32), mean, rstd, True)
            if HAS_W:
                y = y * _load_vector(W, c, c_hi)[:, None]
            if HAS_B:
                y = y + _load_vector(B, c, c_hi)[:, None]
            tl.store(Y + base + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _group_norm_bwd_kernel(
    DY, X, W, Stats, DX, DWp, DBp,   # DY, X, DX: (B, C, HW); W: (C,); DWp, DBp: (B*runs, C)
                                     # Stats: (B*G, 2 + 2S*pieces) fp32
    C, HW, Cg, channels_per_split, S, pairs, runs, stats_stride,
    HAS_W: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr, DO_SUMS: tl.constexpr,
    DO_DX: tl.constexpr, ALIGN: tl.constexpr,
):
    """GroupNorm backward: dx = rstd * (g - xhat * c1 - c2), and per-(sample, channel) dw/db sums.

    Grid and pointers as `_group_norm_fwd_kernel`: `runs` programs per split,
    each on one run of the split's tiles, in the DO_DX-only launch and in
    the DO_SUMS-only launch (there, with w or b trained, only for splits of
    one channel in [1, BLOCK_HW] tiles). DWp and DBp are contiguous (B *
    runs, C) fp32, or with one row dw and db themselves (`_sum_targets`),
    and receive A[c] = sum_hw dy * xhat and D[c] = sum_hw dy, in their
    dtype: a run's share in row (sample * runs + run).
    Dtypes: DX is X's dtype; DY, W any float dtype; fp32 math.

    Launch modes (S = 1 and no pieces: one launch; else, or no dx wanted: two or one):
      DO_SUMS   pass 1: sum(xhat * g) and sum(g), from A and D per channel
                (`_group_channel_sums`) when dw or db is computed, else per
                lane; with DO_DX off these two go to Stats, one pair per
                program (pairs = runs of them per split).
      DO_DX     pass 2 (backwards): dx; without DO_SUMS, first merge the S *
                pairs sums from Stats (programs in reverse order, for L2).
    Flags (each False removes code):
      COMPUTE_DW, COMPUTE_DB  the stores of A, D into DWp, DBp; both False
                              also removes the per-channel reductions.
      COMPUTE_DX              the row sums' use, pass 2 and the DX stores.
      HAS_W                   the loads of w (g = dy).
    STAGES: the software pipeline's depth over the tiles of a pass.
    ALIGN: `_aligned`'s hint, a power of two dividing HW; 1 removes it.
    """
    HW = _aligned(HW, ALIGN)
    pid = tl.program_id(0)
    if not DO_SUMS:
        pid = tl.num_programs(0) - 1 - pid
    run = pid % runs
    row, sample, split, base, c_lo, c_hi = _group_row(pid // runs, S, C, HW, Cg, channels_per_split)
    t_lo, t_hi = _group_run(run, runs, _group_num_tiles(c_lo, c_hi, HW, BLOCK_C, BLOCK_HW))
    stats_row = Stats + row.to(tl.int64) * stats_stride
    mean = tl.load(stats_row)
    rstd = tl.load(stats_row + 1)
    if DO_SUMS and not (COMPUTE_DW or COMPUTE_DB):
        # Frozen w and b: only the row's two sums are needed, not A and D per
        # channel, so they are accumulated per lane and reduced once at the end.
        acc_x_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        for t in tl.range(t_lo, t_hi, num_stages=STAGES):
            c, offs, mask, _ = _group_tile(t, c_lo, c_hi, HW, BLOCK_C, BLOCK_HW)
            x, g = _group_load_x_g(X + base, DY + base, W, c, offs, mask, c_hi, HAS_W)
            acc_x_g += g * x
            acc_g += g
        sum_g = tl.sum(tl.sum(acc_g, axis=1), axis=0)
        # sum(xc * g) = sum(x * g) - mean * sum(g), as in `_long_row_norm_bwd_kernel`
        sum_xhat_g = (tl.sum(tl.sum(acc_x_g, axis=1), axis=0) - mean * sum_g) * rstd
    elif DO_SUMS:
        # A and D of the split's channels, into row (sample * runs + run) of
        # DWp and DBp. With runs > 1 (splits of one channel in [1, BLOCK_HW]
        # tiles), a run's share of its channel: positions [lo, hi). With
        # runs = 1, lo = 0 and hi = HW.
        first = base + c_lo.to(tl.int64) * HW   # the split's first element
        lo, hi = t_lo * BLOCK_HW, tl.minimum(t_hi * BLOCK_HW, HW)
        out = (sample.to(tl.int64) * runs + run) * C + c_lo
        sum_xhat_g, sum_g = _group_channel_sums(
            X + first + lo, DY + first + lo, W, DWp, DBp, c_lo, out, c_hi - c_lo, hi - lo, mean, rstd,
            HAS_W, COMPUTE_DW, COMPUTE_DB, BLOCK_C, BLOCK_HW, STAGES, "", 1)
    else:
        sum_xhat_g = tl.load(stats_row + 2)
        sum_g = tl.load(stats_row + 3)
        for s in range(1, S * pairs):
            sum_xhat_g += tl.load(stats_row + 2 + 2 * s)
            sum_g += tl.load(stats_row + 3 + 2 * s)
    if DO_SUMS and COMPUTE_DX and not DO_DX:   # a run's share, for the DO_DX launch to merge
        pair = split * runs + run
        tl.store(stats_row + 2 + 2 * pair, sum_xhat_g)
        tl.store(stats_row + 3 + 2 * pair, sum_g)
    if DO_DX:
        c1 = sum_xhat_g / (Cg * HW)
        c2 = sum_g / (Cg * HW)
        k1, k0 = _dx_constants(c1, c2, mean, rstd, True)   # dx regrouped as in `_long_row_norm_bwd_kernel`
        for k in tl.range(0, t_hi - t_lo, num_stages=STAGES):   # the tiles of pass 1, last first
            c, offs, mask, _ = _group_tile(t_hi - 1 - k, c_lo, c_hi, HW, BLOCK_C, BLOCK_HW)
            x, g = _group_load_x_g(X + base, DY + base, W, c, offs, mask, c_hi, HAS_W)
            dx = g * rstd + (x * k1 + k0)
            tl.store(DX + base + offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _group_rows_tile(rows, M, G, Cg, HW, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """Offsets and mask of a [ROWS, BLOCK_C, BLOCK_HW] tile of whole rows
    (`rows` of M, each Cg * HW contiguous elements): [r, c, h] is position h
    of channel c of row rows[r]. Also c, the channels 0 .. BLOCK_C - 1 of a
    row, and `channels`, [ROWS, BLOCK_C, 1]: channel c of row r is w's and
    b's (r % G) * Cg + c (G groups)."""
    c = tl.arange(0, BLOCK_C)
    h = tl.arange(0, BLOCK_HW)
    offs = (rows.to(tl.int64) * (Cg * HW))[:, None, None] + (c * HW)[None, :, None] + h[None, None, :]
    mask = (rows < M)[:, None, None] & ((c < Cg)[:, None] & (h < HW)[None, :])[None, :, :]
    channels = ((rows % G) * Cg)[:, None, None] + c[None, :, None]
    return offs, mask, c, channels


@triton.jit
def _group_rows_sums(t):
    """The row sums of a [ROWS, BLOCK_C, BLOCK_HW] tile, [ROWS]."""
    return tl.sum(tl.sum(t, axis=2), axis=1)


@triton.jit
def _group_rows_fwd_kernel(
    X, Y, W, B, Stats,               # X, Y: (B, C, HW); W, B: (C,); Stats: (B*G, stats_stride) fp32
    M, G, Cg, HW, stats_stride, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr, ALIGN: tl.constexpr,
):
    """GroupNorm forward of short rows: y = (x - mean) * rstd * w[c] + b[c],
    ROWS whole (sample, group) rows a program, x read once.

    The delta on `_row_norm_fwd_kernel` (LayerNorm's tile of rows): a row of
    L = Cg * HW elements is held as [BLOCK_C, BLOCK_HW] (channels x
    positions, each a power of two), so that w and b, per channel, are one
    value per channel of a row, [ROWS, BLOCK_C, 1], broadcast over its
    positions. The price is the lanes past Cg and past HW, masked.

    Grid: (cdiv(M, ROWS),), M = B * G rows; program p takes rows p * ROWS to
    p * ROWS + ROWS - 1. Pointers: X, Y contiguous (B, C, HW), viewed as M
    rows of L; W, B (C,); Stats (M, stats_stride) fp32: the kernel writes
    mean and rstd to its columns 0 and 1 (`_group_stats_shape`).
    Dtypes: Y is X's dtype; W, B any float dtype; fp32 math.
    HAS_W, HAS_B: False removes the load and use of w (b).
    ALIGN: `_aligned`'s hint, a power of two dividing HW; 1 removes it.
    """
    HW = _aligned(HW, ALIGN)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    eps = tl.cast(eps, tl.float32)   # under torch.compile a Python float may arrive as fp64
    offs, mask, c, channels = _group_rows_tile(rows, M, G, Cg, HW, BLOCK_C, BLOCK_HW)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    mean = _group_rows_sums(x) / (Cg * HW)
    xc = tl.where(mask, x - mean[:, None, None], 0.0)
    rstd = 1.0 / tl.sqrt(_group_rows_sums(xc * xc) / (Cg * HW) + eps)
    stats = Stats + rows.to(tl.int64) * stats_stride
    tl.store(stats, mean, mask=rows < M)
    tl.store(stats + 1, rstd, mask=rows < M)
    y = _row_affine(xc * rstd[:, None, None], W, B, channels, G * Cg, 0.0, HAS_W, HAS_B)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _group_rows_bwd_kernel(
    DY, X, W, Stats, DX, DWp, DBp,   # DY, X, DX: (B, C, HW); W: (C,); Stats: (B*G, stats_stride) fp32;
                                     # DWp, DBp: (B, C)
    M, G, Cg, HW, stats_stride,
    HAS_W: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, ALIGN: tl.constexpr,
):
    """GroupNorm backward of short rows, in `_group_rows_fwd_kernel`'s tiles:
    dx = rstd * (g - xhat * c1 - c2) with g = dy * w[c], and the
    per-(sample, channel) sums A[c] = sum_hw dy * xhat and D[c] = sum_hw dy.

    A tile holds whole rows, so each row's c1 = mean(xhat * g) and c2 =
    mean(g) are reduced in the tile, and each channel's A and D too (over
    the tile's last axis): no loop, no scratch but the (B, C) sums, x and dy
    read once.

    Grid: (cdiv(M, ROWS),), as the forward. Pointers: DY, X, DX contiguous
    (B, C, HW) as M = B * G rows; W (C,); Stats (M, stats_stride) fp32 with
    mean and rstd in columns 0 and 1; DWp, DBp (B, C) contiguous, fp32 or
    with B = 1 dw and db themselves (`_sum_targets`): row r's channel c goes
    to element r * Cg + c. Dtypes: DX, DWp, DBp are written in their own
    dtype; DY, X, W may each differ. fp32 math.
    Flags (each False removes code):
      COMPUTE_DX  the row sums, the dx arithmetic and the DX stores.
      COMPUTE_DW  the per-channel sums of dy * xhat and their stores.
      COMPUTE_DB  the per-channel sums of dy and their stores.
      HAS_W       the load of w (g = dy).
    ALIGN: `_aligned`'s hint, a power of two dividing HW; 1 removes it.
    """
    HW = _aligned(HW, ALIGN)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs, mask, c, channels = _group_rows_tile(rows, M, G, Cg, HW, BLOCK_C, BLOCK_HW)
    stats = Stats + rows.to(tl.int64) * stats_stride
    mean = tl.load(stats, mask=rows < M, other=0.0)[:, None, None]
    rstd = tl.load(stats + 1, mask=rows < M, other=0.0)[:, None, None]
    # Masked lanes load x = dy = 0: their g is 0, and so is every term they add.
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    xhat = _xhat(x, mean, rstd, True)
    if COMPUTE_DX:
        g = dy
        if HAS_W:
            g = dy * _load_vector(W, channels, G * Cg)
        c1 = (_group_rows_sums(xhat * g) / (Cg * HW))[:, None, None]
        c2 = (_group_rows_sums(g) / (Cg * HW))[:, None, None]
        dx = g * rstd - c2 * rstd - xhat * (c1 * rstd)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    sums = rows.to(tl.int64)[:, None] * Cg + c[None, :]   # (sample, channel): r * Cg + c of (B, C)
    sums_mask = (rows < M)[:, None] & (c < Cg)[None, :]
    if COMPUTE_DW:
        tl.store(DWp + sums, tl.sum(dy * xhat, axis=2).to(DWp.dtype.element_ty), mask=sums_mask)
    if COMPUTE_DB:
        tl.store(DBp + sums, tl.sum(dy, axis=2).to(DBp.dtype.element_ty), mask=sums_mask)


class _GroupTiling(NamedTuple):
    splits: int               # S: programs per (sample, group) row
    channels_per_split: int
    pieces: int               # statistics pieces per split (`_group_tiling`)
    block_c: int
    block_hw: int
    num_warps: int
    stages: int               # software-pipeline depth of the tile loops


def _group_tiling(B: int, C: int, HW: int, G: int, element_bytes: int, device: torch.device,
                  min_channels: int = 1) -> _GroupTiling:
    """Splits and tiles for GroupNorm; `element_bytes`: the loads per element of a
    tile loop; `min_channels`: channels a tile spans at least (where a split has them).

    With few rows, equal splits longer than 2 x ROW_BLOCK_MAX are cut again
    into `pieces` (a power of two) equal contiguous pieces for the forward's
    statistics launch (and runs for the backward's sums), while that keeps the
    programs at most GROUP_PROGRAMS_PER_SM per SM: whole channels make
    too few splits where a group has few of them (one channel: one split)."""
    Cg = C // G
    target = GROUP_PROGRAMS_PER_SM * _num_sms(device)
    few_rows = B * G < _num_sms(device)
    splits = min(Cg, _cdiv(target, max(B * G, 1))) if few_rows else 1
    per_split = _cdiv(Cg, splits)
    splits = _cdiv(Cg, per_split)
    pieces, segment = 1, per_split * HW
    if few_rows and Cg % per_split == 0:
        while (B * G * splits * pieces * 2 <= target and segment % (2 * pieces) == 0
               and segment // (2 * pieces) > ROW_BLOCK_MAX):
            pieces *= 2
    block_hw = min(_pow2(HW), max(1, GROUP_TILE_ELEMENTS // min(_pow2(per_split), min_channels)))
    block_c = min(_pow2(per_split), max(1, GROUP_TILE_ELEMENTS // block_hw))
    num_warps = _warps_for(block_c * block_hw, LOOP_ELEMENTS_PER_THREAD)
    stages = _pipeline_stages(block_c * block_hw * element_bytes, _programs_per_sm(num_warps), device)
    return _GroupTiling(splits, per_split, pieces, block_c, block_hw, num_warps, stages)


def _group_runs(programs: int, per_split: int, HW: int, block_c: int, block_hw: int,
                device: torch.device) -> int:
    """Programs per split in GroupNorm's second launch (y, or dx): `programs`
    splits of `per_split` channels each, in [block_c, block_hw] tiles, cut
    into runs of tiles, as many as bring the programs nearest to
    GROUP_PROGRAMS_PER_SM per SM (at most one per tile). Splits are whole
    channels, and a group of 4 channels makes 4 of them: with 32 rows, 128
    programs, 2 runs each. Rounded, not up: 224 splits stay whole, as twice
    as many programs would take two waves (NOTES.md, section 6)."""
    tiles = _cdiv(per_split, block_c) * _cdiv(HW, block_hw)
    target = GROUP_PROGRAMS_PER_SM * _num_sms(device)
    return max(1, min(tiles, (target + programs // 2) // programs))


def _group_long_rows(B: int, C: int, HW: int, G: int, device: torch.device,
                     backward: bool = False) -> Optional[_RowTiling]:
    """The long-row kernels' plan for GroupNorm's B * G rows of Cg * HW
    elements, whatever their length, or None where GroupNorm's own kernels
    take them: fewer than GROUP_LONG_ROWS_PER_SM rows per SM, or Cg * HW no
    multiple of GROUP_LONG_MIN_RUN (`_group_row_kernels` prefers the
    short-row kernels where they take the rows).
    A row that fits one tile is still one program's: the backward's takes the
    warps of its own elements at LOOP_ELEMENTS_PER_THREAD a thread, down to
    one warp and at most the tile's, not the warps of the tile's rows; so
    does the forward's, at ELEMENTS_PER_THREAD, where HW is no multiple of
    LONG_PRESUM (rows whose channels are whole vectors measured faster on the
    tile's warps; NOTES.md, section 6)."""
    if B * G < GROUP_LONG_ROWS_PER_SM * _num_sms(device) or (C // G * HW) % GROUP_LONG_MIN_RUN:
        return None
    t = _row_tiling(B * G, C // G * HW)
    if t.one_pass and (backward or HW % LONG_PRESUM):
        per_thread = LOOP_ELEMENTS_PER_THREAD if backward else ELEMENTS_PER_THREAD
        t = t._replace(num_warps=max(1, min(t.num_warps, t.block_n // (32 * per_thread))))
    return t


def _group_row_kernels(B: int, C: int, HW: int, G: int, device: torch.device,
                       backward: bool = False) -> tuple[str, Optional[_RowTiling]]:
    """Which kernels take GroupNorm's B * G rows of Cg * HW elements, and their
    plan (the forward's or the backward's): ("short", the short-row
    kernels' `_RowTiling`), ("long", `_group_long_rows`) or ("own", None),
    GroupNorm's own kernels.

    The short-row kernels (`_group_rows_fwd_kernel`) take rows whose
    [pow2(Cg), pow2(HW)] block holds at most GROUP_SHORT_ROW_MAX elements,
    in the row kernels' tiles of such blocks (`_row_tiling`), [ROWS,
    BLOCK_C, BLOCK_HW] here; but where the long-row kernels take the rows,
    they keep those of at least GROUP_LONG_ROW_MIN elements that fill the
    block poorly (PADDED_ROW_FILL) or whose HW is no multiple of
    GROUP_SHORT_MIN_RUN: their flat row is masked only at its end and loads
    in vectors."""
    Cg = C // G
    long_rows = _group_long_rows(B, C, HW, G, device, backward)
    block = _pow2(Cg) * _pow2(HW)
    if block <= GROUP_SHORT_ROW_MAX:
        loads_poorly = _fills_poorly(Cg * HW, block, PADDED_ROW_FILL) or HW % GROUP_SHORT_MIN_RUN
        if not (loads_poorly and Cg * HW >= GROUP_LONG_ROW_MIN and long_rows is not None):
            return "short", _row_tiling(B * G, block, backward=backward)
    return ("long", long_rows) if long_rows is not None else ("own", None)


def _group_short_row_meta(t: _RowTiling, C: int, HW: int, G: int, weight) -> dict:
    """The compile-time arguments both short-row kernels take (plan `t`)."""
    return dict(HAS_W=weight is not None, ROWS=t.rows, BLOCK_C=_pow2(C // G), BLOCK_HW=_pow2(HW),
                ALIGN=_align(HW), num_warps=t.num_warps, enable_fp_fusion=FP_FUSION)


def _group_long_sum_channels(Cg: int, HW: int, tile: int) -> int:
    """BLOCK_C of the long-row backward's per-channel sums (GroupNorm, w or b
    trained): tiles of `tile` elements, [BLOCK_C, tile / BLOCK_C], that span
    1 / GROUP_SUM_TILES of a channel's HW positions (rounded up to a power of
    two), fewer channels where Cg has fewer."""
    block_hw = min(tile, _pow2(_cdiv(HW, GROUP_SUM_TILES)))
    return min(_pow2(Cg), tile // block_hw)


def _group_long_sum_tile(Cg: int, N: int, HW: int, t: _RowTiling) -> dict:
    """BLOCK_C and BLOCK_HW of that backward's per-channel sums (GroupNorm's
    rows of N = Cg * HW, plan `t`): GROUP_SUM_ELEMENTS_PER_THREAD a thread,
    at most a chunk, and at most half of a row of one chunk."""
    tile = min(t.block_n, 32 * t.num_warps * GROUP_SUM_ELEMENTS_PER_THREAD)
    if N <= t.block_n:
        tile = min(tile, t.block_n // 2)
    block_c = _group_long_sum_channels(Cg, HW, tile)
    return dict(BLOCK_C=block_c, BLOCK_HW=tile // block_c)


def _group_long_presum(N: int, HW: int, t: _RowTiling) -> int:
    """PRESUM of GroupNorm's long rows of N = Cg * HW (plan `t`): LONG_PRESUM,
    or the elements a thread holds of a chunk where that is fewer, so that a
    group adds up in registers. A group of that size may span two channels
    (`_spans_channels`) where HW is no multiple of it; it is cut down to the
    largest power of two that divides HW, a group in one channel, where that
    is GROUP_ONE_CHANNEL_PRESUM_MIN or more, where HW is shorter than the
    group, and where N is no multiple of it (the row loads in narrower
    vectors)."""
    presum = min(LONG_PRESUM, max(1, t.block_n // (32 * t.num_warps)))
    one_channel = math.gcd(HW, presum)
    if one_channel >= GROUP_ONE_CHANNEL_PRESUM_MIN or HW < presum or N % presum:
        return one_channel
    return presum


def _group_long_row_meta(t: _RowTiling, C: int, HW: int, G: int, weight) -> dict:
    """The compile-time arguments both long-row kernels take for GroupNorm's
    rows of N = Cg * HW (plan `t`)."""
    N = C // G * HW
    return dict(N=N, OFFSET=0.0, CENTER=True, HAS_W=weight is not None, BLOCK_N=t.block_n,
                PRESUM=_group_long_presum(N, HW, t), HW=HW, UNROLL=_unrolled(N, t.block_n), ALIGN=_align(N), SKEW=0,
                num_warps=t.num_warps, enable_fp_fusion=FP_FUSION)


def _group_forward_tiling(x, num_groups) -> _GroupTiling:
    """The forward's plan for x (its splits and pieces size the stats tensor)."""
    B, C = x.shape[:2]
    return _group_tiling(B, C, math.prod(x.shape[2:]), num_groups, _element_bytes(x), x.device)


def _group_stats_shape(B: int, G: int, t: _GroupTiling) -> tuple:
    """The shape of GroupNorm's stats under plan `t`, (B * G, 2 + 2 S p): mean,
    rstd, then S p (mean, m2) pairs of the p = t.pieces pieces of each of
    the S splits (a scratch the backward's split sums reuse)."""
    return (B * G, 2 + 2 * t.splits * t.pieces)


def _group_norm_outputs(x, num_groups, t: _GroupTiling):
    """What `group_norm_forward` returns, allocated: y like x (contiguous), and
    stats, fp32 (`_group_stats_shape`)."""
    stats = torch.empty(_group_stats_shape(x.shape[0], num_groups, t), dtype=torch.float32, device=x.device)
    return _empty_like(x), stats


@_launcher
def group_norm_forward(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Low-level forward: returns (y, stats) (`_group_norm_outputs`)."""
    B, C = x.shape[:2]
    HW = math.prod(x.shape[2:])
    x3 = x.contiguous()   # the kernels index it as (B, C, HW)
    t = _group_forward_tiling(x, num_groups)
    y, stats = _group_norm_outputs(x, num_groups, t)
    if x3.numel() == 0:
        return y, stats
    kernels, plan = _group_row_kernels(B, C, HW, num_groups, x.device)
    if kernels == "short":
        _group_rows_fwd_kernel[(plan.num_tiles,)](
            x3, y, _vector(weight), _vector(bias), stats, B * num_groups, num_groups, C // num_groups, HW,
            stats.stride(0), float(eps), HAS_B=bias is not None,
            **_group_short_row_meta(plan, C, HW, num_groups, weight))
        return y, stats
    if kernels == "long":
        meta = _group_long_row_meta(plan, C, HW, num_groups, weight)
        L = meta["N"]
        _long_row_norm_fwd_kernel[(B * num_groups,)](   # mean and rstd: columns 0 and 1 of stats
            x3, None, None, y, _vector(weight), _vector(bias), stats[:, 0], stats[:, 1],
            L, 0, 0, L, stats.stride(0), num_groups, float(eps), HAS_RESIDUAL=False, HAS_B=bias is not None,
            APPLY=True, SPLITS=1, **meta)
        return y, stats

    def launch(runs=1, **passes):
        _group_norm_fwd_kernel[(B * num_groups * t.splits * runs,)](
            x3, y, _vector(weight), _vector(bias), stats, C, HW, C // num_groups, t.channels_per_split,
            t.splits, t.pieces, runs, stats.stride(0), float(eps), HAS_W=weight is not None,
            HAS_B=bias is not None, BLOCK_C=t.block_c, BLOCK_HW=t.block_hw, STAGES=t.stages, ALIGN=_align(HW),
            num_warps=t.num_warps, enable_fp_fusion=FP_FUSION, **passes)

    if t.splits == t.pieces == 1:
        launch(DO_STATS=True, DO_APPLY=True)
        return y, stats
    segment = t.channels_per_split * HW   # a split's elements, contiguous
    if (C // num_groups) % t.channels_per_split == 0 and segment > ROW_BLOCK_MAX:
        # Equal splits of long segments: the statistics of their pieces by the
        # long-row forward's pass 1 (APPLY=False), one program per piece; the
        # merge and y by GroupNorm's kernel.
        piece, programs = segment // t.pieces, B * num_groups * t.splits * t.pieces
        plan = _row_tiling(programs, piece)
        _long_row_norm_fwd_kernel[(programs,)](
            x3, None, None, y, None, None, stats[:, 2], stats[:, 3], piece, 0, 0, 0, stats.stride(0), 1,
            float(eps), N=piece, OFFSET=0.0, CENTER=True, HAS_RESIDUAL=False, HAS_W=False, HAS_B=False,
            BLOCK_N=plan.block_n, PRESUM=_long_forward_presum(piece, 2), HW=0, APPLY=False,
            SPLITS=t.splits * t.pieces, UNROLL=_unrolled(piece, plan.block_n), ALIGN=_align(piece), SKEW=0,
            num_warps=plan.num_warps, enable_fp_fusion=FP_FUSION)
    else:
        launch(DO_STATS=True, DO_APPLY=False)
    launch(_group_runs(B * num_groups * t.splits, t.channels_per_split, HW, t.block_c, t.block_hw, x.device),
           DO_STATS=False, DO_APPLY=True)
    return y, stats


@_launcher
def group_norm_backward(dy, x, num_groups, weight, bias, stats, compute_dx=True, compute_dw=True, compute_db=True):
    """Low-level backward: returns (dx, dw, db) (`_new_grads`), None for what is
    not computed or has no parameter. `bias` gives db its shape and dtype; the
    kernels do not read it.

    Scratch: a (B * runs, C) fp32 buffer per trained parameter (runs: of a
    split of one channel, few rows), summed over its rows by
    `_reduce_partials`. With w and b frozen, nothing but dx.
    """
    B, C = x.shape[:2]
    HW = math.prod(x.shape[2:])
    x3, dy3 = x.contiguous(), dy.contiguous()   # the kernels index them as (B, C, HW)
    dx, dw, db = _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db)
    compute_dw, compute_db = dw is not None, db is not None   # none without the parameter
    trains = compute_dw or compute_db
    Cg = C // num_groups
    # The forward's splits and pieces (B, C, HW, G and the SM count set them,
    # not the tiles' loads or channels) sized its stats tensor: the same here.
    t = _group_tiling(B, C, HW, num_groups, _element_bytes(x, dy), x.device, GROUP_SUM_CHANNELS if trains else 1)
    stats_shape = _group_stats_shape(B, num_groups, t)
    if tuple(stats.shape) != stats_shape or stats.dtype != torch.float32 or stats.device != x.device:
        raise ValueError(f"stats: expected the {stats_shape} fp32 tensor on {x.device} that group_norm_forward "
                         f"returns for this x, got {tuple(stats.shape)} {stats.dtype} on {stats.device}")
    if x3.numel() == 0 or not (compute_dx or trains):
        return dx, (dw.zero_() if compute_dw else None), (db.zero_() if compute_db else None)
    kernels, plan = _group_row_kernels(B, C, HW, num_groups, x.device, backward=True)
    if kernels == "short":
        dw_partial, db_partial = _sum_targets(B, dw, db)
        _group_rows_bwd_kernel[(plan.num_tiles,)](
            dy3, x3, _vector(weight), stats, dx, dw_partial, db_partial, B * num_groups, num_groups, Cg, HW,
            stats.stride(0), COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            **_group_short_row_meta(plan, C, HW, num_groups, weight))
    elif kernels == "long" and compute_dx:
        # One program per row; its pass 1 sums per group of lanes with w and b
        # frozen (two sums: LONG_WIDE_CHUNK_MAX), per channel (A and D) with
        # either trained; six chunks, not three, at 20481 to 24576
        # (LONG_MIN_CHUNKS), and with either trained up to 40960 where a
        # channel has GROUP_TRAINED_MIN_HW positions (GROUP_TRAINED_MIN_CHUNKS).
        long_rows = _min_chunks(plan, x, Cg * HW,
                                GROUP_TRAINED_MIN_CHUNKS if trains and HW >= GROUP_TRAINED_MIN_HW else None)
        if not trains:
            long_rows = _wide_chunks(long_rows, x, B * num_groups, Cg * HW)
        meta = _group_long_row_meta(long_rows, C, HW, num_groups, weight)
        L = meta["N"]
        dw_partial, db_partial = _sum_targets(B, dw, db)
        if trains:   # pass 1 is the channel sums' loop over HW in tiles of BLOCK_HW
            tile = _group_long_sum_tile(Cg, L, HW, long_rows)
            unroll_sums = _cdiv(HW, tile["BLOCK_HW"]) <= GROUP_SUMS_UNROLL_MAX_STEPS
        else:   # per-lane sums: no channel tile (one compiled variant whatever the shape's)
            tile = dict(BLOCK_C=1, BLOCK_HW=1)
            unroll_sums = _unrolled_sums(L, long_rows.block_n)
        _long_row_norm_bwd_kernel[(B * num_groups,)](
            dy3, x3, _vector(weight), stats[:, 0], stats[:, 1], None, dx, dw_partial, db_partial, None,
            L, L, 0, L, stats.stride(0), num_groups, HAS_DS=False, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            CONSTANTS_ONLY=False,
            **tile, JOINT=not trains and _holds_sm(long_rows.num_warps, LONG_BWD_MAX_REGISTERS),
            UNROLL_SUMS=unroll_sums, maxnreg=LONG_BWD_MAX_REGISTERS, **meta)
    else:
        # The spare columns of the stats tensor are the sums launch's scratch,
        # a pair per program: `pieces` runs of tiles per split with w and b
        # frozen (per-lane sums), and with either trained where a split is
        # one channel (A and D are per channel), else whole splits.
        sum_runs = 1 if trains and t.channels_per_split > 1 else t.pieces
        # Each run leaves its own row of dw and db sums: B * runs rows.
        dw_partial, db_partial = _sum_targets(B * sum_runs, dw, db)

        def launch(runs, pairs, **passes):
            _group_norm_bwd_kernel[(B * num_groups * t.splits * runs,)](
                dy3, x3, _vector(weight), stats, dx, dw_partial, db_partial, C, HW, Cg, t.channels_per_split,
                t.splits, pairs, runs, stats.stride(0), HAS_W=weight is not None,
                COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, BLOCK_C=t.block_c,
                BLOCK_HW=t.block_hw, STAGES=t.stages, ALIGN=_align(HW), num_warps=t.num_warps,
                enable_fp_fusion=FP_FUSION, **passes)

        if compute_dx and t.splits == t.pieces == 1:
            launch(1, 1, DO_SUMS=True, DO_DX=True)
        else:
            launch(sum_runs, 1, DO_SUMS=True, DO_DX=False)
            if compute_dx:
                launch(_group_runs(B * num_groups * t.splits, t.channels_per_split, HW, t.block_c, t.block_hw,
                                   x.device), sum_runs, DO_SUMS=False, DO_DX=True)
    _reduce_partials((dw_partial, dw), (db_partial, db))
    return dx, dw, db


class _GroupNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, num_groups, weight, bias, eps):
        y, stats = group_norm_forward(x, num_groups, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, stats)
        ctx.num_groups = num_groups
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, bias, stats = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = group_norm_backward(dy, x, ctx.num_groups, weight, bias, stats, need[0], need[2], need[3])
        return dx, None, dw, db, None


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """GroupNorm as ``torch.nn.functional.group_norm`` on x of shape (B, C, *spatial)."""
    _check_tensor(x, "x")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (B, C, *spatial) with at least 2 dims, got {tuple(x.shape)}")
    C = x.shape[1]
    if not isinstance(num_groups, int) or num_groups <= 0 or C % num_groups != 0:
        raise ValueError(f"num_groups must be a positive int dividing the {C} channels of x, got {num_groups!r}")
    _check_param(weight, "weight", (C,), x)
    _check_param(bias, "bias", (C,), x)
    _check_real(eps, "eps")
    return _GroupNormFunction.apply(x, num_groups, weight, bias, eps)


class GroupNorm(torch.nn.GroupNorm):
    """Drop-in ``torch.nn.GroupNorm``: same arguments, parameters and state_dict."""

    def forward(self, x):
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


# =============================================================================
# 8. PolyNorm
# =============================================================================
#
# The math (PolyCom). Three RMS-normalized powers of x, mixed by 3 weights:
#
#     u_k = x^k,  r_k = 1 / sqrt(mean(u_k^2) + eps),  uhat_k = u_k * r_k   (k = 1, 2, 3)
#     y = w[0] * uhat_3 + w[1] * uhat_2 + w[2] * uhat_1 + b
#
# The backward. Each term is section 4's RMSNorm backward (a scalar weight in
# place of w) followed by the chain rule through u_k = x^k:
#
#     du_k = w_k * r_k * (dy - uhat_k * a_k),   a_k = mean(dy * uhat_k)
#     dx   = du_1 + du_2 * 2x + du_3 * 3x^2     (w_k: the weight of uhat_k)
#     dw_k = sum over all rows of N * a_k,      db = sum of dy
#
# The row sums N * a_k that dx needs *are* dw's summands, so a frozen weight
# saves little: the per-program sums, a (P x 4) fp32 scratch and the final
# launch. An x without grad drops pass 2 (or the dx arithmetic) entirely.
# Statistics are fp32: x^6 of an fp16 x fits in fp32's range.
#
# Rows longer than POLY_FWD_ROW_BLOCK_MAX (1024): the forward is section 4's
# long-row forward with three per-lane (or per-group) sums. The backward holds
# rows up to POLY_ROW_BLOCK_MAX in a tile (frozen 16-bit ones up to
# ROW_BLOCK_MAX, see the constant); longer ones take section 4's
# long-row backward with three or four per-group sums (dy * x^k, and dy for
# db), and one row's sums are its own dw/db partials: an (M, 4) scratch.
# Both kernels do several times the row norms' arithmetic per element loaded,
# enough that the lanes a partial last chunk masks off cost time. In one-warp
# programs (chunks of 256 and less) such a chunk runs as a block of its own,
# the power of two that holds it (576 = 2 x 256 + 64, not 3 x 256;
# `_tail_block`), whose sums stay in the warp. With more warps its separate
# sum crosses warps, and measured slower than the masked lanes (NOTES.md,
# section 6).


def poly_norm_reference(x, weight, bias, eps=1e-6):
    """Plain-torch PolyNorm, computed in the dtype of x."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)
    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias.reshape(())


@triton.jit
def _poly_weights(W):
    """w0, w1, w2 as fp32 scalars."""
    return tl.load(W).to(tl.float32), tl.load(W + 1).to(tl.float32), tl.load(W + 2).to(tl.float32)


@triton.jit
def _poly_rstd(s1, s2, s3, N, eps):
    """r_k = 1 / sqrt(mean(x^(2k)) + eps) from the row sums s_k = sum(x^(2k))."""
    return 1.0 / tl.sqrt(s1 / N + eps), 1.0 / tl.sqrt(s2 / N + eps), 1.0 / tl.sqrt(s3 / N + eps)


@triton.jit
def _store_poly_stats(Rstd, rows, mask, r1, r2, r3):
    """(r1, r2, r3) of `rows` (a tile's, or one row) into the (M, 3) Rstd, where `mask`."""
    tl.store(Rstd + rows * 3, r1, mask=mask)
    tl.store(Rstd + rows * 3 + 1, r2, mask=mask)
    tl.store(Rstd + rows * 3 + 2, r3, mask=mask)


@triton.jit
def _load_poly_stats(Rstd, rows, mask):
    """The backward's mirror of `_store_poly_stats`: (r1, r2, r3) of `rows`, 0 where not `mask`."""
    return (tl.load(Rstd + rows * 3, mask=mask, other=0.0), tl.load(Rstd + rows * 3 + 1, mask=mask, other=0.0),
            tl.load(Rstd + rows * 3 + 2, mask=mask, other=0.0))


@triton.jit
def _poly_apply(x, r1, r2, r3, w0, w1, w2, bias):
    """y of a tile or a chunk; r1, r2, r3 broadcast against x (per row: [ROWS, 1]).

    y = w0 r3 x^3 + w1 r2 x^2 + w2 r1 x + b in Horner's form: the row constants
    w_k r_k once, then three multiply-adds per element (NOTES.md, section 6)."""
    return x * (w2 * r1 + x * (w1 * r2 + x * (w0 * r3))) + bias


@triton.jit
def _poly_norm_fwd_kernel(
    X, Y, W, B, Rstd,                # X, Y: (M, N); W: (3,); B: (1,); Rstd: (M, 3) fp32
    M, N, stride_x, stride_y, eps,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """PolyNorm forward: y = w0 * x^3 * r3 + w1 * x^2 * r2 + w2 * x * r1 + b,
    for rows up to POLY_FWD_ROW_BLOCK_MAX (whole rows in a tile).

    Grid: (cdiv(M, ROWS),), one tile of ROWS whole rows per program, as
    `_row_norm_fwd_kernel`, loaded in lines of SEG elements (`_segment_tile`:
    a row's three sums stay within a warp). Rstd receives (r1, r2, r3) per row.
    Dtypes: Y is X's dtype; W and B any float dtype; fp32 math.
    ALIGN: `_aligned`'s hint, a power of two dividing N and the row strides; 1 removes it.
    """
    N, stride_x, stride_y = _aligned(N, ALIGN), _aligned(stride_x, ALIGN), _aligned(stride_y, ALIGN)
    tile = tl.program_id(0)
    eps = tl.cast(eps, tl.float32)
    w0, w1, w2 = _poly_weights(W)
    bias = tl.load(B).to(tl.float32)
    x_offs, mask = _segment_tile(tile, M, N, stride_x, ROWS, BLOCK_N, SEG)
    x = _by_row(tl.load(X + x_offs, mask=mask, other=0.0).to(tl.float32), ROWS, BLOCK_N, SEG)
    x2 = x * x
    x4 = x2 * x2
    # The power sums: x^2's alone, x^4's and x^6's as one `tl.reduce` over a
    # pair (per axis, as `_row_sums`), so that each element's x^4 is added in
    # as it is made rather than a whole tile of it held until the third sum:
    # fewer registers, more programs per SM. Chosen by measurement on Triton
    # 3.6 and 3.8 (NOTES.md, section 6): under 3.8 three `tl.sum` took more
    # registers, and one triple made it issue half of x's loads late.
    s1 = _row_sums(x2)
    s2, s3 = tl.reduce(tl.reduce((x4, x4 * x2), 0, _add2), 1, _add2)
    r1, r2, r3 = _poly_rstd(s1, s2, s3, N, eps)
    rows = tile * ROWS + tl.arange(0, ROWS)
    _store_poly_stats(Rstd, rows, rows < M, r1, r2, r3)   # before y, as in `_row_norm_fwd_kernel`
    y = _poly_apply(x, _per_row(r1), _per_row(r2), _per_row(r3), w0, w1, w2, bias)
    y_offs, _ = _segment_tile(tile, M, N, stride_y, ROWS, BLOCK_N, SEG)
    tl.store(Y + y_offs, _as_lines(y, ROWS, BLOCK_N, SEG).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _long_poly_norm_fwd_kernel(
    X, Y, W, B, Rstd,                # as _poly_norm_fwd_kernel
    stride_x, stride_y, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, PRESUM: tl.constexpr, UNROLL: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """PolyNorm forward of rows longer than POLY_FWD_ROW_BLOCK_MAX: the delta on
    `_long_row_norm_fwd_kernel` is three per-group sums (of x^2, x^4, x^6)
    instead of one, and the polynomial in pass 2 (PRESUM and UNROLL as there).

    Grid: (M,), one row per program; pass 1 over BLOCK_N-element chunks
    (evict_last), the three sums reduced across groups once after the loop;
    pass 2 last chunk first (evict_first), mostly from L2. N is a compile-time
    constant, as in the row norms' long-row kernels. A partial last chunk (N
    not a multiple of BLOCK_N) runs with its lanes past N masked where TAIL =
    BLOCK_N, else as one block of TAIL elements, in both passes
    (`_tail_block`). Pointers and dtypes as `_poly_norm_fwd_kernel`.
    ALIGN: `_aligned`'s hint, a power of two dividing the row strides; 1 removes it.
    """
    stride_x, stride_y = _aligned(stride_x, ALIGN), _aligned(stride_y, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    Y += row * stride_y
    eps = tl.cast(eps, tl.float32)
    w0, w1, w2 = _poly_weights(W)
    bias = tl.load(B).to(tl.float32)
    lanes = tl.arange(0, BLOCK_N)
    groups = _lane_groups(BLOCK_N, PRESUM)
    s1_v = tl.zeros([BLOCK_N // PRESUM], dtype=tl.float32)
    s2_v = s1_v
    s3_v = s1_v
    # The whole chunks in the loop, a partial last one after it: masked in the
    # chunk's layout (END = N), or with TAIL < BLOCK_N one group of TAIL lanes
    # of its own, summed apart. Inside the loop, ptxas (Triton 3.6) gave a
    # row of 14848 (four 4096-element chunks, the last partial) 49 registers
    # against 32 at 16384: two 16-warp programs per SM instead of four; after
    # it, 40 (three). The whole chunks keep their mask, always true: without
    # it the row of 16384 took 40 (NOTES.md, section 6).
    FULL: tl.constexpr = N // BLOCK_N * BLOCK_N
    END: tl.constexpr = FULL if TAIL < BLOCK_N else N
    for start in tl.range(0, FULL, BLOCK_N, loop_unroll_factor=_unroll_factor(FULL, BLOCK_N, UNROLL)):
        s1_v, s2_v, s3_v = _add_even_powers(X, start + groups, N, s1_v, s2_v, s3_v)
    if FULL < END:
        s1_v, s2_v, s3_v = _add_even_powers(X, FULL + groups, N, s1_v, s2_v, s3_v)
    s1, s2, s3 = tl.sum(s1_v, axis=0), tl.sum(s2_v, axis=0), tl.sum(s3_v, axis=0)
    if END < N:
        t1, t2, t3 = _add_even_powers(X, FULL + _lane_groups(TAIL, TAIL), N, 0.0, 0.0, 0.0)
        s1, s2, s3 = s1 + tl.sum(t1, axis=0), s2 + tl.sum(t2, axis=0), s3 + tl.sum(t3, axis=0)
    r1, r2, r3 = _poly_rstd(s1, s2, s3, N, eps)
    _store_poly_stats(Rstd, row, True, r1, r2, r3)
    if END < N:   # pass 2, last chunk first: still in L2
        _poly_apply_chunk(X, Y, FULL + tl.arange(0, TAIL), N, r1, r2, r3, w0, w1, w2, bias)
    last: tl.constexpr = (END - 1) // BLOCK_N * BLOCK_N
    for k in tl.range(0, END, BLOCK_N, loop_unroll_factor=_unroll_factor(END, BLOCK_N, UNROLL)):
        _poly_apply_chunk(X, Y, (last - k) + lanes, N, r1, r2, r3, w0, w1, w2, bias)


@triton.jit
def _poly_apply_chunk(X, Y, cols, N, r1, r2, r3, w0, w1, w2, bias):
    """Pass 2 of `_long_poly_norm_fwd_kernel` on the chunk `cols` of a row:
    y of x, which it reads evict_first (its last use)."""
    x = tl.load(X + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(Y + cols, _poly_apply(x, r1, r2, r3, w0, w1, w2, bias).to(Y.dtype.element_ty), mask=cols < N)


@triton.jit
def _add_even_powers(X, cols, N, s1_v, s2_v, s3_v):
    """Pass 1 of `_long_poly_norm_fwd_kernel` on the chunk `cols` of a row (a
    `_lane_groups` view): the per-group sums plus the chunk's x^2, x^4, x^6
    (x read evict_last: pass 2 reads it again)."""
    x = tl.load(X + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    x2 = x * x
    x4 = x2 * x2
    return s1_v + tl.sum(x2, axis=1), s2_v + tl.sum(x4, axis=1), s3_v + tl.sum(x4 * x2, axis=1)


@triton.jit
def _dy_powers(x, dy):
    """dy * x, dy * x^2, dy * x^3: the summands of the row sums N * a_k / r_k."""
    x2 = x * x
    dyx = dy * x
    return dyx, dyx * x, dyx * x2


@triton.jit
def _store_poly_partial(Partial, p, dw0, dw1, dw2, db, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr):
    """Row p of the dw/db partials, (dw_0, dw_1, dw_2, db): the sums of dy *
    uhat_3, dy * uhat_2, dy * uhat_1 (w_0 weighs uhat_3) and of dy."""
    if COMPUTE_DW:
        tl.store(Partial + p * 4, dw0)
        tl.store(Partial + p * 4 + 1, dw1)
        tl.store(Partial + p * 4 + 2, dw2)
    if COMPUTE_DB:
        tl.store(Partial + p * 4 + 3, db)


@triton.jit
def _poly_row_sums(x, dy, r1, r2, r3, WITH_DY: tl.constexpr):
    """Row sums of dy * uhat_1, dy * uhat_2, dy * uhat_3, and with WITH_DY of dy
    (else zeros, which the compiler drops with their uses), for `_by_row`
    tiles x and dy.

    The three power sums are one `tl.reduce` over a triple (per axis, as
    `_row_sums`): where a row spans warps (the plain tile, SEG = BLOCK_N),
    one exchange between warps through shared memory instead of three: the
    kernel's PTX has 5 barriers instead of 11 (frozen weights). dy's sum stays apart:
    folding it in too made the reduction hold four products at once, and the
    tiles of 12288 and 16384 spill when db trains (344 bytes of stack).
    """
    sdy = _row_sums(dy) if WITH_DY else tl.zeros_like(r1)
    s1, s2, s3 = tl.reduce(tl.reduce(_dy_powers(x, dy), 0, _add3), 1, _add3)
    return s1 * r1, s2 * r2, s3 * r3, sdy


@triton.jit
def _poly_dx(x, dy, r1, r2, r3, a1, a2, a3, w0, w1, w2):
    """dx = du_1 + du_2 * 2x + du_3 * 3x^2, du_k = w_k * r_k * (dy - uhat_k * a_k);
    r_k and a_k broadcast against x (a tile's: [ROWS, 1]; a long row's: scalars).

    Multiplied out, dx is dy times a quadratic in x, minus x times a quadratic
    in x^2, whose six coefficients are row constants:

        dx = dy * (p0 + p1 x + p2 x^2) - x * (q0 + q1 x^2 + q2 x^4),
        p_{k-1} = k * w_k * r_k,   q_{k-1} = p_{k-1} * r_k * a_k.

    The whole backward kernel compiles to 15% fewer instructions (SASS of a
    4096 tile: 848 -> 720 with dw, db trained) and measured faster. Under
    POLY_BWD_MAX_REGISTERS this form spills 4 bytes in the trained tile of
    16384 (measured no slower); of the other groupings tried, Horner's form
    in x spills 88 bytes there and measured slower, and so did the chain
    rule's three terms with folded constants (NOTES.md, section 6).
    """
    p0 = w2 * r1
    p1 = 2.0 * w1 * r2
    p2 = 3.0 * w0 * r3
    q0 = p0 * r1 * a1
    q1 = p1 * r2 * a2
    q2 = p2 * r3 * a3
    x2 = x * x
    return dy * (p0 + x * p1 + x2 * p2) - x * (q0 + x2 * q1 + x2 * x2 * q2)


@triton.jit
def _long_poly_norm_bwd_kernel(
    DY, X, W, Rstd, DX, Partial,     # DY, X, DX: (M, N); W: (3,); Rstd: (M, 3) fp32; Partial: (M, 4) fp32
    stride_dy, stride_x, stride_dx,
    N: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, PRESUM: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, JOINT: tl.constexpr,
    UNROLL: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """PolyNorm backward of rows on the long-row plan (`poly_norm_backward`): the delta on
    `_long_poly_norm_fwd_kernel` that `_long_row_norm_bwd_kernel` is on the
    row norms' long forward. Pass 1 sums dy * x^k (k = 1, 2, 3) and dy per
    group of PRESUM elements and reduces them once at the end; pass 2 reads x
    and dy again, last chunk first, and writes dx (`_poly_dx`).

    Grid: (M,), one row per program, launched with at most
    LONG_BWD_MAX_REGISTERS registers per thread. Partial row m receives row
    m's (dw_0, dw_1, dw_2, db) summands, N * (a_3, a_2, a_1) and sum(dy),
    which `_reduce_partials` then sums over the rows. Other pointers and the
    dtypes as `_poly_norm_bwd_kernel`. N is a compile-time constant and
    PRESUM a group's size, as in `_long_row_norm_bwd_kernel`; TAIL and UNROLL
    as in `_long_poly_norm_fwd_kernel`.

    Flags (each False removes code):
      COMPUTE_DX  pass 2: the second read of x and dy, dx and its stores.
      COMPUTE_DW  the stores of the three power sums (dx needs the sums).
      COMPUTE_DB  the per-group sum of dy and its store.
    JOINT: pass 1's sums reduced as one tuple (`_add3`, with COMPUTE_DB
    `_add4`), one exchange between warps; False: a `tl.sum` each (see the
    JOINT rule beside LONG_BWD_MAX_REGISTERS).
    ALIGN: `_aligned`'s hint, a power of two dividing the row strides; 1 removes it.
    """
    stride_dy, stride_x = _aligned(stride_dy, ALIGN), _aligned(stride_x, ALIGN)
    stride_dx = _aligned(stride_dx, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    DY += row * stride_dy
    w0, w1, w2 = _poly_weights(W)
    r1, r2, r3 = _load_poly_stats(Rstd, row, True)
    groups = _lane_groups(BLOCK_N, PRESUM)
    s1_v = tl.zeros([BLOCK_N // PRESUM], dtype=tl.float32)
    s2_v = s1_v
    s3_v = s1_v
    sdy_v = s1_v
    # The loops take the chunks up to END (as in the forward): a partial last
    # one masked, or with TAIL < BLOCK_N the whole ones, and after them the
    # partial one as one group of TAIL lanes, summed apart.
    FULL: tl.constexpr = N // BLOCK_N * BLOCK_N
    END: tl.constexpr = FULL if TAIL < BLOCK_N else N
    for start in tl.range(0, END, BLOCK_N, loop_unroll_factor=_unroll_factor(END, BLOCK_N, UNROLL)):
        s1_v, s2_v, s3_v, sdy_v = _add_dy_powers(X, DY, start + groups, N, s1_v, s2_v, s3_v, sdy_v, COMPUTE_DB)
    if JOINT and COMPUTE_DB:
        s1, s2, s3, sdy = tl.reduce((s1_v, s2_v, s3_v, sdy_v), 0, _add4)
    elif JOINT:
        s1, s2, s3 = tl.reduce((s1_v, s2_v, s3_v), 0, _add3)
        sdy = 0.0
    else:
        s1, s2, s3, sdy = tl.sum(s1_v, axis=0), tl.sum(s2_v, axis=0), tl.sum(s3_v, axis=0), tl.sum(sdy_v, axis=0)
    if END < N:
        t1, t2, t3, tdy = _add_dy_powers(X, DY, FULL + _lane_groups(TAIL, TAIL), N, 0.0, 0.0, 0.0, 0.0, COMPUTE_DB)
        s1, s2, s3 = s1 + tl.sum(t1, axis=0), s2 + tl.sum(t2, axis=0), s3 + tl.sum(t3, axis=0)
        if COMPUTE_DB:
            sdy += tl.sum(tdy, axis=0)
    s1 *= r1   # N * a_1 = sum(dy * uhat_1)
    s2 *= r2
    s3 *= r3
    _store_poly_partial(Partial, row, s3, s2, s1, sdy, COMPUTE_DW, COMPUTE_DB)
    if COMPUTE_DX:   # (DX is None without it)
        DX += row * stride_dx
        lanes = tl.arange(0, BLOCK_N)
        if END < N:   # last chunk first, as in the forward
            _poly_dx_chunk(X, DY, DX, FULL + tl.arange(0, TAIL), N, r1, r2, r3, s1, s2, s3, w0, w1, w2)
        last: tl.constexpr = (END - 1) // BLOCK_N * BLOCK_N
        for k in tl.range(0, END, BLOCK_N, loop_unroll_factor=_unroll_factor(END, BLOCK_N, UNROLL)):
            _poly_dx_chunk(X, DY, DX, (last - k) + lanes, N, r1, r2, r3, s1, s2, s3, w0, w1, w2)


@triton.jit
def _add_dy_powers(X, DY, cols, N, s1_v, s2_v, s3_v, sdy_v, WITH_DY: tl.constexpr):
    """Pass 1 of `_long_poly_norm_bwd_kernel` on the chunk `cols` of a row (a
    `_lane_groups` view): the per-group sums plus the chunk's dy * x^k, and
    with WITH_DY its dy (x and dy read evict_last: pass 2 reads them again)."""
    x = tl.load(X + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dy = tl.load(DY + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    p1, p2, p3 = _dy_powers(x, dy)
    if WITH_DY:
        sdy_v += tl.sum(dy, axis=1)
    return s1_v + tl.sum(p1, axis=1), s2_v + tl.sum(p2, axis=1), s3_v + tl.sum(p3, axis=1), sdy_v


@triton.jit
def _poly_dx_chunk(X, DY, DX, cols, N, r1, r2, r3, s1, s2, s3, w0, w1, w2):
    """Pass 2 of `_long_poly_norm_bwd_kernel` on the chunk `cols` of a row:
    dx of x and dy, which it reads evict_first (their last use), and of the
    row sums s_k = N * a_k."""
    x = tl.load(X + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(DY + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dx = _poly_dx(x, dy, r1, r2, r3, s1 / N, s2 / N, s3 / N, w0, w1, w2)
    tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=cols < N)


@triton.jit
def _poly_norm_bwd_kernel(
    DY, X, W, Rstd, DX, Partial,     # DY, X, DX: (M, N); W: (3,); Rstd: (M, 3); Partial: (P, 4) fp32
    M, N, stride_dy, stride_x, stride_dx, tiles_per_program,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr, STAGES: tl.constexpr,
    ROW_ACCUMULATORS: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """PolyNorm backward of rows held in a tile (`poly_norm_backward`): dx (see section 8),
    and per-program sums for dw and db.

    Grid: (P,), program p takes tiles p, p + P, ... of ROWS whole rows as
    `_row_norm_bwd_kernel`, through a software pipeline STAGES deep; launched
    with at most POLY_BWD_MAX_REGISTERS registers per thread. Tiles are
    loaded in lines of SEG elements, as in `_poly_norm_fwd_kernel`.
    Partial row p receives (dw_0, dw_1, dw_2, db) summed over p's rows.
    Dtypes: DX is its own dtype; DY, X, W any float dtype; fp32 math.

    Flags (each False removes code):
      COMPUTE_DX  the dx arithmetic and stores.
      COMPUTE_DW  the three accumulators and their stores (the row sums
                  stay: dx needs them).
      COMPUTE_DB  the dy row sum, its accumulator and its store.
      STAGES      the software pipeline's depth; 1 removes it and its buffers.
      ROW_ACCUMULATORS  the dw/db accumulators are [ROWS] vectors, a sum per
                  tile row, summed across rows after the loop; False sums
                  each tile's rows at once, into one number per accumulator.
    ALIGN: `_aligned`'s hint, a power of two dividing N and the row strides; 1 removes it.
    """
    N, stride_dy, stride_x = _aligned(N, ALIGN), _aligned(stride_dy, ALIGN), _aligned(stride_x, ALIGN)
    stride_dx = _aligned(stride_dx, ALIGN)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    w0, w1, w2 = _poly_weights(W)
    acc = tl.zeros([ROWS if ROW_ACCUMULATORS else 1], dtype=tl.float32)
    acc_s3 = acc
    acc_s2 = acc
    acc_s1 = acc
    acc_dy = acc
    for i in tl.range(0, tiles_per_program, num_stages=STAGES):
        tile = pid + i * num_programs
        rows = tile * ROWS + tl.arange(0, ROWS)
        r1, r2, r3 = _load_poly_stats(Rstd, rows, rows < M)
        x_offs, mask = _segment_tile(tile, M, N, stride_x, ROWS, BLOCK_N, SEG)
        dy_offs, _ = _segment_tile(tile, M, N, stride_dy, ROWS, BLOCK_N, SEG)
        x = _by_row(tl.load(X + x_offs, mask=mask, other=0.0).to(tl.float32), ROWS, BLOCK_N, SEG)
        dy = _by_row(tl.load(DY + dy_offs, mask=mask, other=0.0).to(tl.float32), ROWS, BLOCK_N, SEG)
        s1, s2, s3, sdy = _poly_row_sums(x, dy, r1, r2, r3, COMPUTE_DB)
        if COMPUTE_DW:
            acc_s3 += s3 if ROW_ACCUMULATORS else tl.sum(s3, axis=0)
            acc_s2 += s2 if ROW_ACCUMULATORS else tl.sum(s2, axis=0)
            acc_s1 += s1 if ROW_ACCUMULATORS else tl.sum(s1, axis=0)
        if COMPUTE_DB:
            acc_dy += sdy if ROW_ACCUMULATORS else tl.sum(sdy, axis=0)
        if COMPUTE_DX:
            dx = _poly_dx(x, dy, _per_row(r1), _per_row(r2), _per_row(r3),
                          _per_row(s1 / N), _per_row(s2 / N), _per_row(s3 / N), w0, w1, w2)
            dx_offs, _ = _segment_tile(tile, M, N, stride_dx, ROWS, BLOCK_N, SEG)
            tl.store(DX + dx_offs, _as_lines(dx, ROWS, BLOCK_N, SEG).to(DX.dtype.element_ty), mask=mask)
    _store_poly_partial(Partial, pid, tl.sum(acc_s3, axis=0), tl.sum(acc_s2, axis=0), tl.sum(acc_s1, axis=0),
                        tl.sum(acc_dy, axis=0), COMPUTE_DW, COMPUTE_DB)


def _poly_long_tiling(t: _RowTiling, x: torch.Tensor) -> _RowTiling:
    """PolyNorm's plan `t` for x's rows, with chunks of one warp for 16-bit
    long-row rows up to POLY_WARP_ROW_MAX but powers of two (see the constant)."""
    N = x.shape[-1]
    if t.one_pass or N > POLY_WARP_ROW_MAX or N == _pow2(N) or x.element_size() > 2:
        return t
    return t._replace(block_n=min(t.block_n, 32 * LONG_ELEMENTS_PER_THREAD), num_warps=1)


def _poly_unrolled_chunks(t: _RowTiling, x: torch.Tensor, trains: bool) -> _RowTiling:
    """PolyNorm's backward plan `t` for x's rows, or, for 16-bit rows up to
    POLY_ROW_BLOCK_MAX on the long-row plan (padded ones; frozen ones past
    ROW_BLOCK_MAX), chunks that `_unrolled` unrolls (see the rule beside
    POLY_ROW_ACCUMULATOR_ROWS): where the last chunk, wider than
    UNROLL_MAX_BLOCK_N, is partial, chunks of UNROLL_MAX_BLOCK_N; frozen,
    where more than UNROLL_MAX_CHUNKS whole chunks of at least LONG_CHUNK_MIN
    would stay a loop, chunks twice as long, the last one partial."""
    N = x.shape[-1]
    if t.one_pass or x.element_size() != 2 or N > POLY_ROW_BLOCK_MAX:
        return t
    if N % t.block_n and t.block_n > UNROLL_MAX_BLOCK_N:
        return _in_chunks(t, UNROLL_MAX_BLOCK_N)
    if (not trains and not _unrolled(N, t.block_n) and t.block_n >= LONG_CHUNK_MIN
            and _unrolled(N, 2 * t.block_n) and N % (2 * t.block_n)):
        return _in_chunks(t, 2 * t.block_n)
    return t


def _tail_block(N: int, t: _RowTiling) -> int:
    """TAIL of PolyNorm's long-row kernels on the chunks of `t`: in one-warp
    programs, the power of two that holds the partial last chunk of a row (N
    mod t.block_n elements); else (or with no partial chunk) t.block_n."""
    rest = N % t.block_n
    return _pow2(rest) if rest and t.num_warps == 1 else t.block_n


def _poly_norm_outputs(x):
    """What `poly_norm_forward` returns, allocated: y like x (contiguous: row
    stride N) and rstd, (M, 3) fp32."""
    return _empty_like(x), torch.empty((x.numel() // x.shape[-1], 3), dtype=torch.float32, device=x.device)


@_launcher
def poly_norm_forward(x, weight, bias, eps=1e-6):
    """Low-level forward: returns (y, rstd) (`_poly_norm_outputs`). No validation."""
    N = x.shape[-1]
    x2, M, stride_x = _as_rows(x, N)
    y, rstd = _poly_norm_outputs(x)
    if M == 0:
        return y, rstd
    # Short rows batched in tiles, one program per tile as in the row norms'
    # forward (a persistent grid measured slower at rows of 256 and 1024);
    # longer rows: the row norms' long-row plan of chunks, whole ones for
    # 16-bit rows where few fit (WHOLE_MAX_CHUNKS), on one warp for
    # 16-bit rows up to POLY_WARP_ROW_MAX (`_poly_long_tiling`).
    plan = dict(block_max=POLY_FWD_ROW_BLOCK_MAX, padded_long=True, padded_min=PADDED_SHORT_ROW_MIN)
    t = _poly_long_tiling(_unhalved_chunks(_few_whole_chunks(_row_tiling(M, N, **plan), x, M, N, **plan), x, N, 3), x)
    args = (x2, y, _vector(weight), _vector(bias), rstd)
    if t.one_pass:
        _poly_norm_fwd_kernel[(t.num_tiles,)](*args, M, N, stride_x, N, float(eps), ROWS=t.rows,
                                             BLOCK_N=t.block_n, SEG=_row_segment(t, (x2,), (stride_x, N)),
                                             ALIGN=_align(N, stride_x), num_warps=t.num_warps,
                                             enable_fp_fusion=FP_FUSION)
    else:
        _long_poly_norm_fwd_kernel[(M,)](*args, stride_x, N, float(eps), N=N, BLOCK_N=t.block_n,
                                         TAIL=_tail_block(N, t),
                                         PRESUM=_long_forward_presum(N, 3), UNROLL=_unrolled(N, t.block_n),
                                         ALIGN=_align(N, stride_x), num_warps=t.num_warps,
                                         enable_fp_fusion=FP_FUSION)
    return y, rstd


@_launcher
def poly_norm_backward(dy, x, weight, bias, rstd, compute_dx=True, compute_dw=True, compute_db=True):
    """Low-level backward: returns (dx, dw, db), None for what is not computed.

    Scratch: with dw or db asked, one (P, 4) fp32 buffer (P: the persistent
    grid, about THREADS_PER_SM threads per SM, at most one program per tile),
    or (M, 4) for rows on the long-row plan (one program per row: rows longer
    than POLY_ROW_BLOCK_MAX, and padded ones, PADDED_ROW_FILL), which
    `_reduce_partials` folds into (M / PARTIAL_FOLD_ROWS, 3) and (.., 1)
    buffers first when M is over PARTIAL_FOLD_ROWS.
    """
    N = x.shape[-1]
    (x2, M, stride_x), (dy2, _, stride_dy) = _as_rows(x, N), _as_rows(dy, N)
    dx, dw, db = _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db)
    if M == 0 or not (compute_dx or compute_dw or compute_db):
        return dx, (dw.zero_() if compute_dw else None), (db.zero_() if compute_db else None)
    trains = compute_dw or compute_db
    dx_stride = N if compute_dx else 0
    wide = N > ROW_BLOCK_MAX   # rows past the row norms' tiles
    plan = dict(backward=not wide, padded_long=True, padded_min=PADDED_SHORT_ROW_MIN,
                block_max=ROW_BLOCK_MAX if wide and not trains and x.element_size() == 2 else POLY_ROW_BLOCK_MAX,
                padded_floor=UNROLL_MAX_BLOCK_N if wide else None)
    t = _few_whole_chunks(_row_tiling(M, N, **plan), x, M, N, **plan)   # WHOLE_MAX_CHUNKS
    t = _wide_chunks(_min_chunks(t, x, N), x, M, N, **plan)   # LONG_MIN_CHUNKS, LONG_WIDE_CHUNK_MAX
    t = _poly_unrolled_chunks(_poly_long_tiling(t, x), x, trains)
    if t.one_pass:
        # Tiled as the row norms' backward, but always on a persistent grid,
        # frozen too: this kernel holds x, dy and the powers of x, too many
        # registers for several programs per SM to overlap without the
        # pipeline (one program per tile measured slower; NOTES.md, section
        # 6). 16 elements per thread up to ROW_BLOCK_MAX, 32 beyond (16
        # warps, not 32, for a row of 16384).
        g = _row_grid(t, (x2, dy2), x.device, persistent=True)
        partial = torch.empty((g.programs, 4), dtype=torch.float32, device=x.device) if trains else None
        _poly_norm_bwd_kernel[(g.programs,)](
            dy2, x2, _vector(weight), rstd, dx, partial,
            M, N, stride_dy, stride_x, dx_stride, g.tiles_per_program,
            COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            ROWS=t.rows, BLOCK_N=t.block_n,
            SEG=_row_segment(t, (x2, dy2, dx), (stride_x, stride_dy, dx_stride),
                             narrow=_fills_poorly(N, t.block_n, PADDED_ROW_FILL)),   # LINE_MIN_BYTES
            STAGES=g.stages, num_warps=t.num_warps,
            ROW_ACCUMULATORS=t.rows >= POLY_ROW_ACCUMULATOR_ROWS, ALIGN=_align(N, stride_dy, stride_x, dx_stride),
            maxnreg=POLY_BWD_MAX_REGISTERS,
            enable_fp_fusion=FP_FUSION)
    else:
        # One row per program, the row norms' long-row plan; a row's sums are
        # its dw/db summands, so the scratch is (M, 4).
        partial = torch.empty((M, 4), dtype=torch.float32, device=x.device) if trains else None
        cap = LONG_BWD_8_WARP_MAX_REGISTERS if _eight_warp_cap(t, x, N) else LONG_BWD_MAX_REGISTERS   # where 64 spills
        _long_poly_norm_bwd_kernel[(M,)](
            dy2, x2, _vector(weight), rstd, dx, partial, stride_dy, stride_x, dx_stride,
            N=N, BLOCK_N=t.block_n, TAIL=_tail_block(N, t), PRESUM=LONG_PRESUM,
            COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            JOINT=_holds_sm(t.num_warps, cap), UNROLL=_unrolled(N, t.block_n),
            ALIGN=_align(N, stride_dy, stride_x, dx_stride), num_warps=t.num_warps, maxnreg=cap,
            enable_fp_fusion=FP_FUSION)
    _reduce_partials((partial[:, :3] if compute_dw else None, dw), (partial[:, 3:] if compute_db else None, db))
    return dx, dw, db


class _PolyNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, rstd = poly_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, bias, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = poly_norm_backward(dy, x, weight, bias, rstd, need[0], need[1], need[2])
        return dx, dw, db, None


def poly_norm(x, weight, bias, eps=1e-6):
    """PolyNorm: w[0] * norm(x^3) + w[1] * norm(x^2) + w[2] * norm(x) + b over the last dim.

    weight has 3 elements, bias one (shape () or (1,)); both are required.
    """
    _check_tensor(x, "x")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    _check_tensor(weight, "weight", device=x.device)
    _check_tensor(bias, "bias", device=x.device)
    if weight.dim() != 1 or weight.numel() != 3:
        raise ValueError(f"weight must have shape (3,), got {tuple(weight.shape)}")
    if bias.numel() != 1 or bias.dim() > 1:
        raise ValueError(f"bias must have shape () or (1,), got {tuple(bias.shape)}")
    _check_real(eps, "eps")
    return _PolyNormFunction.apply(x, weight, bias, eps)


class PolyNorm(torch.nn.Module):
    """PolyNorm over the last dim, weight initialised to 1/3 each and bias to 1.0."""

    def __init__(self, eps=1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.full((3,), 1.0 / 3.0, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.ones((1,), device=device, dtype=dtype))

    def forward(self, x):
        return poly_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"eps={self.eps}"


# =============================================================================
# 9. torch.compile: the launchers as custom ops
# =============================================================================
#
# torch.compile's front end, Dynamo, turns Python into a graph. It traces the
# public functions' checks and the autograd Functions, backward included: the
# backward reads ctx.needs_input_grad from the traced inputs, so a frozen
# weight compiles to the frozen backward. What it does not trace is a
# launcher's host code (plans from device queries, Triton's launcher), so each
# launcher (`_launcher`) is also a torch custom op, which Dynamo puts in the
# graph as one opaque node that runs the launcher at run time, as in eager
# mode. A custom op needs a schema (the argument and result types) and a fake:
# the launcher's outputs allocated, without launching anything, which is how
# the compiler learns their shapes and dtypes. The fakes below are the
# launchers' own allocation helpers. With no graph break at a norm,
# torch.compile(mode="reduce-overhead") captures the whole step in CUDA
# graphs, these kernels included, and its replays skip our host code.
#
# The ops are registered when this module is imported, in a namespace named
# after it: torch.ops.frozen_norm, or torch.ops.pkg_frozen_norm when vendored
# as pkg/frozen_norm.py.

_OPS_NAMESPACE = __name__.replace(".", "_")
_GRADS = "(Tensor?, Tensor?, Tensor?)"
_LAUNCHER_OPS = [   # (launcher, schema, fake)
    (_row_norm_forward,
     "(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, float offset, bool center, SymInt N)"
     " -> (Tensor, Tensor?, Tensor?, Tensor)",
     lambda x, residual, weight, bias, eps, offset, center, N: _row_norm_outputs(x, residual, center, N)),
    (_row_norm_backward,
     "(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor? mean, Tensor rstd, Tensor? ds, float offset,"
     " bool compute_dx, bool compute_dw, bool compute_db) -> " + _GRADS,
     lambda dy, x, weight, bias, mean, rstd, ds, offset, *compute: _new_grads(x, weight, bias, *compute)),
    (group_norm_forward,
     "(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> (Tensor, Tensor)",
     lambda x, num_groups, weight=None, bias=None, eps=1e-5:
         _group_norm_outputs(x, num_groups, _group_forward_tiling(x, num_groups))),
    (group_norm_backward,
     "(Tensor dy, Tensor x, int num_groups, Tensor? weight, Tensor? bias, Tensor stats, bool compute_dx=True,"
     " bool compute_dw=True, bool compute_db=True) -> " + _GRADS,
     lambda dy, x, num_groups, weight, bias, stats, compute_dx=True, compute_dw=True, compute_db=True:
         _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db)),
    (poly_norm_forward,
     "(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> (Tensor, Tensor)",
     lambda x, weight, bias, eps=1e-6: _poly_norm_outputs(x)),
    (poly_norm_backward,
     "(Tensor dy, Tensor x, Tensor weight, Tensor bias, Tensor rstd, bool compute_dx=True, bool compute_dw=True,"
     " bool compute_db=True) -> " + _GRADS,
     lambda dy, x, weight, bias, rstd, compute_dx=True, compute_dw=True, compute_db=True:
         _new_grads(x, weight, bias, compute_dx, compute_dw, compute_db)),
]


def _register_custom_ops():
    # torch.library's low-level registration: the launcher itself is the op's
    # kernel on every device, with no autograd of its own (the autograd
    # Functions above hold it). torch.library.custom_op would wrap each call
    # in checks costing several microseconds more (NOTES.md, section 3).
    # Reloading the module (a notebook's autoreload) keeps the first import's
    # ops: their launchers read this module's globals, which the reload
    # updates. (Replacing the registrations instead crashed torch 2.11's
    # torch.compile.)
    ops = getattr(torch.ops, _OPS_NAMESPACE)
    for launcher, schema, fake in _LAUNCHER_OPS:
        name = launcher.__name__.lstrip("_")
        qualname = f"{_OPS_NAMESPACE}::{name}"
        if not hasattr(ops, name):
            torch.library.define(qualname, schema)
            torch.library.impl(qualname, "CompositeExplicitAutograd", launcher.__wrapped__)
            torch.library.register_fake(qualname, fake)
        _CUSTOM_OPS[launcher.__name__] = getattr(ops, name).default


_register_custom_ops()


# =============================================================================
# 10. Swapping modules in place: replace_norms
# =============================================================================

def _probe_rms_offset(module, hidden: int, eps: float) -> Optional[float]:
    """The offset o for which `module` computes (o + w) * x * rsqrt(mean(x^2) + eps), if any.

    Runs the module on a small fixed input whose rows have mean squares from
    about eps to 100 (so the placement of eps matters) and compares it, in
    float64, with the formula for o = 0 and o = 1. None when neither matches.
    """
    w = module.weight
    if w.device.type == "meta":
        return None
    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 10.0, 0.1, 2.0 * math.sqrt(eps)], dtype=torch.float64)[:, None]
    x = (torch.randn(4, hidden, generator=gen, dtype=torch.float64) * scales).to(torch.float32)
    try:
        with torch.no_grad():
            out = module(x.to(w.device)).to(torch.float64).cpu()
    except Exception:   # a module we cannot run is a module we cannot vouch for
        return None
    x64 = x.to(torch.float64)
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):
        ref = xhat * (offset + w.detach().to(torch.float64).cpu())
        if out.shape == ref.shape and torch.linalg.vector_norm(out - ref) <= 1e-2 * torch.linalg.vector_norm(ref):
            return offset
    return None


def replace_norms(model: torch.nn.Module) -> int:
    """Swap every norm in `model` that is provably equivalent for this module's own; returns the count.

    The rule:
    * ``torch.nn.LayerNorm``, ``torch.nn.RMSNorm`` and ``torch.nn.GroupNorm`` of
      exactly those types (a subclass may override forward) become this
      module's LayerNorm, RMSNorm and GroupNorm.
    * A Hugging Face-style RMSNorm, i.e. a module whose class name ends in
      "RMSNorm", with a 1-D ``weight`` and a float ``eps`` or
      ``variance_epsilon``, becomes this module's RMSNorm when a probe run
      shows it computes w * x * rsqrt(mean(x^2) + eps); one that computes
      (1 + w) * ... (Gemma) becomes RMSNorm(offset=1.0).
    * Everything else (other formulas, modules that fail the probe, this
      module's own classes) is left alone.
    The new module reuses the old module's Parameter objects, so
    requires_grad, optimizer state and state_dict keys are unchanged. Hooks
    registered on a replaced module are not carried over.
    """
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            new = _equivalent_norm(child)
            if new is not None:
                swaps.append((parent, name, new))
    for parent, name, new in swaps:
        setattr(parent, name, new)
    return len(swaps)


def _equivalent_norm(m: torch.nn.Module) -> Optional[torch.nn.Module]:
    """This module's equivalent of `m`, sharing m's parameters, or None."""
    if type(m) is torch.nn.LayerNorm:
        new = LayerNorm(m.normalized_shape, m.eps, elementwise_affine=False)
        new.elementwise_affine = m.elementwise_affine
    elif type(m) is torch.nn.RMSNorm:
        new = RMSNorm(m.normalized_shape, m.eps, elementwise_affine=False)
        new.elementwise_affine = m.elementwise_affine
    elif type(m) is torch.nn.GroupNorm:
        new = GroupNorm(m.num_groups, m.num_channels, m.eps, affine=False)
        new.affine = m.affine
    elif type(m).__name__.endswith("RMSNorm") and not isinstance(m, (RMSNorm, FusedAddRMSNorm)):
        w = getattr(m, "weight", None)
        eps = getattr(m, "eps", getattr(m, "variance_epsilon", None))
        if not isinstance(w, torch.nn.Parameter) or w.dim() != 1 or not isinstance(eps, float):
            return None
        offset = _probe_rms_offset(m, w.shape[0], eps)
        if offset is None:
            return None
        new = RMSNorm(w.shape[0], eps, elementwise_affine=False, offset=offset)
        new.elementwise_affine = True
    else:
        return None
    for pname in ("weight", "bias"):
        if getattr(m, pname, None) is not None or pname in m._parameters:
            new.register_parameter(pname, getattr(m, pname))
    new.train(m.training)
    return new


# =============================================================================
# 11. Seeing the dead code go: compiling for a GPU without one
# =============================================================================
#
# Triton can compile a kernel for a GPU that is not there: give it the argument
# types (the "signature"), the constexpr values and a target. The result holds
# every stage: TTIR (Triton's IR, after the constexpr branches are folded
# away), TTGIR (with layouts), LLVM IR, PTX and a cubin. Compile a backward
# kernel with COMPUTE_DW=True and then False, and the PTX of the second has no
# stores into the dw scratch. bench_frozen_norm.py --dce tabulates this for
# every kernel; the tests assert it.

_POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}


def compile_for_gpu(kernel, args, constexprs, *, num_warps=4, maxnreg=None, enable_fp_fusion=FP_FUSION, arch=90):
    """Compile `kernel` for an NVIDIA GPU of compute capability `arch` (90: H100/H200), no GPU needed.

    args: the runtime arguments in order, as a launch would pass them (tensors
    give only their dtype, so 'meta' tensors do). constexprs: the constexpr
    keyword arguments. num_warps, maxnreg (a register cap per thread) and
    enable_fp_fusion as the launch sets them (None: Triton's default).
    Integers equal to 1 become constants and pointers and multiples of 16 are
    marked 16-aligned, as Triton's launcher does.
    Returns Triton's compiled kernel: ``.asm`` has "ttir", "ttgir", "llir",
    "ptx" and "cubin"; ``.metadata`` the launch facts.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("compile_for_gpu needs Triton's compiler; unset TRITON_INTERPRET to use it")
    signature, constants, attrs = {}, dict(constexprs), {}
    params = [p for p in kernel.arg_names if p not in constexprs]
    for i, (name, value) in enumerate(zip(params, args)):
        index = kernel.arg_names.index(name)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1):
            constants[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = _POINTER_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"argument {name} of type {type(value).__name__} is not supported")
    for name in constants:
        signature[name] = "constexpr"
    signature = {name: signature[name] for name in kernel.arg_names}
    source = ASTSource(kernel, signature, constants, attrs)
    options = {"num_warps": num_warps}
    for name, value in (("maxnreg", maxnreg), ("enable_fp_fusion", enable_fp_fusion)):
        if value is not None:   # None: Triton's default
            options[name] = value
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
