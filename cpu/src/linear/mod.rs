//! Matrix kernels of the CPU device: `Linear` (`y = x·Wᵀ + b` with F32/F16/BF16/Q8_0/Q4_0/Q4_1
//! weights and the types with their own modules (Q5_0, K-quants, MXFP4), f32 activations), `MatMul` and `MatMulTransB` (f32).
//!
//! One file per job: [`float_dot`] (float weight dots, plus the AVX-512 4×4 f32 GEMM tile),
//! [`quant_dot`] (exact dots with weight blocks dequantized in registers), [`act_quant`]
//! (activation rows → Q8_0 for `quant_act`), [`int_dot`] (integer block dots), [`int_gemv`]
//! (AVX-512 integer GEMV, 4 weight rows × 1 activation row), [`int_split`] (AVX-512 VBMI
//! Q4 kernels over grouped activations: a streaming GEMV and an 8×2 tile, four blocks per step), [`int_tile`]
//! (AVX-512 4×4 integer GEMM tiles), [`int_wide`] (AVX-512 VNNI 8×2 integer GEMM tiles, used
//! instead of `int_tile` where the CPU has VNNI), [`interleaved`] (block weights 16 rows side by side
//! and their integer kernels), [`interleaved_float`] and [`interleaved_kquant`] (the same for
//! F16/BF16 and K-quant weights; Q2_K/Q3_K kernels in `interleaved_kquant_low`, Q6_K in
//! `interleaved_q6`), [`kquant_dot`],
//! [`kquant_int`] and [`kquant_low_int`] (K-quant weight dots; SIMD unpacking shared in
//! `kquant_simd`; `kquant_tile`: the exact Q4_K/Q5_K GEMV's register tiles), [`q5_dot`] and [`mxfp4_dot`] (Q5_0 and MXFP4 dots), `gemm` (column tiling, row
//! blocking, f32 tile conversion
//! and the split over threads), [`many`] (several calls as one pool job), [`matmul`] (the two f32 matmuls). Each kernel exists as a plain
//! scalar reference and a fast path chosen at run time (AVX2+FMA+F16C or AVX-512 on x86-64,
//! portable code elsewhere).
//!
//! This module works on plain slices and validates every size it is given (errors are `String`s
//! naming the argument); it must not know about tensors or devices.

/// Calls `f::<G.., R, C>(args)` with `R = rows` and `C = cols` as constants (1, 2, 3, or 4 for
/// anything larger): the dispatch of a register tile on its shape. `G..` are leading generic
/// arguments, each followed by a comma: `by_rows_cols!(tile_n [T,], rows, cols, (w, x, k, out))`.
macro_rules! by_rows_cols {
    ($f:ident [$($g:tt)*], $rows:expr, $cols:expr, ($($arg:expr),*)) => {
        match $rows {
            1 => by_rows_cols!(@cols $f [$($g)* 1,], $cols, ($($arg),*)),
            2 => by_rows_cols!(@cols $f [$($g)* 2,], $cols, ($($arg),*)),
            3 => by_rows_cols!(@cols $f [$($g)* 3,], $cols, ($($arg),*)),
            _ => by_rows_cols!(@cols $f [$($g)* 4,], $cols, ($($arg),*)),
        }
    };
    (@cols $f:ident [$($g:tt)*], $cols:expr, ($($arg:expr),*)) => {
        match $cols {
            1 => $f::<$($g)* 1>($($arg),*),
            2 => $f::<$($g)* 2>($($arg),*),
            3 => $f::<$($g)* 3>($($arg),*),
            _ => $f::<$($g)* 4>($($arg),*),
        }
    };
}

