//! `Linear` on the GPU: `y = x·Wᵀ + b` with f32 activations. F32 weights with several rows go
//! through cuBLAS SGEMM (when cuBLAS loads); every other case (decode rows, F16/BF16 and the
//! Q8_0/Q4_0/Q4_1 block weights) runs the `linear_{dtype}` kernels, which dequantize in
//! registers; at one row the `gemv_{dtype}` instances of the same loop (one activation row,
//! at most 64 registers, so more blocks are resident). With `quant_act = 1` and a block weight,
//! activation rows are quantized to Q8_0 (bit-identical to the CPU reference; by the producing
//! `RMSNorm`/`SiluMul` when it was asked to, see `act_quant`) and dotted in integers
//! (`linear_q8act_{dtype}`). Block weights with `k % 256 == 0` take `linear_q8act_sb_*` (16-byte
//! loads of 8 blocks per lane, several lanes per row, `dp4a`), and at one row a kernel that
//! first stages the quantized activation row in shared memory: `linear_q8act_sbh_*` (a lane
//! per half superblock) for 4-bit weights, `linear_q8act_sbx_*` (a lane per superblock) for
//! Q8_0. On compute capability ≥ 9.0, one-row Q8_0 products stream their weight rows through
//! shared memory with bulk copies instead (`linear_q8act_bulk*`, [`BulkPlan`]): each warp keeps
//! a ring of rows in flight, the first ones requested before the kernel waits for its
//! predecessor.
//!
//! Tensor cores (batched decode and prefill): with `quant_act = 1` (the `fast` precision, which
//! already accepts rounded activations) and enough rows ([`tensor_core_rows`]), F16/BF16 and
//! block weights take tensor cores with activations cast to f16 (bf16 for BF16 weights) on the
//! GPU, once for all weights of a call, or not at all when the op that produced them left that
//! copy (`RMSNorm`, `SiluMul`, `Attention` with `quantize_output` 2 / 3, see `act_quant`).
//! F16 weights (`k % 256 == 0`) of 2..=[`F16_MMA_MAX_ROWS`] rows take the F16 `linear_mma` kernels
//! (weights loaded straight into registers); other F16 and all BF16 products go through cuBLAS
//! `GemmEx` from 2 rows (the weights of a multi-weight call of up to [`CONCURRENT_MAX_ROWS`]
//! rows side by side, one per stream of the device). Q8_0/Q4_0/Q4_1 weights
//! (`k % 128 == 0`, 16-byte aligned) of 2..=[`Q8_COPY_MAX_ROWS`](crate::device::Q8_COPY_MAX_ROWS) rows (up to
//! [`MMQ_NO_MMA_MAX_ROWS`] where `k % 256 != 0`) with f32 inputs and
//! outputs take the int8 `linear_mmq` kernels (see `linear_mmq`: each weight block read once for
//! all rows, activations as Q8_0 rows, left by the producing op or quantized once for all
//! weights of the call). Other block-weight products (`k % 256 == 0`) of up to [`MMA_MAX_ROWS`]
//! rows (more rows, or half inputs or outputs) take the f16 `linear_mma` kernels (dequantized
//! in registers); more rows, or other block weights from [`TC_MIN_ROWS`] rows, are dequantized
//! to f16 tile by tile ([`DEQ_TILE_BYTES`]) into a scratch buffer for cuBLAS. Products
//! accumulate and are written in f32. `exact` precision (`quant_act = 0`) keeps the
//! f32-activation kernels.
//!
//! K-quant weights (Q2_K..Q6_K, `k % 256 == 0`) and Q5_0: one row of Q4_K / Q6_K weights
//! (16-byte aligned) with `quant_act = 1` takes `linear_q8act_kq_*` (the row as Q8_0 blocks, a
//! warp per output, four lanes per super-block, `dp4a` with the super-block's sub-scales, Q4_K's
//! mins against the blocks' stored sums). Otherwise the `linear_*`/`gemv_*` kernels read f32
//! activations (for K-quants a warp takes one 256-value super-block per step, 8 values per lane;
//! Q5_0 is decoded value by value); with `quant_act = 1` and [`TC_MIN_ROWS`] rows or more they
//! are dequantized to f16 tiles for cuBLAS (`dequant_f16_q*_k`, `dequant_f16_q5_0`); they have
//! no `linear_mma` kernel.
//!
//! Half activations: with `half_output` = 2 (f16) / 3 (bf16) and a
//! tensor-core product with half activations (the conditions above, not the int8 products, the
//! weight's form equal to the one asked for, no bias, no `accumulate`), the outputs are F16/BF16
//! tensors written by cuBLAS or `linear_mma` directly; an F16/BF16 input (of the weight's form,
//! at least [`TC_MIN_ROWS`] rows) is read as it is, with no cast. Otherwise the flag is ignored
//! and the outputs are f32.
//!
//! `push_peers = 1` on a tensor-parallel rank (a row-parallel product whose fused all-reduce
//! norm follows): a one-row product of F16/BF16 weights on the f32-activation GEMV also stores
//! each output into the group's peers' low-latency slots as it writes it
//! (`P2pGroup::ll_push_ctx`), so the norm only sums.
//!
//! `accumulate = 1` adds the products to what the outputs hold (a residual connection), on
//! every path: the kernels' `acc` flag (`(y + p) + bias`), cuBLAS products through a scratch
//! buffer and `addto_f32` (`beta = 1` may sum in another order). Without a bias that gives the
//! bits of the product added afterwards (`AddTo`), which the device's residual-add pass relies
//! on.
//!
//! Several weights of one input (`weight1`, `weight2`: q/k/v, gate/up) give the bits of
//! separate calls: a GEMV output's sum does not depend on the other outputs, the batched block
//! products give each weight the plan of its product alone (see `mm_split`), and cuBLAS takes
//! them one by one.

use super::act_quant::{ActForm, ActQuant, Held};
use super::blas::{gemm_on, Elem, Gemm, Operand};
use super::buffer::{dptr, ensure_out, scratch, CudaBuffer};
use super::embedding::weight_suffix;
use super::gpu::{int, long, Gpu, KArg, LinSegs};
use super::linear_mma::{mma_product, MmaGpu, MmaPlan, MmaShape, MMA_KC, NARROW_ROWS, WIDE_ROWS};
use super::linear_mmq::{mmq_product, MmqPlan, Q8Rows, MMQ_KC};
use super::mm_split::Product;
use super::op_err;
use super::p2p::GroupSlot;
use crate::data::DataType;
use crate::device::OutputCopy;
use crate::device::{DataDict, FloatDict, IntDict, OpRegistry, Operator};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// Registers this family's operators; `invariant`: batch-invariant products (see
/// [`Linear::invariant`]).
pub fn register(
    ops: &mut OpRegistry,
    gpu: &Arc<Gpu>,
    act: &Arc<ActQuant>,
    invariant: bool,
    group: &GroupSlot,
) {
    ops.insert(
        "Linear",
        Box::new(Linear {
            gpu: gpu.clone(),
            act: act.clone(),
            invariant,
            group: group.clone(),
            tc_scratch: Mutex::new(None),
            mma_part: Mutex::new(None),
            acc_scratch: Mutex::new(None),
        }),
    );
}