pub mod act_quant;
mod block_float;
mod block_ref;
pub mod float_dot;
mod gemm;
pub mod int_dot;
pub mod int_gemv;
pub mod int_split;
pub mod int_tile;
pub mod int_wide;
pub mod interleaved;
pub mod interleaved_float;
pub mod interleaved_kquant;
mod interleaved_kquant_low;
mod interleaved_q6;
pub mod kquant_dot;
pub mod kquant_int;
pub mod kquant_low_int;
#[cfg(target_arch = "x86_64")]
mod kquant_simd;
mod kquant_tile;
pub mod many;
pub mod matmul;
pub mod mxfp4_dot;
pub mod q5_dot;
pub mod quant_dot;

use crate::kquant::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use crate::kquant_low::{Q2_K_BYTES, Q3_K_BYTES};
use crate::mxfp4::MXFP4_BYTES;
use crate::quant::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};
use crate::threads::Threads;
use act_quant::Q8Rows;
pub use many::{linear_many, LinearCall};
use std::cell::RefCell;

/// Activation rows handled together by one kernel call (each weight row is loaded once for them).
pub const MAX_ROWS: usize = 4;

/// From this many activation rows on, `quant_act` uses the tiled integer kernels where the CPU
/// has them (faster than the per-row kernels from two rows on; on par at one row).
pub const INT_TILE_MIN_ROWS: usize = 2;

/// From this many activation rows on, non-f32 weights are converted to f32 tiles first (the
/// conversion is then amortized over all rows) on the fast path.
pub const GEMM_MIN_ROWS: usize = 8;

/// A float-activation dot kernel: `out[r] = Σ_i w[i] · x[r*k + i]` for `r < rows`, where `w` is
/// one weight row of `k` elements in the kernel's dtype (raw bytes).
///
/// # Safety
/// `1 <= rows <= MAX_ROWS`, `x.len() >= rows * k`, `w` holds a full row of `k` elements (for
/// block types `k % 32 == 0`), and the CPU has the features the kernel was picked for.
pub type FloatRowsFn =
    unsafe fn(w: &[u8], x: &[f32], k: usize, rows: usize, out: &mut [f32; MAX_ROWS]);

/// A quantized-activation dot kernel: `out[r]` = the integer block dot of the weight row `w`
/// with row `row0 + r` of `acts`, for `r < rows`.
///
/// # Safety
/// `1 <= rows <= MAX_ROWS`, `row0 + rows <= acts.rows`, `w` holds `acts.blocks` blocks of the
/// kernel's type, and the CPU has the features the kernel was picked for.
pub type IntRowsFn =
    unsafe fn(w: &[u8], acts: &Q8Rows, row0: usize, rows: usize, out: &mut [f32; MAX_ROWS]);

/// A register-tiled f32 GEMM kernel: `out[c][r] = Σ_i w[c*k + i] · x[r*k + i]` for `r < rows`,
/// `c < cols`, where `w` holds `cols` consecutive f32 weight rows of `k` elements (raw bytes).
///
/// # Safety
/// `1 <= rows, cols <= MAX_ROWS`, `x.len() >= rows * k`, `w.len() >= cols * k * 4`, and the CPU
/// has the features the kernel was picked for.
pub type TileF32Fn = unsafe fn(
    w: &[u8],
    x: &[f32],
    k: usize,
    rows: usize,
    cols: usize,
    out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
);

/// A register-tiled integer kernel: `out[c][r]` = the integer block dot of weight row `c` (rows
/// `rb` bytes apart in `w`) with activation row `row0 + r`, for `r < rows`, `c < cols`.
///
/// # Safety
/// `1 <= rows, cols <= MAX_ROWS`, `row0 + rows <= acts.rows`, `w` holds `cols` rows of
/// `acts.blocks` blocks of the kernel's type `rb` bytes apart, and the CPU has the features
/// the kernel was picked for.
pub type IntTileFn = unsafe fn(
    w: &[u8],
    rb: usize,
    acts: &Q8Rows,
    row0: usize,
    rows: usize,
    cols: usize,
    out: &mut [[f32; MAX_ROWS]; MAX_ROWS],
);