/// Activation rows per block of the `linear_*` kernels (`LIN_ROWS` in kernels/linear.cu).
const LIN_ROWS: usize = 4;
/// Output features per block (warps per 256-thread block).
const LIN_FEATURES: usize = 8;
/// From this many rows on, F32 weights use cuBLAS.
const BLAS_MIN_ROWS: usize = 2;
/// From this many rows on, `quant_act = 1` products with block weights that `linear_mma` does not
/// take use cuBLAS tensor cores (below it the GEMV kernels, which read the weight once per 4
/// rows, are faster); also the fewest rows for half-precision inputs and outputs of `Linear`.
pub const TC_MIN_ROWS: usize = 16;
/// Largest f16 tile of a block weight dequantized at once for the tensor-core path.
const DEQ_TILE_BYTES: usize = 128 << 20;
/// Up to this many rows, `quant_act` products with block weights (`k % MMA_KC == 0`, 16-byte
/// aligned) take the `linear_mma` kernels (weights read once per slice of 64 rows, dequantized
/// in registers), from 2 rows on; above it the dequantize-then-cuBLAS path.
const MMA_MAX_ROWS: usize = 128;
/// F16-weight products of up to this many rows take `linear_mma` (weights into registers),
/// more rows cuBLAS: at 16 rows both stream llama-3-8b's large weights alike and `linear_mma`
/// runs the 4096 × 4096 one in half the time; from 32 rows cuBLAS is faster.
const F16_MMA_MAX_ROWS: usize = 16;
/// Block products that `linear_mma` does not take (`k % 256 != 0`) stay on `linear_mmq` up to
/// this many rows (above [`Q8_COPY_MAX_ROWS`](crate::device::Q8_COPY_MAX_ROWS) they quantize
/// their input themselves): faster than dequantized tiles for cuBLAS.
const MMQ_NO_MMA_MAX_ROWS: usize = 64;
/// The most rows whose multi-weight cuBLAS products run side by side on the device's streams
/// (`Linear::concurrent_lanes`): beyond them one product keeps the GPU busy.
const CONCURRENT_MAX_ROWS: usize = 256;
/// From this many rows on, `quant_act` products with F16/BF16 weights use cuBLAS (which reads
/// the weight once for all rows; the GEMV kernels read it once per 4 rows).
const HALF_TC_MIN_ROWS: usize = 2;

/// Whether a `quant_act` product of `rows` rows of `k` values with `dtype` weights runs on
/// tensor cores with f16/bf16 activations (cuBLAS or `linear_mma`) by the device's choice, where
/// cuBLAS loads; fewer rows take the GEMV kernels (Q8_0 activations for block weights).
pub fn tensor_core_rows(dtype: DataType, rows: usize, k: usize) -> bool {
    dtype != DataType::F32 && rows >= Batched::default().tc_min_rows(dtype, k)
}

/// A call's choice of the batched paths (`mma`): the device's (0), no `linear_mma`/`linear_mmq`
/// and no cuBLAS below [`TC_MIN_ROWS`] rows (1: the GEMV kernels below, dequantized tiles for
/// cuBLAS above), the f16 `linear_mma` wherever it applies (2, any number of rows), or the int8
/// `linear_mmq` wherever it applies (3); `mma_splits` > 0 forces their k splits, `mmq_shape`
/// picks the tile shape of `linear_mmq` (0: the device's choice, see
/// [`MmqShape::pick`](super::linear_mmq::MmqShape::pick)), `mma_rows` the weight rows per
/// block of `linear_mma` (0: the device's choice, 128 or 256, see [`MmaPlan::new`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
struct Batched {
    mode: i32,
    splits: usize,
    shape: usize,
    rows: usize,
}

impl Batched {
    fn of_call(ints: &IntDict) -> Result<Batched> {
        let mode = ints.get_or("mma", 0);
        if !(0..=3).contains(&mode) {
            return Err(op_err(
                "Linear",
                format!(
                    "mma {mode}: expected 0 (the device's choice), 1 (off), 2 (f16 kernels) or 3 (int8 kernels)"
                ),
            ));
        }
        let splits = usize::try_from(ints.get_or("mma_splits", 0))
            .map_err(|_| op_err("Linear", "mma_splits must not be negative"))?;
        let shape = usize::try_from(ints.get_or("mmq_shape", 0))
            .map_err(|_| op_err("Linear", "mmq_shape must not be negative"))?;
        let rows = ints.get_or("mma_rows", 0);
        let rows = match usize::try_from(rows) {
            Ok(r) if [0, NARROW_ROWS, WIDE_ROWS].contains(&r) => r,
            _ => {
                return Err(op_err(
                    "Linear",
                    format!("mma_rows {rows}: expected 0 (the device's choice), {NARROW_ROWS} or {WIDE_ROWS}"),
                ))
            }
        };
        Ok(Batched {
            mode,
            splits,
            shape,
            rows,
        })
    }

    /// Whether a block-weight product of `m` rows of `k` values takes `linear_mma` (where it
    /// does not take `linear_mmq`, see [`Batched::mmq`]).
    fn mma(&self, dtype: DataType, m: usize, k: usize) -> bool {
        // (Q5_0, the K-quants and BF16 have no `linear_mma` kernel: dequantized tiles / cuBLAS)
        let fits = mma_kernels(dtype) && k.is_multiple_of(MMA_KC) && m >= 2;
        match self.mode {
            2 => fits,
            0 => {
                let most = if dtype == DataType::F16 {
                    F16_MMA_MAX_ROWS
                } else {
                    MMA_MAX_ROWS
                };
                fits && m <= most
            }
            _ => false,
        }
    }

    /// Whether a block-weight product of `m` rows of `k` values with f32 inputs and outputs
    /// takes `linear_mmq`.
    fn mmq(&self, dtype: DataType, m: usize, k: usize) -> bool {
        let fits = q8_kernels(dtype) && k.is_multiple_of(MMQ_KC) && m >= 2;
        match self.mode {
            3 => fits,
            0 => {
                fits && (m <= crate::device::Q8_COPY_MAX_ROWS
                    || (m <= MMQ_NO_MMA_MAX_ROWS && !k.is_multiple_of(MMA_KC)))
            }
            _ => false,
        }
    }

    /// The fewest rows for which a `quant_act` product with `dtype` weights takes the
    /// tensor-core path (cuBLAS or `linear_mma`).
    fn tc_min_rows(&self, dtype: DataType, k: usize) -> usize {
        if self.mode == 1 {
            TC_MIN_ROWS
        } else if self.mma(dtype, 2, k) || self.mmq(dtype, 2, k) {
            2
        } else if matches!(dtype, DataType::F16 | DataType::BF16) {
            HALF_TC_MIN_ROWS
        } else {
            TC_MIN_ROWS
        }
    }
}

/// The one-row (decode) GEMV for block weights with quantized activations: `Whole`
/// (`linear_q8act_sbx_*`, a lane per superblock) or `Half` (`linear_q8act_sbh_*`, a lane per
/// half superblock, fewer registers: more blocks per SM), both staging the activation row in
/// shared memory and loading weights into registers, or `Bulk` (`linear_q8act_bulk*`, weights
/// streamed through shared memory by bulk copies, compute capability ≥ 9.0, see
/// [`BulkPlan`]). `Auto` takes `Bulk` for Q8_0 where it applies (else `Whole`) and `Half` for
/// 4-bit weights ([`Linear::one_row_half`], [`Linear::bulk_plan`]); a call's `gemv_kernel` =
/// 1 / 2 / 3 forces one for that call (`bulk` still falls back where it does not apply), so
/// tests check every kernel against the reference.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OneRow {
    Auto,
    Whole,
    Half,
    Bulk,
}

impl OneRow {
    /// A call's own choice (`gemv_kernel` 1 / 2 / 3 = sbx / sbh / bulk), or `Auto` for 0;
    /// any other value is an error.
    fn of_call(ints: &IntDict) -> Result<OneRow> {
        match ints.get_or("gemv_kernel", 0) {
            0 => Ok(OneRow::Auto),
            1 => Ok(OneRow::Whole),
            2 => Ok(OneRow::Half),
            3 => Ok(OneRow::Bulk),
            v => Err(op_err(
                "Linear",
                format!("gemv_kernel {v}: expected 0 (the device's choice), 1 (sbx), 2 (sbh) or 3 (bulk)"),
            )),
        }
    }
}

/// Warps per block of the `linear_q8act_bulk*` kernels.
const BULK_WARPS: usize = 8;
/// Most weight slots per warp of the bulk kernels.
const BULK_SLOTS: usize = 4;

/// How a one-row product runs on the `linear_q8act_bulk{lanes}x{items}_*` kernels: `lanes`
/// lanes per weight row (32 / `lanes` rows per warp), at most `items` half superblocks per lane,
/// `slots` row groups in flight per warp, `blocks` blocks of [`BULK_WARPS`] warps, `smem` bytes
/// of shared memory per block (the slots, their barriers and, with `items` > 1, the activation
/// row).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BulkPlan {
    lanes: usize,
    items: usize,
    slots: usize,
    blocks: usize,
    smem: usize,
}

impl BulkPlan {
    /// The plan for `n` rows of `k` values (`row_bytes` each) on a GPU with `sms`
    /// multiprocessors and shared memory `lim`, at most `max_slots` slots per warp; `None` when
    /// the kernels do not cover this shape (fewer than 1024 or more than 16384 values per row,
    /// `k % 256 != 0`) or one slot per warp does not fit.
    fn new(
        k: usize,
        n: usize,
        row_bytes: usize,
        sms: usize,
        lim: super::gpu::SharedMemory,
        max_slots: usize,
    ) -> Option<BulkPlan> {
        if !k.is_multiple_of(256) || n == 0 || max_slots == 0 {
            return None;
        }
        let halves = 2 * (k / 256);
        let lanes = if halves >= 32 {
            32
        } else if halves >= 16 {
            16
        } else if halves >= 8 {
            8
        } else {
            return None;
        };
        // (below 32 lanes a lane never takes more than 2 half superblocks)
        let items = halves.div_ceil(lanes);
        if items > 4 {
            return None;
        }
        let rows_per_warp = 32 / lanes;
        let slot_bytes = rows_per_warp * row_bytes + 8;
        let act = if items > 1 {
            ((k / 256) * (272 + 72)).next_multiple_of(16)
        } else {
            0
        };
        let groups = n.div_ceil(rows_per_warp);
        for per_sm in [2usize, 1] {
            let limit = (lim.per_sm / per_sm)
                .saturating_sub(lim.reserved_per_block)
                .min(lim.block_optin);
            let fit = limit.saturating_sub(act) / (BULK_WARPS * slot_bytes);
            if fit == 0 {
                continue;
            }
            let blocks = groups.div_ceil(BULK_WARPS).min(per_sm * sms).max(1);
            let per_warp = groups.div_ceil(blocks * BULK_WARPS);
            let slots = fit.min(max_slots).min(per_warp).max(1);
            return Some(BulkPlan {
                lanes,
                items,
                slots,
                blocks,
                smem: act + BULK_WARPS * slots * slot_bytes,
            });
        }
        None
    }
}

struct Linear {
    gpu: Arc<Gpu>,
    /// Batch-invariant products: every row count takes the same kernel with the same k split,
    /// so a row's result does not depend on the rows beside it. `quant_act` block weights
    /// (`k % 128 == 0`) take `linear_mmq` from one row on, with the split of a one-row product;
    /// everything else the f32-activation `linear_*`/`gemv_*` loop (no cuBLAS, no tensor cores,
    /// no half inputs or outputs).
    invariant: bool,
    /// Quantized activations for `quant_act = 1` (shared with the ops that can write them).
    act: Arc<ActQuant>,
    /// The peer-to-peer group of a tensor-parallel rank (`push_peers`).
    group: GroupSlot,
    /// Tensor-core path: f16/bf16 activations, then the dequantized weight tile.
    tc_scratch: Mutex<Option<CudaBuffer>>,
    /// Partial sums of the k-split `linear_mma` / `linear_mmq` products.
    mma_part: Mutex<Option<CudaBuffer>>,
    /// cuBLAS products with `accumulate`, before they are added to the outputs.
    acc_scratch: Mutex<Option<CudaBuffer>>,
}

/// The activation form the tensor-core path uses with this weight dtype (`k` values per row),
/// as the model expects it ([`OutputCopy::tensor_core_form`]).
/// True for the block dtypes with Q8_0-activation and `linear_mma` kernels (Q8_0, Q4_0, Q4_1).
fn q8_kernels(t: DataType) -> bool {
    matches!(t, DataType::Q8_0 | DataType::Q4_0 | DataType::Q4_1)
}

/// True for the weight dtypes with `linear_mma` kernels: the Q8_0-activation block dtypes and
/// F16 (`linear_mma{nt}_f16`, weights read straight into registers).
fn mma_kernels(t: DataType) -> bool {
    q8_kernels(t) || t == DataType::F16
}

fn tc_form(w: DataType, k: usize) -> Option<ActForm> {
    ActForm::from_param(OutputCopy::tensor_core_form(w, k).param())
}

/// The half form of an activation dtype (`None` for anything else).
fn half_form(t: DataType) -> Option<ActForm> {
    match t {
        DataType::F16 => Some(ActForm::F16),
        DataType::BF16 => Some(ActForm::Bf16),
        _ => None,
    }
}

/// cuBLAS was loaded when a product began and is not now (cannot happen: it is never unloaded).
fn lost_blas() -> Error {
    Error::Device("cuBLAS unavailable in the middle of a Linear".into())
}

/// Rounds `v` up to a multiple of 256 bytes.
fn align256(v: usize) -> usize {
    v.div_ceil(256) * 256
}

/// Rows of an f16 tile of a `wt` block weight (`k` values per row, `n` rows) dequantized at
/// once for cuBLAS: whole multiples of 256 rows within [`DEQ_TILE_BYTES`] (odd tile heights
/// made cuBLAS pick slow kernels); 0 for weights cuBLAS reads as they are.
fn deq_tile_rows(wt: DataType, k: usize, n: usize) -> usize {
    if wt.is_quantized() {
        let r = DEQ_TILE_BYTES / (2 * k);
        let r = if r >= 256 { r / 256 * 256 } else { r.max(1) };
        r.min(n)
    } else {
        0
    }
}

/// One cuBLAS product of the tensor-core path: `wt` weights, `elem` activations at `act`
/// (`m` rows of `k` values), the dequantized weight tile at `tile`, `acc`: added to the
/// outputs, `out`: the outputs' element type and size in bytes.
#[derive(Clone, Copy)]
struct BlasCall {
    wt: DataType,
    elem: Elem,
    act: u64,
    tile: u64,
    m: usize,
    k: usize,
    acc: bool,
    out: (Elem, u64),
}

impl Linear {
    /// The half form of a product of `rows` rows with weight dtype `w` when it takes the
    /// tensor-core path (`quant_act`, cuBLAS, at least [`TC_MIN_ROWS`] rows) with f16/bf16
    /// activations, else `None` (also where the int8 products of Q8_0 rows take it).
    fn tc_half(&self, i: &IntDict, w: DataType, rows: usize, k: usize) -> Option<ActForm> {
        let tc = i.get_or("quant_act", 0) != 0
            && self.gpu.blas().is_some()
            && rows >= TC_MIN_ROWS
            && !self.invariant;
        let int8 = Batched::of_call(i).is_ok_and(|b| b.mmq(w, rows, k));
        (tc && !int8).then(|| tc_form(w, k)).flatten()
    }

    /// Whether a half input of `form` can be read as it is: the tensor-core path with the
    /// weight's form equal to the input's.
    fn half_input_ok(&self, d: &DataDict, i: &IntDict, form: ActForm) -> bool {
        let (Some(x), Some(w)) = (d.get("input"), d.dtype("weight")) else {
            return false;
        };
        let k = x.dim(-1);
        self.tc_half(i, w, x.count() / k.max(1), k) == Some(form)
    }

    /// The outputs' dtype: F16/BF16 when `half_output` asks for the weight's tensor-core form
    /// and this product takes that path without bias or `accumulate`; F32 otherwise.
    fn output_dtype(&self, d: &DataDict, i: &IntDict, rows: usize, k: usize) -> DataType {
        let asked = ActForm::from_param(i.get_or("half_output", 0));
        let plain =
            SEGMENTS.iter().all(|(_, bn, _)| !d.contains(bn)) && i.get_or("accumulate", 0) == 0;
        let form = d.dtype("weight").and_then(|w| self.tc_half(i, w, rows, k));
        match asked {
            Some(ActForm::F16) if plain && form == asked => DataType::F16,
            Some(ActForm::Bf16) if plain && form == asked => DataType::BF16,
            _ => DataType::F32,
        }
    }

    /// Whether a one-row product takes the half-superblock kernel: 4-bit weights do (fewer
    /// registers, more resident blocks: the faster one for them); Q8_0 keeps `sbx`.
    /// The choice depends on the dtype only, so a multi-weight launch and one-weight launches of
    /// the same weights sum in the same order (bit-equal results).
    fn one_row_half(&self, choice: OneRow, dtype: DataType) -> bool {
        match choice {
            OneRow::Whole => false,
            OneRow::Half => true,
            OneRow::Auto | OneRow::Bulk => matches!(dtype, DataType::Q4_0 | DataType::Q4_1),
        }
    }