/// Converts one weight row of `k` elements to f32 (used to build GEMM tiles).
///
/// # Safety
/// `w` holds a full row of `k` elements of the function's type (for block types
/// `k % 32 == 0`), `out.len() >= k`, and the CPU has the features it was picked for.
pub type RowToF32Fn = unsafe fn(w: &[u8], k: usize, out: &mut [f32]);

/// Weight dtypes of `Linear`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// GGUF Q8_0 blocks.
    Q8_0,
    /// GGUF Q4_0 blocks.
    Q4_0,
    /// GGUF Q4_1 blocks.
    Q4_1,
    /// GGUF Q5_0 blocks.
    Q5_0,
    /// GGUF Q4_K super-blocks (layouts in [`crate::kquant`]).
    Q4K,
    /// GGUF Q5_K super-blocks.
    Q5K,
    /// GGUF Q6_K super-blocks.
    Q6K,
    /// GGUF Q2_K super-blocks (layouts in [`crate::kquant_low`]).
    Q2K,
    /// GGUF Q3_K super-blocks.
    Q3K,
    /// MXFP4 blocks (GGUF `MXFP4`; layout in [`crate::mxfp4`]).
    Mxfp4,
}

impl WeightType {
    /// Every weight type.
    pub const ALL: [WeightType; 13] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q4K,
        WeightType::Q5K,
        WeightType::Q6K,
        WeightType::Q2K,
        WeightType::Q3K,
        WeightType::Mxfp4,
    ];

    /// True for the 32-value block types (Q8_0, Q4_0, Q4_1).
    pub fn is_block(self) -> bool {
        matches!(self, WeightType::Q8_0 | WeightType::Q4_0 | WeightType::Q4_1)
    }

    /// True for the 256-value K-quant super-block types.
    pub fn is_kquant(self) -> bool {
        matches!(
            self,
            WeightType::Q2K | WeightType::Q3K | WeightType::Q4K | WeightType::Q5K | WeightType::Q6K
        )
    }

    /// True for the weight types whose kernels are separate modules ([`kquant_dot`],
    /// [`kquant_int`], [`q5_dot`], [`mxfp4_dot`]): the K-quants, Q5_0 and MXFP4. They have no
    /// tiled or split kernels (the K-quants have interleaved ones, [`interleaved_kquant`]).
    pub fn has_own_kernels(self) -> bool {
        self.is_kquant() || matches!(self, WeightType::Q5_0 | WeightType::Mxfp4)
    }

    /// Values per storage block: 32 for block types, 256 for K-quants, 1 for floats.
    pub fn block_elems(self) -> usize {
        if self.is_kquant() {
            QK_K
        } else if self.is_block() || matches!(self, WeightType::Q5_0 | WeightType::Mxfp4) {
            QK
        } else {
            1
        }
    }

    /// Bytes of one row of `k` elements; `None` when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if !k.is_multiple_of(self.block_elems()) {
            return None;
        }
        let blocks = k / self.block_elems();
        match self {
            WeightType::F32 => k.checked_mul(4),
            WeightType::F16 | WeightType::BF16 => k.checked_mul(2),
            WeightType::Q8_0 => blocks.checked_mul(Q8_0_BYTES),
            WeightType::Q4_0 => blocks.checked_mul(Q4_0_BYTES),
            WeightType::Q4_1 => blocks.checked_mul(Q4_1_BYTES),
            WeightType::Q5_0 => blocks.checked_mul(Q5_0_BYTES),
            WeightType::Q4K => blocks.checked_mul(Q4_K_BYTES),
            WeightType::Q5K => blocks.checked_mul(Q5_K_BYTES),
            WeightType::Q6K => blocks.checked_mul(Q6_K_BYTES),
            WeightType::Q2K => blocks.checked_mul(Q2_K_BYTES),
            WeightType::Q3K => blocks.checked_mul(Q3_K_BYTES),
            WeightType::Mxfp4 => blocks.checked_mul(MXFP4_BYTES),
        }
    }

    /// Lower-case name (`f32`, `q4_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::BF16 => "bf16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q4_1 => "q4_1",
            WeightType::Q5_0 => "q5_0",
            WeightType::Q4K => "q4_k",
            WeightType::Q5K => "q5_k",
            WeightType::Q6K => "q6_k",
            WeightType::Q2K => "q2_k",
            WeightType::Q3K => "q3_k",
            WeightType::Mxfp4 => "mxfp4",
        }
    }
}