    /// The bulk-copy plan for a one-row product of `n` rows of `k` values, where the GPU has
    /// bulk copies (compute capability ≥ 9.0) and the kernel choice allows it.
    fn bulk_plan(&self, choice: OneRow, dtype: DataType, k: usize, n: usize) -> Option<BulkPlan> {
        let wanted = match choice {
            OneRow::Bulk => true,
            // faster than `sbx` for Q8_0 on Hopper; `sbh` stays faster for 4-bit weights
            OneRow::Auto => dtype == DataType::Q8_0,
            OneRow::Whole | OneRow::Half => false,
        };
        if self.gpu.arch().0 < 9 || !wanted {
            return None;
        }
        let rb = dtype.row_bytes(k).ok()?;
        BulkPlan::new(
            k,
            n,
            rb,
            self.gpu.sms(),
            self.gpu.shared_memory(),
            BULK_SLOTS,
        )
    }

    /// `y (+)= x·Wᵀ` through cuBLAS SGEMM (`acc`: added to y). `Ok(false)` without cuBLAS.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &self,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        acc: bool,
    ) -> Result<bool> {
        let Some(blas) = self.gpu.blas() else {
            return Ok(false);
        };
        let (m, n, k) = match (i32::try_from(m), i32::try_from(n), i32::try_from(k)) {
            (Ok(m), Ok(n), Ok(k)) => (m, n, k),
            _ => return Ok(false),
        };
        let blas = blas
            .lock()
            .map_err(|_| Error::Device("cuBLAS handle poisoned".into()))?;
        self.gpu.bind()?;
        let (alpha, beta) = (1.0f32, if acc { 1.0f32 } else { 0.0 });
        use cudarc::cublas::sys::cublasOperation_t as Op;
        // Row-major y[m,n] = x[m,k]·W[n,k]ᵀ is column-major yᵀ[n,m] = W·xᵀ with W read transposed.
        // SAFETY: x, w, y are device buffers of m·k, n·k and m·n floats (checked in reshape).
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                Op::CUBLAS_OP_T,
                Op::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha,
                w as *const f32,
                k,
                x as *const f32,
                k,
                &beta,
                y as *mut f32,
                n,
            )
        }
        .map_err(|e| Error::Device(format!("cuBLAS sgemm: {e}")))?;
        Ok(true)
    }
}

impl Linear {
    /// The tensor-core products `y_i (+)= x·W_iᵀ + b_i` of one input and the segments' weights
    /// (see the module doc). The input is cast to f16/bf16 once for all of them, or not at all
    /// when the op that produced it left that copy (`prev`, `quantize_output` = 2 / 3). With
    /// `acc` the products are added to what the outputs hold (cuBLAS `beta = 1`). `Ok(false)`
    /// when cuBLAS is not loaded.
    #[allow(clippy::too_many_arguments)]
    fn tensor_core(
        &self,
        prev: Option<Held>,
        bat: Batched,
        xp: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        acc: bool,
        io: HalfIo,
    ) -> Result<bool> {
        let Some(first) = segs.first() else {
            return Ok(true);
        };
        // (bf16 outputs come only with BF16 weights, which take cuBLAS)
        let mma = bat.mma(first.dtype, m, k)
            && io.output != Some(ActForm::Bf16)
            && segs.iter().all(|s| s.w % 16 == 0);
        if self.gpu.blas().is_none() {
            return Ok(false);
        }
        let wt = first.dtype;
        let (elem, form) = if wt == DataType::BF16 {
            (Elem::Bf16, ActForm::Bf16)
        } else {
            (Elem::F16, ActForm::F16)
        };
        let produced = prev
            .filter(|_| !io.input)
            .and_then(|p| produced_copy(p, form, xp, m, k));
        let max_tile = if mma {
            0
        } else {
            segs.iter()
                .map(|s| deq_tile_rows(wt, k, s.n))
                .max()
                .unwrap_or(0)
        };
        let act_bytes = if produced.is_some() || io.input {
            0
        } else {
            align256(m * k * 2)
        };
        let need = act_bytes + max_tile * k * 2;
        let mut guard = self
            .tc_scratch
            .lock()
            .map_err(|_| Error::Device("Linear scratch poisoned".into()))?;
        let sp = scratch(&self.gpu, &mut guard, need, true)?;
        let act = match produced {
            Some(p) => p,
            None if io.input => xp,
            None => {
                self.cast_half(xp, sp, m * k, elem)?;
                sp
            }
        };
        if mma {
            drop(guard);
            return self
                .mma_segments(bat, act, m, k, segs, acc, io)
                .map(|()| true);
        }
        let out = match io.output {
            Some(ActForm::F16) => (Elem::F16, 2u64),
            Some(ActForm::Bf16) => (Elem::Bf16, 2),
            _ => (Elem::F32, 4),
        };
        let call = BlasCall {
            wt,
            elem,
            act,
            tile: sp + act_bytes as u64,
            m,
            k,
            acc,
            out,
        };
        self.cublas_segments(&call, segs)
    }

    /// Casts `len` f32 values at `src` to `elem` (f16 or bf16) at `dst`.
    fn cast_half(&self, src: u64, dst: u64, len: usize, elem: Elem) -> Result<()> {
        self.gpu.launch(
            "cast_f32_half",
            Gpu::grid_for(len, 256),
            256,
            &[
                KArg::Ptr(src),
                KArg::Ptr(dst),
                long(len, "elements")?,
                KArg::I32((elem == Elem::Bf16) as i32),
            ],
        )
    }

    /// The segments' products through cuBLAS (see [`BlasCall`]), block weights dequantized to
    /// f16 tile by tile ([`deq_tile_rows`]); biases added after. With `acc`, each product goes
    /// to a scratch buffer first and is then added to the outputs (`addto_f32`, as `AddTo`
    /// adds): cuBLAS with `beta = 1` may order its sums differently from `beta = 0`, and the
    /// fused residual add must give the bits of the product added afterwards. `Ok(false)`
    /// without cuBLAS.
    fn cublas_segments(&self, c: &BlasCall, segs: &[Seg]) -> Result<bool> {
        let lanes = self.concurrent_lanes(c, segs);
        if lanes > 1 {
            return self.cublas_side_by_side(c, segs, lanes);
        }
        for sg in segs {
            if !c.acc {
                self.cublas_segment(c, sg, sg.y)?;
                continue;
            }
            let len = c.m * sg.n;
            let mut guard = self
                .acc_scratch
                .lock()
                .map_err(|_| Error::Device("Linear scratch poisoned".into()))?;
            let tmp = scratch(&self.gpu, &mut guard, len * 4, true)?;
            let plain = BlasCall { acc: false, ..*c };
            self.cublas_segment(&plain, sg, tmp)?;
            self.gpu.launch(
                "addto_f32",
                Gpu::grid_for(len, 256),
                256,
                &[
                    KArg::Ptr(sg.y),
                    KArg::Ptr(tmp),
                    long(len, "outputs")?,
                    long(len, "outputs")?,
                    KArg::F32(1.0),
                ],
            )?;
        }
        Ok(true)
    }

    /// How many streams the segments' products take at once: one per segment (the first on the
    /// device's stream, the others on its side streams) for at most [`CONCURRENT_MAX_ROWS`]
    /// rows of f16/bf16 weights without biases or `acc`, whose products stream weights while
    /// leaving most multiprocessors idle; else 1.
    fn concurrent_lanes(&self, c: &BlasCall, segs: &[Seg]) -> usize {
        let n = segs.len();
        let plain = !c.acc && !c.wt.is_quantized() && segs.iter().all(|s| s.b == 0);
        if n > 1 && plain && c.m <= CONCURRENT_MAX_ROWS && n - 1 <= self.gpu.side_streams() {
            n
        } else {
            1
        }
    }

    /// The segments' products on `lanes` streams at once (see [`Linear::concurrent_lanes`]):
    /// each the same cuBLAS call as on the stream, so the same results. The side streams are
    /// joined back whatever fails.
    fn cublas_side_by_side(&self, c: &BlasCall, segs: &[Seg], lanes: usize) -> Result<bool> {
        self.gpu.fork(lanes - 1)?;
        let mut done = Ok(true);
        for (lane, sg) in segs.iter().enumerate() {
            done = self.blas_rows(c, sg.w, sg.n, sg.y, sg.n, lane);
            if !matches!(done, Ok(true)) {
                break;
            }
        }
        self.gpu.join(lanes - 1)?;
        match done? {
            true => Ok(true),
            false => Err(lost_blas()),
        }
    }

    /// One segment's product `c` (and bias) through cuBLAS into `y` ([`Linear::cublas_segments`]).
    fn cublas_segment(&self, c: &BlasCall, sg: &Seg, y: u64) -> Result<()> {
        let (wt, k, n) = (c.wt, c.k, sg.n);
        if wt.is_quantized() {
            let suffix = weight_suffix(wt).ok_or_else(|| op_err("Linear", "weight dtype"))?;
            let row_bytes = wt.row_bytes(k)?;
            let rows = deq_tile_rows(wt, k, n);
            let mut r0 = 0;
            while r0 < n {
                let nr = rows.min(n - r0);
                self.gpu.launch(
                    &format!("dequant_f16_{suffix}"),
                    Gpu::grid_for(nr * k / 4, 256),
                    256,
                    &[
                        KArg::Ptr(sg.w),
                        KArg::Ptr(c.tile),
                        long(r0, "row")?,
                        long(nr, "rows")?,
                        int(k, "k")?,
                        long(row_bytes, "row bytes")?,
                    ],
                )?;
                if !self.blas_rows(c, c.tile, nr, y + c.out.1 * r0 as u64, n, 0)? {
                    return Err(lost_blas());
                }
                r0 += nr;
            }
        } else if !self.blas_rows(c, sg.w, n, y, n, 0)? {
            return Err(lost_blas());
        }
        if sg.b != 0 {
            self.add_bias(y, sg.b, c.m, n)?;
        }
        Ok(())
    }

    /// `rows` outputs (weight rows at `a_ptr`, outputs at `c_ptr` with leading dimension `ldc`)
    /// of the product `c` through cuBLAS on `lane` (see [`gemm_on`]): row-major y[m, n] = x·Wᵀ
    /// is column-major yᵀ[n, m] = W·xᵀ, W read transposed.
    fn blas_rows(
        &self,
        c: &BlasCall,
        a_ptr: u64,
        rows: usize,
        c_ptr: u64,
        ldc: usize,
        lane: usize,
    ) -> Result<bool> {
        let operand = |ptr: u64, elem: Elem, ld: usize| Operand {
            ptr,
            elem,
            ld,
            stride: 0,
        };
        gemm_on(
            &self.gpu,
            lane,
            &Gemm {
                ta: true,
                tb: false,
                m: rows,
                n: c.m,
                k: c.k,
                a: operand(a_ptr, c.elem, c.k),
                b: operand(c.act, c.elem, c.k),
                c: operand(c_ptr, c.out.0, ldc),
                batch: 1,
                alpha: 1.0,
                beta: if c.acc { 1.0 } else { 0.0 },
                tf32: false,
            },
        )
    }