/// The arguments of one `Linear` call: `out[rows, n] = x[rows, k] · w[n, k]ᵀ + bias[n]`.
#[derive(Clone, Copy, Debug)]
pub struct LinearArgs<'a> {
    /// Activations, `rows * k` values, row-major.
    pub x: &'a [f32],
    /// Number of activation rows.
    pub rows: usize,
    /// Row length (input features).
    pub k: usize,
    /// Weight bytes: `n` rows of `k` elements of `wtype`.
    pub w: &'a [u8],
    /// Weight dtype.
    pub wtype: WeightType,
    /// Number of weight rows (output features).
    pub n: usize,
    /// Optional bias of `n` values.
    pub bias: Option<&'a [f32]>,
    /// Quantize activations to Q8_0 and use integer dots (block weight types only; ignored for
    /// float weights).
    pub quant_act: bool,
}

impl LinearArgs<'_> {
    /// Checks every size against `out`; returns the weight row size in bytes.
    fn validate(&self, out: &[f32]) -> Result<usize, String> {
        let rb = self.wtype.row_bytes(self.k).ok_or_else(|| {
            format!(
                "weight {} needs k to be a multiple of {}, got k = {}",
                self.wtype.name(),
                self.wtype.block_elems(),
                self.k
            )
        })?;
        let need = |a: usize, b: usize, what: &str| {
            a.checked_mul(b)
                .ok_or_else(|| format!("{what} size overflows ({a} x {b})"))
        };
        let wn = need(self.n, rb, "weight")?;
        if self.w.len() < wn {
            return Err(format!(
                "weight has {} bytes, {} x {} {} needs {wn}",
                self.w.len(),
                self.n,
                self.k,
                self.wtype.name()
            ));
        }
        let xn = need(self.rows, self.k, "input")?;
        if self.x.len() < xn {
            return Err(format!(
                "input has {} values, need {} x {}",
                self.x.len(),
                self.rows,
                self.k
            ));
        }
        let on = need(self.rows, self.n, "output")?;
        if out.len() < on {
            return Err(format!(
                "output has {} values, need {} x {}",
                out.len(),
                self.rows,
                self.n
            ));
        }
        if let Some(b) = self.bias {
            if b.len() < self.n {
                return Err(format!("bias has {} values, need {}", b.len(), self.n));
            }
        }
        Ok(rb)
    }

    /// True when the integer (quantized activation) path applies.
    fn uses_int(&self) -> bool {
        self.quant_act && (self.wtype.is_block() || self.wtype.has_own_kernels())
    }
}

thread_local! {
    static ACT_SCRATCH: RefCell<Q8Rows> = RefCell::new(Q8Rows::default());
}

/// Scalar reference `Linear` (single thread; plain sequential dots; with `quant_act` the same
/// integer block math as the fast path).
pub fn linear_ref(a: &LinearArgs, out: &mut [f32]) -> Result<(), String> {
    let rb = a.validate(out)?;
    let mut q = Q8Rows::default();
    let kern = plan(false, a, &mut q)?;
    gemm::run(None, a, rb, kern, out);
    Ok(())
}