    /// The segments' products through `linear_mma` (one launch, biases and `acc` inside), the
    /// f16 activations at `act`.
    #[allow(clippy::too_many_arguments)]
    fn mma_segments(
        &self,
        bat: Batched,
        act: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        acc: bool,
        io: HalfIo,
    ) -> Result<()> {
        let Some((p, suffix)) = product(segs, m, k, acc)? else {
            return Ok(());
        };
        let gpu = MmaGpu {
            sms: self.gpu.sms(),
            smem_optin: self.gpu.shared_memory().block_optin,
        };
        // each weight with the plan of its product alone (the same sums as separate launches)
        let plans = segs
            .iter()
            .map(|s| {
                let shape = MmaShape {
                    m,
                    k,
                    ntot: s.n,
                    block_bytes: p.row_bytes / (k / 32).max(1),
                };
                MmaPlan::new(shape, gpu, bat.splits, bat.rows)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| op_err("Linear", format!("no tensor-core plan for k = {k}")))?;
        let half = io.output == Some(ActForm::F16);
        mma_product(&self.gpu, &plans, suffix, act, p, half, &self.mma_part)
    }

    /// Q8_0 rows of the f32 input at `xp` ([`m`, `k`]) in the activation buffer: the copy the
    /// producer (or, with `reuse_act`, the previous `Linear`) left, or quantized now.
    fn q8_rows(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        xp: u64,
        m: usize,
        k: usize,
    ) -> Result<Q8Rows> {
        let nblocks = m * k / 32;
        let (qs, ds, key) = self.act.slots(xp, m, k)?;
        let reuse = ints.get_or("reuse_act", 0) != 0;
        let ready = prev.is_some_and(|p| p.key == key && (reuse || p.produced));
        if !ready {
            self.gpu.launch(
                "quantize_q8_f32",
                Gpu::grid_for(nblocks * 32, 256),
                256,
                &[
                    KArg::Ptr(xp),
                    KArg::Ptr(qs),
                    KArg::Ptr(ds),
                    long(nblocks, "blocks")?,
                ],
            )?;
        }
        self.act.set(key, false)?;
        Ok(Q8Rows {
            values: qs,
            scales: ds,
        })
    }

    /// The segments' products through `linear_mmq` (one launch, biases and `acc` inside) with
    /// the input as Q8_0 rows ([`Linear::q8_rows`]).
    #[allow(clippy::too_many_arguments)]
    fn mmq_segments(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        bat: Batched,
        xp: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        acc: bool,
    ) -> Result<()> {
        let Some((p, suffix)) = product(segs, m, k, acc)? else {
            return Ok(());
        };
        let sms = self.gpu.sms();
        // each weight with the plan of its product alone (the same sums as separate launches);
        // batch-invariant products with the k split of a one-row product for every row count
        let plans = segs
            .iter()
            .map(|s| {
                let splits = if self.invariant {
                    MmqPlan::new(1, k, s.n, sms, 0, 0, true).map_or(1, |p| p.splits)
                } else {
                    bat.splits
                };
                MmqPlan::new(m, k, s.n, sms, splits, bat.shape, self.invariant)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| op_err("Linear", format!("no int8 tensor-core plan for k = {k}")))?;
        let x = self.q8_rows(prev, ints, xp, m, k)?;
        mmq_product(&self.gpu, &plans, suffix, x, p, &self.mma_part)
    }

    fn add_bias(&self, yp: u64, bp: u64, m: usize, n: usize) -> Result<()> {
        self.gpu.launch(
            "addbias_f32",
            Gpu::grid_for(m * n, 256),
            256,
            &[
                KArg::Ptr(yp),
                KArg::Ptr(bp),
                long(m, "rows")?,
                long(n, "n")?,
            ],
        )
    }
}

impl Operator for Linear {
    fn can_run(&self, d: &DataDict, _: &FloatDict, i: &IntDict) -> bool {
        let w_ok = d.dtype("weight").and_then(weight_suffix).is_some();
        let quant_act =
            i.get_or("quant_act", 0) != 0 && d.dtype("weight").is_some_and(|t| t.is_quantized());
        // extra weights (weight1, weight2) share the first one's dtype; their biases are f32
        let extra_ok = SEGMENTS[1..].iter().all(|(wn, bn, _)| {
            d.get(wn)
                .is_none_or(|w| Some(w.dtype()) == d.dtype("weight") && w.is_contiguous())
                && d.get(bn).is_none_or(|b| b.dtype() == DataType::F32)
        });
        // a half input only where the tensor-core path takes it as it is
        let input_ok = match d.dtype("input").map(half_form) {
            Some(None) => d.dtype("input") == Some(DataType::F32),
            Some(Some(form)) => self.half_input_ok(d, i, form),
            None => false,
        };
        input_ok
            && w_ok
            && extra_ok
            && (!quant_act || d.get("input").is_some_and(|x| x.dim(-1) % 32 == 0))
            && d.get("bias").is_none_or(|b| b.dtype() == DataType::F32)
            && d.get("input").is_some_and(|x| x.is_contiguous())
            && d.get("weight").is_some_and(|x| x.is_contiguous())
    }
    fn reshape(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        OneRow::of_call(ints)?;
        Batched::of_call(ints)?;
        let acc = ints.get_or("accumulate", 0) != 0;
        for (wn, bn, on) in SEGMENTS {
            if wn != "weight" && !d.contains(wn) {
                if d.contains(bn) {
                    return Err(op_err("Linear", format!("'{bn}' without '{wn}'")));
                }
                continue;
            }
            let x = d.require("Linear", "input")?;
            let w = d.require("Linear", wn)?;
            let k = x.dim(-1);
            if x.dims().is_empty() || w.dims().len() != 2 || w.dim(1) != k {
                return Err(op_err(
                    "Linear",
                    format!(
                        "input {:?} and {wn} {:?} do not match (weight must be [n, {k}])",
                        x.dims(),
                        w.dims()
                    ),
                ));
            }
            let n = w.dim(0);
            if let Some(b) = d.get(bn) {
                if b.count() != n {
                    return Err(op_err(
                        "Linear",
                        format!("{bn} {:?} does not match {n} outputs", b.dims()),
                    ));
                }
            }
            let mut dims = x.dims().to_vec();
            if let Some(l) = dims.last_mut() {
                *l = n;
            }
            let rows = x.count() / k.max(1);
            if acc {
                let y = d.require("Linear", on)?;
                let ok = y.dims() == dims.as_slice()
                    && y.dtype() == DataType::F32
                    && y.is_contiguous()
                    && super::buffer::device_len(y).is_some_and(|l| l >= 4 * n * rows);
                if !ok {
                    return Err(op_err(
                        "Linear",
                        format!(
                            "accumulate needs {on} to be an F32 GPU tensor {dims:?}, got input {:?}, {on} {} {:?}",
                            x.dims(),
                            y.dtype(),
                            y.dims()
                        ),
                    ));
                }
                continue;
            }
            let dt = self.output_dtype(d, ints, rows, k);
            ensure_out(&self.gpu, d.require_mut("Linear", on)?, dt, &dims)?;
        }
        Ok(())
    }
    fn run(&self, d: &mut DataDict, _: &FloatDict, ints: &IntDict) -> Result<()> {
        // What the previous call (or the op that produced this input) left quantized; cleared
        // now, so only a call that quantizes leaves a record behind (reuse needs the
        // immediately preceding call).
        let prev = self.act.take()?;
        let mut segs = Vec::with_capacity(3);
        for (wn, bn, on) in SEGMENTS {
            let Some(w) = d.get(wn) else { continue };
            let b = d.get(bn);
            let y = d.require("Linear", on)?;
            segs.push(Seg {
                w: dptr(w, wn)?,
                dtype: w.dtype(),
                n: w.dim(0),
                b: b.map(|b| dptr(b, bn)).transpose()?.unwrap_or(0),
                y: dptr(y, on)?,
            });
        }
        let x = d.require("Linear", "input")?;
        let k = x.dim(-1);
        let m = x.count() / k.max(1);
        let xp = dptr(x, "input")?;
        let io = HalfIo {
            input: half_form(x.dtype()).is_some(),
            output: half_form(d.require("Linear", "output")?.dtype()),
        };
        if prev.is_some_and(|h| h.split) {
            return self.split_input_product(prev, ints, xp, m, k, &segs, io);
        }
        if let [seg] = segs.as_slice() {
            if m == 1 && !io.input && io.output.is_none() && self.pushed_gemv(ints, xp, k, seg)? {
                return Ok(());
            }
        }
        if segs.len() > 1 {
            let w0 = d.require("Linear", "weight")?.dtype();
            if w0 == DataType::F32 && m >= BLAS_MIN_ROWS {
                // SGEMM: one weight at a time
                for i in 0..segs.len() {
                    self.product(None, ints, xp, m, k, &segs[i..i + 1], io)?;
                }
                return Ok(());
            }
        }
        self.product(prev, ints, xp, m, k, &segs, io)
    }
}

impl Linear {
    /// The product of an input a row-split norm wrote (`prev`, [`Held::split`]): its f32 rows
    /// hold only this rank's share, so the tensor-core path must read the half copy it left.
    /// `Err` naming the mismatch otherwise (the fuse pass pairs such a norm with this call).
    #[allow(clippy::too_many_arguments)]
    fn split_input_product(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        xp: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        io: HalfIo,
    ) -> Result<()> {
        let form = match segs.first().map(|s| s.dtype) {
            Some(DataType::BF16) => ActForm::Bf16,
            _ => ActForm::F16,
        };
        let tc_weights = segs.iter().all(|s| tc_weight(s.dtype, k));
        let usable = !io.input
            && !self.invariant
            && tc_weights
            && ints.get_or("quant_act", 0) != 0
            && prev.is_some_and(|h| produced_copy(h, form, xp, m, k).is_some());
        let bat = Batched::of_call(ints)?;
        let acc = ints.get_or("accumulate", 0) != 0;
        if !usable || !self.tensor_core(prev, bat, xp, m, k, segs, acc, io)? {
            return Err(op_err(
                "Linear",
                format!(
                    "input [{m}, {k}] comes from a row-split norm, whose rows only its {form:?} \
                     copy holds whole; this product cannot read that copy"
                ),
            ));
        }
        Ok(())
    }

    /// With `push_peers` on a rank of a peer-to-peer group: the one-row product of a half
    /// weight `seg` (the f32-activation GEMV `gemv1_*`, as [`Linear::gemv`] runs it) that also
    /// pushes each output into the peers' low-latency slots for the fused norm after it
    /// (`P2pGroup::ll_push_ctx`). `Ok(false)` when it does not apply (then nothing ran).
    fn pushed_gemv(&self, ints: &IntDict, xp: u64, k: usize, seg: &Seg) -> Result<bool> {
        let half = matches!(seg.dtype, DataType::F16 | DataType::BF16);
        let Some(g) = self.group.get() else {
            return Ok(false);
        };
        if ints.get_or("push_peers", 0) == 0 || !half {
            return Ok(false);
        }
        let Some((ctx, epoch)) = g.ll_push_ctx(seg.n, seg.y)? else {
            return Ok(false);
        };
        let mut table = seg_table(std::slice::from_ref(seg), ints.get_or("accumulate", 0) != 0)?;
        table.p2p = ctx;
        table.p2p_ek = epoch;
        let suffix = weight_suffix(seg.dtype).ok_or_else(|| op_err("Linear", "weight dtype"))?;
        let (gx, gy) = gemv_grid(seg.n, LIN_FEATURES, 1)?;
        let args = [
            KArg::Ptr(xp),
            KArg::Segs(table),
            int(1, "rows")?,
            int(seg.n, "outputs")?,
            int(k, "k")?,
            long(seg.dtype.row_bytes(k)?, "row bytes")?,
        ];
        let threads = (32 * LIN_FEATURES) as u32;
        self.gpu
            .launch(&format!("gemv1_{suffix}"), (gx, gy, 1), threads, &args)?;
        g.mark_ll_pushed(seg.y)?;
        Ok(true)
    }
}

/// (weight, bias, output) argument names of the segments a `Linear` call may carry.
const SEGMENTS: [(&str, &str, &str); 3] = [
    ("weight", "bias", "output"),
    ("weight1", "bias1", "output1"),
    ("weight2", "bias2", "output2"),
];

/// Which side of a product is in half precision: the input (read as it is) and the outputs'
/// form (`None`: f32).
#[derive(Clone, Copy, Default)]
struct HalfIo {
    input: bool,
    output: Option<ActForm>,
}

/// The batched product of the segments `segs` for `m` rows of `k` values (`acc`: adding to the
/// outputs) and the kernel suffix of their weights; `None` without segments.
fn product(segs: &[Seg], m: usize, k: usize, acc: bool) -> Result<Option<(Product, &'static str)>> {
    let Some(first) = segs.first() else {
        return Ok(None);
    };
    let suffix = weight_suffix(first.dtype).ok_or_else(|| op_err("Linear", "weight dtype"))?;
    let p = Product {
        segs: seg_table(segs, acc)?,
        m,
        ntot: segs.iter().map(|s| s.n).sum(),
        k,
        row_bytes: first.dtype.row_bytes(k)?,
    };
    Ok(Some((p, suffix)))
}

/// The kernels' segment table of (up to three) weights; `acc`: add to the outputs.
fn seg_table(segs: &[Seg], acc: bool) -> Result<LinSegs> {
    let mut table = LinSegs {
        acc: acc as i32,
        ..LinSegs::default()
    };
    for (i, sg) in segs.iter().enumerate().take(3) {
        table.w[i] = sg.w;
        table.b[i] = sg.b;
        table.y[i] = sg.y;
        table.n[i] = i32::try_from(sg.n).map_err(|_| op_err("Linear", "too many outputs"))?;
    }
    Ok(table)
}

/// Whether a weight of `dtype` with `k` inputs can take the tensor-core path: not f32, and
/// whole blocks per row where it is quantized.
fn tc_weight(dtype: DataType, k: usize) -> bool {
    dtype != DataType::F32 && (!dtype.is_quantized() || k.is_multiple_of(dtype.block_elems()))
}

/// One weight of a (possibly multi-weight) `Linear` launch.
struct Seg {
    w: u64,
    dtype: DataType,
    n: usize,
    b: u64,
    y: u64,
}

/// The grid of the GEMV kernels for `n` outputs, `per_block` of them per block, and `m` rows
/// ([`LIN_ROWS`] per block row).
fn gemv_grid(n: usize, per_block: usize, m: usize) -> Result<(u32, u32)> {
    let gx =
        u32::try_from(n.div_ceil(per_block)).map_err(|_| op_err("Linear", "too many outputs"))?;
    let gy = u32::try_from(m.div_ceil(LIN_ROWS))
        .ok()
        .filter(|&y| y <= 65535)
        .ok_or_else(|| op_err("Linear", format!("{m} rows exceed this kernel's grid")))?;
    Ok((gx, gy))
}

/// Where the copy in `form` of the input at `xp` ([`m`, `k`]) is, if the op that produced the
/// input left it (`held`).
fn produced_copy(held: Held, form: ActForm, xp: u64, m: usize, k: usize) -> Option<u64> {
    let q = held.key;
    (held.produced && q.form == form && q.input == xp && q.rows == m && q.k == k)
        .then_some(q.scratch)
}

/// The GEMV kernel variant (`sbx_`: one row, `sb_`: superblocks, plain) and its last argument:
/// lanes per row `lpr`, or the bulk kernel's slots.
fn gemv_variant(
    sbx: bool,
    sb: bool,
    bulk: Option<BulkPlan>,
    lpr: usize,
) -> Result<(&'static str, Option<KArg>)> {
    Ok(if sbx {
        let last = match bulk {
            Some(p) => int(p.slots, "slots")?,
            None => int(lpr, "lanes per row")?,
        };
        ("sbx_", Some(last))
    } else if sb {
        ("sb_", Some(int(lpr, "lanes per row")?))
    } else {
        ("", None)
    })
}

/// Lanes per weight row of the superblock GEMV kernels for rows of `units` superblocks (or
/// half superblocks): 32, else the largest power of two not above `units`, at least 4.
fn lanes_per_row(units: usize) -> usize {
    let u = units.clamp(1, 32);
    if u >= 32 {
        32
    } else {
        (1usize << (usize::BITS - 1 - u.leading_zeros())).max(4)
    }
}

/// One launch of the Q8_0-activation GEMV kernels: the weight's kernel suffix, the variant
/// (`sbx_`, `sb_` or plain), the grid (x, y), the one-row choices (`half`: `sbh`, `bulk`: the
/// bulk-copy plan) and the dynamic shared memory of the one-row kernels.
struct Q8ActLaunch<'a> {
    suffix: &'a str,
    variant: &'static str,
    grid: (u32, u32),
    half: bool,
    bulk: Option<BulkPlan>,
    smem: u32,
}

/// True for the one-row products with `quant_act` that `linear_q8act_kq_*` runs: Q4_K / Q6_K
/// weights, `k % 256 == 0`.
fn kq_one_row(t: DataType, k: usize) -> bool {
    matches!(t, DataType::Q4K | DataType::Q6K) && k.is_multiple_of(256)
}

impl Linear {
    /// One activation row times Q4_K / Q6_K weights (all segments, one launch) with the row
    /// as Q8_0 blocks ([`Linear::q8_rows`]): `linear_q8act_kq_*`, a warp per output.
    #[allow(clippy::too_many_arguments)]
    fn kq_one_row(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        xp: u64,
        k: usize,
        n: usize,
        segs: &[Seg],
        acc: bool,
    ) -> Result<()> {
        let dtype = segs.first().map_or(DataType::Q4K, |s| s.dtype);
        let suffix = weight_suffix(dtype).ok_or_else(|| op_err("Linear", "weight dtype"))?;
        let q8 = self.q8_rows(prev, ints, xp, 1, k)?;
        let gx = u32::try_from(n.div_ceil(LIN_FEATURES))
            .map_err(|_| op_err("Linear", "too many outputs"))?;
        let args = [
            KArg::Ptr(q8.values),
            KArg::Ptr(q8.scales),
            KArg::Segs(seg_table(segs, acc)?),
            int(1, "rows")?,
            int(n, "outputs")?,
            int(k, "k")?,
            long(dtype.row_bytes(k)?, "row bytes")?,
        ];
        self.gpu.launch(
            &format!("linear_q8act_kq_{suffix}"),
            (gx, 1, 1),
            (32 * LIN_FEATURES) as u32,
            &args,
        )
    }