/// The kernel of one validated call: quantizes the activations into `q` where the integer path
/// applies, then picks the SIMD kernels (`fast`) or the scalar references.
fn plan<'q>(fast: bool, a: &LinearArgs, q: &'q mut Q8Rows) -> Result<gemm::Kernel<'q>, String> {
    if a.wtype.has_own_kernels() {
        return plan_own(fast, a, q);
    }
    if a.uses_int() {
        return if fast {
            plan_int(a, q)
        } else {
            act_quant::quantize_rows_ref(a.x, a.rows, a.k, q)?;
            let f: IntRowsFn = match a.wtype {
                WeightType::Q8_0 => int_dot::rows_q8_0_ref,
                WeightType::Q4_0 => int_dot::rows_q4_0_ref,
                _ => int_dot::rows_q4_1_ref,
            };
            Ok(gemm::Kernel::Int(f, q, None))
        };
    }
    let f: FloatRowsFn = match (a.wtype, fast) {
        (WeightType::F32, true) => float_dot::pick_f32(),
        (WeightType::F16, true) => float_dot::pick_f16(),
        (WeightType::BF16, true) => float_dot::pick_bf16(),
        (WeightType::Q8_0, true) => quant_dot::pick_q8_0(),
        (WeightType::Q4_0, true) => quant_dot::pick_q4_0(),
        (WeightType::Q4_1, true) => quant_dot::pick_q4_1(),
        (WeightType::F32, false) => float_dot::rows_f32_ref,
        (WeightType::F16, false) => float_dot::rows_f16_ref,
        (WeightType::BF16, false) => float_dot::rows_bf16_ref,
        (WeightType::Q8_0, false) => quant_dot::rows_q8_0_ref,
        (WeightType::Q4_0, false) => quant_dot::rows_q4_0_ref,
        (WeightType::Q4_1, false) => quant_dot::rows_q4_1_ref,
        _ => return plan_own(fast, a, q),
    };
    let gemm_plan = if fast { f32_gemm_plan(a, f) } else { None };
    Ok(gemm::Kernel::Float(f, gemm_plan))
}

/// The fast integer kernel of a block weight with `quant_act` (activations quantized into `q`):
/// one row, the split-layout GEMV tile (Q4_0: 4 consecutive weight rows, one sequential stream
/// per thread, what weights read from DRAM want) or streaming GEMV (Q4_1, Q8_0) where the CPU
/// has them (AVX-512 VBMI), else the wide kernel that more rows take (AVX-512 VNNI), else the
/// 4-row AVX-512 GEMV; more rows, the wide or tiled kernels.
fn plan_int<'q>(a: &LinearArgs, q: &'q mut Q8Rows) -> Result<gemm::Kernel<'q>, String> {
    let mut f: IntRowsFn = match a.wtype {
        WeightType::Q8_0 => int_dot::pick_q8_0(),
        WeightType::Q4_0 => int_dot::pick_q4_0(),
        _ => int_dot::pick_q4_1(),
    };
    act_quant::quantize_rows(a.x, a.rows, a.k, q)?;
    let gemv = a.rows < INT_TILE_MIN_ROWS;
    let split_gemv = gemv.then(|| int_split::pick_gemv(a.wtype)).flatten();
    let split_wide = (!gemv).then(|| int_split::pick_wide(a.wtype)).flatten();
    if split_gemv.is_some() || split_wide.is_some() {
        q.prepare_split();
    }
    if let Some(g) = split_gemv {
        f = g;
    }
    let q = &*q;
    // without the split kernels one row takes the batches' wide kernel too: the one-row
    // kernels (int_gemv, int_dot) sum a block's lanes in another order than int_wide, and a
    // row's output must not depend on its batch
    let wide = match (gemv, split_gemv) {
        (true, Some(_)) => None,
        (true, None) => int_wide::pick(a.wtype),
        (false, _) => split_wide.or_else(|| int_wide::pick(a.wtype)),
    };
    Ok(match wide {
        Some(w) => gemm::Kernel::IntWide(f, q, w),
        None => {
            let tile = if !gemv {
                int_tile::pick(a.wtype)
            } else if split_gemv.is_none() {
                int_gemv::pick(a.wtype)
            } else {
                int_split::pick_gemv_tile(a.wtype)
            };
            gemm::Kernel::Int(f, q, tile)
        }
    })
}