    /// `y_i (+)= x·W_iᵀ + b_i` for the segments: the tensor-core path (all segments, one cast of
    /// the input) for `quant_act` products of at least [`TC_MIN_ROWS`] rows, SGEMM for one F32
    /// weight of several rows, else one launch of the GEMV kernels for all segments.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        xp: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        io: HalfIo,
    ) -> Result<()> {
        let Some(first) = segs.first() else {
            return Ok(());
        };
        let dtype = first.dtype;
        let n: usize = segs.iter().map(|s| s.n).sum();
        if m == 0 || n == 0 {
            return Ok(());
        }
        let acc = ints.get_or("accumulate", 0) != 0;
        let bat = Batched::of_call(ints)?;
        if io.input || io.output.is_some() {
            // can_run / reshape admitted these only for the tensor-core path
            return match self.tensor_core(prev, bat, xp, m, k, segs, acc, io)? {
                true => Ok(()),
                false => Err(lost_blas()),
            };
        }
        if segs.len() == 1 && dtype == DataType::F32 && m >= BLAS_MIN_ROWS && !self.invariant {
            let (wp, bp, yp) = (first.w, first.b, first.y);
            if self.sgemm(xp, wp, yp, m, n, k, acc)? {
                if bp != 0 {
                    self.add_bias(yp, bp, m, n)?;
                }
                return Ok(());
            }
        }
        let quant_act = ints.get_or("quant_act", 0) != 0;
        let aligned = segs.iter().all(|s| s.w % 16 == 0);
        if quant_act && aligned && bat.mmq(dtype, m, k) && !self.invariant {
            return self.mmq_segments(prev, ints, bat, xp, m, k, segs, acc);
        }
        if quant_act && aligned && self.invariant && q8_kernels(dtype) && k.is_multiple_of(MMQ_KC) {
            // (mmq_segments gives each weight the k split of its one-row product)
            let bat = Batched {
                mode: 3,
                splits: 0,
                shape: 0,
                rows: 0,
            };
            return self.mmq_segments(prev, ints, bat, xp, m, k, segs, acc);
        }
        if quant_act
            && !self.invariant
            && tc_weight(dtype, k)
            && m >= bat.tc_min_rows(dtype, k)
            && self.tensor_core(prev, bat, xp, m, k, segs, acc, io)?
        {
            return Ok(());
        }
        if quant_act && m == 1 && kq_one_row(dtype, k) && aligned && !self.invariant {
            return self.kq_one_row(prev, ints, xp, k, n, segs, acc);
        }
        self.gemv(prev, ints, xp, m, k, segs, acc)
    }