/// The f32 GEMM plan of a float or block weight (`f`: its row kernel): from [`GEMM_MIN_ROWS`]
/// rows, tiles of weight rows converted to f32 once and the f32 kernels run on them; fewer
/// rows, a tile kernel with the same arithmetic reading the rows in place (a row's sums then do
/// not depend on the number of rows). `None` where the CPU has no such kernels.
fn f32_gemm_plan(a: &LinearArgs, f: FloatRowsFn) -> Option<gemm::F32Gemm> {
    if a.rows < GEMM_MIN_ROWS {
        let direct = if a.wtype.is_block() {
            quant_dot::pick_tile_direct(a.wtype)
        } else {
            float_dot::pick_tile_direct(a.wtype)
        };
        return direct.map(|tile| gemm::F32Gemm {
            convert: None,
            rows: f,
            tile: Some(tile),
        });
    }
    let convert = match a.wtype {
        WeightType::F32 => None,
        WeightType::F16 | WeightType::BF16 => float_dot::pick_row_to_f32(a.wtype),
        _ => quant_dot::pick_row_to_f32(a.wtype),
    };
    let tile = float_dot::pick_tile_f32();
    (a.wtype == WeightType::F32 || convert.is_some()).then_some(gemm::F32Gemm {
        convert,
        rows: float_dot::pick_f32(),
        tile,
    })
}

/// Fast `Linear`: SIMD kernels, split over output columns on `threads`, activation rows in
/// blocks of [`MAX_ROWS`] so every weight block is loaded once per block of rows.
pub fn linear(threads: &Threads, a: &LinearArgs, out: &mut [f32]) -> Result<(), String> {
    let rb = a.validate(out)?;
    ACT_SCRATCH.with(|s| {
        let mut q = s
            .try_borrow_mut()
            .map_err(|_| "activation scratch busy (re-entrant call)".to_string())?;
        let kern = plan(true, a, &mut q)?;
        gemm::run(Some(threads), a, rb, kern, out);
        Ok(())
    })
}

/// The kernel of a weight with its own kernel modules (K-quants, Q5_0, MXFP4): with `quant_act`
/// the activations are quantized to Q8_0 into `q` and the integer kernels run (one weight row ×
/// up to [`MAX_ROWS`] activation rows per call); otherwise the exact kernels, and from
/// [`GEMM_MIN_ROWS`] rows on the f32 GEMM over dequantized tiles. `fast = false` picks the
/// scalar references.
fn plan_own<'q>(fast: bool, a: &LinearArgs, q: &'q mut Q8Rows) -> Result<gemm::Kernel<'q>, String> {
    let none = || format!("no kernel for {}", a.wtype.name());
    if a.quant_act {
        let f = match (a.wtype, fast) {
            (WeightType::Q5_0, true) => Some(q5_dot::pick_int()),
            (WeightType::Q5_0, false) => Some(q5_dot::rows_q5_0_int_ref as IntRowsFn),
            (WeightType::Mxfp4, true) => Some(mxfp4_dot::pick_int()),
            (WeightType::Mxfp4, false) => Some(mxfp4_dot::rows_mxfp4_int_ref as IntRowsFn),
            (_, true) => kquant_int::pick(a.wtype),
            (_, false) => kquant_int::pick_ref(a.wtype),
        }
        .ok_or_else(none)?;
        if fast {
            act_quant::quantize_rows(a.x, a.rows, a.k, q)?;
        } else {
            act_quant::quantize_rows_ref(a.x, a.rows, a.k, q)?;
        }
        if matches!(a.wtype, WeightType::Q2K | WeightType::Q3K) {
            q.prepare_sum16();
        }
        let tile = match (a.wtype, fast) {
            (WeightType::Q5_0, true) => q5_dot::pick_int_tile(),
            _ => None,
        };
        return Ok(gemm::Kernel::Int(f, q, tile));
    }
    let f = match (a.wtype, fast) {
        (WeightType::Q5_0, true) => Some(q5_dot::pick()),
        (WeightType::Q5_0, false) => Some(q5_dot::rows_q5_0_ref as FloatRowsFn),
        (WeightType::Mxfp4, true) => Some(mxfp4_dot::pick()),
        (WeightType::Mxfp4, false) => Some(mxfp4_dot::rows_mxfp4_ref as FloatRowsFn),
        (_, true) => kquant_dot::pick(a.wtype),
        (_, false) => kquant_dot::pick_ref(a.wtype),
    }
    .ok_or_else(none)?;
    let convert = match a.wtype {
        WeightType::Q5_0 => Some(q5_dot::row_to_f32()),
        WeightType::Mxfp4 => Some(mxfp4_dot::row_to_f32()),
        _ => kquant_dot::pick_row_to_f32(a.wtype),
    };
    // the GEMV of Q5_0, Q4_K and Q5_K: a register tile over the block rows (the GEMM's bits)
    // where the CPU has one
    let direct = (fast && a.rows < GEMM_MIN_ROWS)
        .then(|| match a.wtype {
            WeightType::Q5_0 => quant_dot::pick_tile_direct(a.wtype),
            _ => kquant_tile::pick_tile_direct(a.wtype),
        })
        .flatten()
        .map(|tile| gemm::F32Gemm {
            convert: None,
            rows: f,
            tile: Some(tile),
        });
    let gemm_plan = direct.or_else(|| {
        (fast && a.rows >= GEMM_MIN_ROWS).then(|| gemm::F32Gemm {
            convert,
            rows: float_dot::pick_f32(),
            tile: float_dot::pick_tile_f32(),
        })
    });
    Ok(gemm::Kernel::Float(f, gemm_plan))
}