    /// `y_i (+)= x·W_iᵀ + b_i` for the segments in one launch of the GEMV kernels: Q8_0
    /// activations for `quant_act` block weights (the superblock kernels where `k % 256 == 0`,
    /// at one row the one-row kernels of [`OneRow`]), f32 activations otherwise.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        prev: Option<Held>,
        ints: &IntDict,
        xp: u64,
        m: usize,
        k: usize,
        segs: &[Seg],
        acc: bool,
    ) -> Result<()> {
        let dtype = segs.first().map_or(DataType::F32, |s| s.dtype);
        let n: usize = segs.iter().map(|s| s.n).sum();
        let aligned = segs.iter().all(|s| s.w % 16 == 0);
        // the GEMV kernels of Q5_0 and Q5_K weights, and of Q4_K / Q6_K weights with several
        // rows, read f32 activations (they have no Q8_0 activation kernels)
        let quant_act = ints.get_or("quant_act", 0) != 0 && q8_kernels(dtype) && !self.invariant;
        // 16-byte superblock kernels for block weights with quantized activations: k % 256 == 0,
        // aligned rows.
        let sb = quant_act && dtype.is_quantized() && k.is_multiple_of(256) && aligned;
        // m = 1: the activation row in shared memory (272 bytes per 256 values + 72 of scales).
        let sx_bytes = (k / 256) * (272 + 72);
        let sbx = sb && m == 1 && sx_bytes <= 48 * 1024;
        let choice = OneRow::of_call(ints)?;
        let half = sbx && self.one_row_half(choice, dtype);
        let bulk = if sbx {
            self.bulk_plan(choice, dtype, k, n)
        } else {
            None
        };
        let lpr = lanes_per_row(if half { 2 * (k / 256) } else { k / 256 });
        let rows_per_block = LIN_FEATURES * (32 / lpr);
        let suffix = weight_suffix(dtype).ok_or_else(|| op_err("Linear", "weight dtype"))?;
        let per_block = if sb { rows_per_block } else { LIN_FEATURES };
        let (gx, gy) = gemv_grid(n, per_block, m)?;
        let mut tail = vec![
            KArg::Segs(seg_table(segs, acc)?),
            int(m, "rows")?,
            int(n, "outputs")?,
            int(k, "k")?,
            long(dtype.row_bytes(k)?, "row bytes")?,
        ];
        let (variant, last) = gemv_variant(sbx, sb, bulk, lpr)?;
        tail.extend(last);
        if quant_act && dtype.is_quantized() {
            if !k.is_multiple_of(32) {
                return Err(op_err(
                    "Linear",
                    format!("quant_act needs k % 32 == 0, got {k}"),
                ));
            }
            let q8 = self.q8_rows(prev, ints, xp, m, k)?;
            let mut args = vec![KArg::Ptr(q8.values), KArg::Ptr(q8.scales)];
            args.extend(tail);
            let launch = Q8ActLaunch {
                suffix,
                variant,
                grid: (gx, gy),
                half,
                bulk,
                smem: if sbx { sx_bytes as u32 } else { 0 },
            };
            return self.q8act_launch(&launch, &args);
        }
        let mut args = vec![KArg::Ptr(xp)];
        args.extend(tail);
        // one weight: the kernel without segment selection (`linear1_*`); one row: the
        // one-row kernels (`gemv_*`, fewer registers)
        let single = if segs.len() == 1 { "1" } else { "" };
        let kind = if m == 1 { "gemv" } else { "linear" };
        self.gpu.launch(
            &format!("{kind}{single}_{variant}{suffix}"),
            (gx, gy, 1),
            (32 * LIN_FEATURES) as u32,
            &args,
        )
    }

    /// Launches the Q8_0-activation GEMV kernel `l` picks with the arguments `args`.
    fn q8act_launch(&self, l: &Q8ActLaunch, args: &[KArg]) -> Result<()> {
        let (suffix, block) = (l.suffix, (32 * LIN_FEATURES) as u32);
        if let Some(p) = l.bulk {
            let blocks =
                u32::try_from(p.blocks).map_err(|_| op_err("Linear", "too many blocks"))?;
            return self.gpu.launch_smem(
                &format!("linear_q8act_bulk{}x{}_{suffix}", p.lanes, p.items),
                (blocks, 1, 1),
                block,
                u32::try_from(p.smem).map_err(|_| op_err("Linear", "shared memory"))?,
                args,
            );
        }
        if l.half {
            return self.gpu.launch_smem(
                &format!("linear_q8act_sbh_{suffix}"),
                (l.grid.0, 1, 1),
                block,
                l.smem,
                args,
            );
        }
        self.gpu.launch_smem(
            &format!("linear_q8act_{}{suffix}", l.variant),
            (l.grid.0, l.grid.1, 1),
            block,
            l.smem,
            args,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::gpu::SharedMemory;
    use super::BulkPlan;

    /// An H100's limits: 132 multiprocessors, 227 KiB per block after opting in, 228 KiB per
    /// multiprocessor, 1 KiB reserved per block.
    const H100: SharedMemory = SharedMemory {
        block_optin: 232_448,
        per_sm: 233_472,
        reserved_per_block: 1024,
    };

    #[test]
    fn bulk_plans_fit_the_shared_memory_and_cover_the_rows() {
        // llama-3-8b Q4_0 o-projection: two blocks per multiprocessor, two row groups per warp
        let p = BulkPlan::new(4096, 4096, 2304, 132, H100, 4).unwrap();
        assert_eq!((p.lanes, p.items, p.blocks, p.slots), (32, 1, 264, 2));
        assert_eq!(p.smem, 8 * 2 * (2304 + 8));
        // gate/up: more groups than slots, the cap applies
        let p = BulkPlan::new(4096, 28672, 2304, 132, H100, 4).unwrap();
        assert_eq!((p.blocks, p.slots), (264, 4));
        // down projection: activations staged (56 superblocks · 344 bytes), one slot per warp
        let p = BulkPlan::new(14336, 4096, 8064, 132, H100, 4).unwrap();
        assert_eq!((p.lanes, p.items, p.slots), (32, 4, 1));
        assert_eq!(p.smem, 19264 + 8 * (8064 + 8));
        // Q8_0 down projection: only one block per multiprocessor fits
        let p = BulkPlan::new(14336, 4096, 15232, 132, H100, 4).unwrap();
        assert_eq!((p.blocks, p.slots), (132, 1));
        assert!(p.smem <= H100.block_optin);
        // short rows: several rows per warp
        let p = BulkPlan::new(2048, 100, 1152, 132, H100, 4).unwrap();
        assert_eq!((p.lanes, p.items), (16, 1));
        assert_eq!(p.blocks, 100usize.div_ceil(2).div_ceil(8));
        let p = BulkPlan::new(1536, 10, 864, 132, H100, 4).unwrap();
        assert_eq!((p.lanes, p.items), (8, 2));
        // shapes the kernels do not take
        assert!(BulkPlan::new(16640, 40, 9360, 132, H100, 4).is_none()); // 5 items per lane
        assert!(BulkPlan::new(512, 40, 288, 132, H100, 4).is_none()); // 4 half superblocks
        assert!(BulkPlan::new(4000, 40, 2250, 132, H100, 4).is_none()); // k % 256
        assert!(BulkPlan::new(4096, 40, 2304, 132, H100, 0).is_none());
        let small = SharedMemory {
            block_optin: 48 * 1024,
            per_sm: 64 * 1024,
            reserved_per_block: 0,
        };
        assert!(BulkPlan::new(14336, 40, 15232, 132, small, 4).is_none());
        // every plan's blocks, warps and slots fit in one multiprocessor's memory at once
        for (k, rb) in [(2048, 1152), (4096, 2560), (8192, 4608), (14336, 8960)] {
            for n in [1usize, 7, 1000, 50_000] {
                let p = BulkPlan::new(k, n, rb, 132, H100, 8).unwrap();
                let per_sm = p.blocks.div_ceil(132);
                assert!(
                    per_sm * (p.smem + 1024) <= H100.per_sm,
                    "k={k} n={n}: {p:?}"
                );
                assert!(p.blocks <= 2 * 132 && p.slots >= 1, "k={k} n={n}: {p:?}");
            }
        }
    }
}