/// `Linear` with an interleaved weight (`a.w` in the layout of [`interleaved`] for block types,
/// [`interleaved_kquant`] for K-quants or [`interleaved_float`] for F16/BF16, `a.n` a multiple of
/// [`interleaved::GROUP_ROWS`]): the SIMD
/// kernels over groups of 16 weight rows, split over `threads`; with `threads = None` the scalar
/// reference on one thread. Float weights always take f32 activations (`quant_act` does not apply).
/// A block or K-quant weight without `quant_act` (f32 activations) is brought back to the plain layout
/// first and the plain path runs (slow: interleaving block weights is meant for quantized
/// activations).
pub fn linear_interleaved(
    threads: Option<&Threads>,
    a: &LinearArgs,
    out: &mut [f32],
) -> Result<(), String> {
    let rb = validate_interleaved(a, out)?;
    if interleaved_float::is_float(a.wtype) {
        let f = threads
            .and_then(|_| interleaved_float::pick(a.wtype))
            .or_else(|| interleaved_float::pick_ref(a.wtype))
            .ok_or_else(|| format!("no interleaved kernel for {}", a.wtype.name()))?;
        gemm::run_interleaved_float(threads, a, rb, f, out);
        return Ok(());
    }
    if !a.quant_act {
        let mut plain = vec![0u8; a.n * rb];
        for (r, row) in plain.chunks_exact_mut(rb).enumerate() {
            interleaved::plain_row(a.wtype, a.w, a.n, a.k, r, row)?;
        }
        let b = LinearArgs { w: &plain, ..*a };
        return match threads {
            Some(t) => linear(t, &b, out),
            None => linear_ref(&b, out),
        };
    }
    with_quantized_input(threads, a, |f, q| {
        gemm::run_interleaved(threads, a, rb, f, q, out)
    })
}

/// Checks an interleaved call `a` against `out`; returns the weight row size in bytes.
fn validate_interleaved(a: &LinearArgs, out: &[f32]) -> Result<usize, String> {
    let rb = a.validate(out)?;
    let float = interleaved_float::is_float(a.wtype);
    let kq = interleaved_kquant::is_kquant(a.wtype);
    if !(a.wtype.is_block() || float || kq) || !a.n.is_multiple_of(interleaved::GROUP_ROWS) {
        return Err(format!(
            "interleaved weights are Q4_0/Q4_1/Q8_0/K-quants/F16/BF16 with rows a multiple of {}, got {} x {} {}",
            interleaved::GROUP_ROWS,
            a.n,
            a.k,
            a.wtype.name()
        ));
    }
    Ok(rb)
}

/// Calls `run` with the integer group kernel for `a`'s weights and `a`'s input quantized to
/// Q8_0 rows (SIMD kernels with `threads`, the scalar references without).
fn with_quantized_input(
    threads: Option<&Threads>,
    a: &LinearArgs,
    run: impl FnOnce(interleaved::InterleavedFn, &act_quant::Q8Rows),
) -> Result<(), String> {
    let simd = threads.and_then(|_| interleaved::pick(a.wtype));
    let f = simd
        .or_else(|| interleaved::pick_ref(a.wtype))
        .ok_or_else(|| format!("no interleaved kernel for {}", a.wtype.name()))?;
    ACT_SCRATCH.with(|s| {
        let mut q = s
            .try_borrow_mut()
            .map_err(|_| "activation scratch busy (re-entrant call)".to_string())?;
        if simd.is_some() {
            act_quant::quantize_rows(a.x, a.rows, a.k, &mut q)?;
        } else {
            act_quant::quantize_rows_ref(a.x, a.rows, a.k, &mut q)?;
        }
        if matches!(a.wtype, WeightType::Q6K | WeightType::Q2K | WeightType::Q3K) {
            q.prepare_sum16();
        }
        run(f, &q);
        Ok(())
    })
}

/// Several interleaved calls, each computed as [`linear_interleaved`] computes it. When they
/// share one input (the same `x`, rows, `k`, weight type and `quant_act`, with integer group
/// kernels: q/k/v or gate/up), the input is quantized once and the groups of all weights are
/// one job on the pool; other calls run one after the other.
pub fn linear_interleaved_many(
    threads: Option<&Threads>,
    calls: &mut [LinearCall],
) -> Result<(), String> {
    let Some(a) = calls.first().map(|c| c.args) else {
        return Ok(());
    };
    let shared = calls.iter().all(|c| {
        let b = &c.args;
        std::ptr::eq(b.x, a.x)
            && (b.rows, b.k, b.wtype, b.quant_act) == (a.rows, a.k, a.wtype, a.quant_act)
    });
    if calls.len() < 2 || !shared || !a.quant_act || interleaved_float::is_float(a.wtype) {
        for c in calls.iter_mut() {
            linear_interleaved(threads, &c.args, c.out)?;
        }
        return Ok(());
    }
    let mut rbs = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        rbs.push(validate_interleaved(&c.args, c.out).map_err(|e| format!("call {i}: {e}"))?);
    }
    with_quantized_input(threads, &a, |f, q| {
        let mut parts: Vec<gemm::GroupPart> = calls
            .iter_mut()
            .zip(rbs)
            .map(|(c, rb)| gemm::GroupPart {
                a: c.args,
                rb,
                out: &mut *c.out,
            })
            .collect();
        gemm::run_interleaved_many(threads, &mut parts, f, q);
    })
}

/// Horizontal sum of 8 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_avx2(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The little-endian f16 at `p`, widened (F16C) and broadcast to 8 lanes. Reads 8 bytes
/// (`p..p + 8` must be readable: callers point into a quantized block, which is longer). A
/// zero-extending 64-bit load is used on purpose: a 16-bit insert (what a 2-byte read compiles
/// to) merges into an unrelated register, which would put a loop-carried dependency on the
/// accumulators.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_at_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_batch;
#[cfg(test)]
mod tests_float_interleaved;
#[cfg(test)]
mod tests_kquant_interleaved;
#[cfg(test)]
mod tests_kquant_low;
#[cfg(test)]
mod tests_many;
