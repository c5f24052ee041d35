//! Integer linear maps: the layer-wise predictor's maps, computed so that every machine, SIMD
//! width and thread count gets the same prediction bit for bit.
//!
//! A map predicts `y[t, o] = bias[o] + sum_j x[t, j] * w[j, o]` for every token `t`. A float
//! sum's bits depend on its order and on fused multiply-adds, which differ between BLAS builds,
//! SIMD widths and thread counts; the decoder must reproduce the encoder's prediction exactly,
//! so the maps sum integers instead. Invariant (M1), what makes every side agree:
//!
//! ```text
//! q[t, j]   = clamp(round_half_even(x[t, j] * 2^shift[j]), -32767, 32767)   i16 (NaN -> 0)
//! acc[t, o] = sum_j q[t, j] * w[j, o]          i32, wrapping: addition mod 2^32 is
//!                                              associative, so any order gives the same acc
//! y[t, o]   = bias[o] + f32(acc[t, o]) * scale[o]      two correctly rounded f32 operations
//! ```
//!
//! `x * 2^shift` is exact in f32 (a power of two; `shift` is small), `w` (i16, never -32768)
//! and `scale` (a power of two) are fixed at calibration (`speckv.hf.prefix`), chosen so that
//! `acc` does not wrap on real data (where it would, the prediction is poor but still the
//! same everywhere). The kernels: portable Rust, AVX2 (`vpmaddwd`), AVX-512 (`vpmaddwd`, or
//! `vpdpwssd` with VNNI) and AMX's int8 tiles (`amx`: each i16 as two bytes, four tile
//! products), all computing `acc` mod 2^32; `SPECKV_SIMD=0` / `avx2` select them as for the
//! coder, `SPECKV_AMX=0` keeps VNNI where AMX is there. With AVX-512 the features are
//! quantized 16 at a time (`x86::quantize16`, M1's `q` in vector steps).
//!
//! Weights are packed once (`LinearMap::new`): pairs of features interleaved per output,
//! `packed[(p * outputs_padded + o) * 2 + i] = w[2p + i, o]`, outputs padded to a multiple of
//! 16 and features to a multiple of 2 with zeros, so one 512-bit load holds 16 outputs' pairs.

use crate::error::{invalid, Result};
use crate::parallel::for_each_piece_mut;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
mod heads;
mod sources;

pub use heads::Heads;
pub use sources::Source;

/// Checks `sources` for a map of `features` inputs over `batch` entries (what
/// `LinearMap::apply_sources` checks first).
pub fn check_sources(sources: &[Source], batch: usize, features: usize) -> Result<()> {
    sources::check(sources, batch, features)
}

/// Output lanes per register in the widest kernel; outputs are padded to a multiple of it.
const LANES: usize = 16;
/// The largest power-of-two exponent a feature or output scale may have (`x * 2^shift` stays
/// exact and finite for the caches' magnitudes).
pub const MAX_SHIFT: i32 = 40;
/// Tokens per piece when a map is spread over threads.
const ROWS_PER_PIECE: usize = 64;

/// A calibrated integer map (see the module's notes), weights packed for the kernels.
#[derive(Debug, Clone)]
pub struct LinearMap {
    features: usize,
    outputs: usize,
    padded: usize,
    pairs: usize,
    shift: Vec<f32>,
    packed: Vec<i16>,
    bias: Vec<f32>,
    scale: Vec<f32>,
    /// The weights in AMX's layout, where the maps sum with AMX (`Kernel::Amx`).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    amx: Option<amx::Packed>,
}

fn power_of_two(e: i32) -> f32 {
    f32::powi(2.0, e)
}

impl LinearMap {
    /// `weights`: `features x outputs`, row-major, each in `-32767..=32767`; `shift`: one
    /// power-of-two exponent per feature, `scale_shift` one per output (`scale = 2^-s`).
    pub fn new(
        features: usize,
        outputs: usize,
        shift: &[i32],
        weights: &[i16],
        bias: &[f32],
        scale_shift: &[i32],
    ) -> Result<Self> {
        if features == 0 || outputs == 0 {
            return invalid("linear map: needs at least one feature and one output");
        }
        if shift.len() != features || scale_shift.len() != outputs || bias.len() != outputs {
            return invalid(format!(
                "linear map: {} feature shifts, {} output scales and {} biases for {features} features x {outputs} outputs",
                shift.len(),
                scale_shift.len(),
                bias.len()
            ));
        }
        if weights.len() != features.saturating_mul(outputs) {
            return invalid(format!("linear map: {} weights for {features} x {outputs}", weights.len()));
        }
        if shift.iter().chain(scale_shift).any(|s| s.abs() > MAX_SHIFT) {
            return invalid(format!("linear map: a scale exponent beyond +-{MAX_SHIFT}"));
        }
        if weights.contains(&i16::MIN) {
            return invalid("linear map: weights must lie in -32767..=32767");
        }
        if bias.iter().any(|b| !b.is_finite()) {
            return invalid("linear map: a bias is not finite");
        }
        let padded = outputs.div_ceil(LANES) * LANES;
        let pairs = features.div_ceil(2);
        let mut packed = vec![0i16; pairs * padded * 2];
        for j in 0..features {
            for o in 0..outputs {
                packed[((j / 2) * padded + o) * 2 + (j % 2)] = weights[j * outputs + o];
            }
        }
        Ok(LinearMap {
            features,
            outputs,
            padded,
            pairs,
            shift: shift.iter().map(|&s| power_of_two(s)).collect(),
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            amx: (kernel() == Kernel::Amx).then(|| amx::Packed::new(features, padded, &packed)),
            packed,
            bias: bias.to_vec(),
            scale: scale_shift.iter().map(|&s| power_of_two(-s)).collect(),
        })
    }

    pub fn features(&self) -> usize {
        self.features
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// `y` (`rows x outputs`) for `x` (`rows x features`), on `threads` threads (the same bits
    /// for any number).
    pub fn apply(&self, x: &[f32], rows: usize, y: &mut [f32], threads: usize) -> Result<()> {
        if x.len() != rows.saturating_mul(self.features) || y.len() != rows.saturating_mul(self.outputs) {
            return invalid(format!(
                "linear map: {} inputs and {} outputs given for {rows} rows of {} -> {}",
                x.len(),
                y.len(),
                self.features,
                self.outputs
            ));
        }
        let piece = ROWS_PER_PIECE * self.outputs;
        for_each_piece_mut(threads, y, piece, |i, out| {
            let first = i * ROWS_PER_PIECE;
            let n = out.len() / self.outputs;
            self.apply_rows(&x[first * self.features..(first + n) * self.features], n, out);
            Ok(())
        })
    }

    /// `apply` of the features gathered from `sources` (`linear_map::sources`: each one's
    /// heads side by side per token, a key's rotation undone, invariant R1) over `batch x
    /// rows` rows: the same `y` as `apply` of those features, without the caller building
    /// them. Each thread gathers its own rows.
    pub fn apply_sources(
        &self,
        sources: &[Source],
        batch: usize,
        rows: usize,
        y: &mut [f32],
        threads: usize,
    ) -> Result<()> {
        check_sources(sources, batch, self.features)?;
        let total = batch.saturating_mul(rows);
        if y.len() != total.saturating_mul(self.outputs) {
            return invalid(format!(
                "linear map: {} outputs given for {batch} x {rows} rows of {}",
                y.len(),
                self.outputs
            ));
        }
        let piece = ROWS_PER_PIECE * self.outputs;
        for_each_piece_mut(threads, y, piece, |i, out| {
            let n = out.len() / self.outputs;
            let mut x = vec![0f32; n * self.features];
            sources::gather(sources, rows, i * ROWS_PER_PIECE, n, &mut x);
            self.apply_rows(&x, n, out);
            Ok(())
        })
    }

    fn apply_rows(&self, x: &[f32], rows: usize, y: &mut [f32]) {
        let mut acc = vec![0i32; rows * self.padded];
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let Some(w) = &self.amx {
            // SAFETY: `amx` is built only where `kernel()` picked AMX, which `amx::available()`
            // granted (with AVX-512F and BW).
            unsafe { amx::accumulate(w, x, &self.shift, rows, &mut acc, self.padded) };
        } else {
            let q = self.quantize(x, rows);
            accumulate(kernel(), &q, rows, self.pairs, &self.packed, self.padded, &mut acc);
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        accumulate(kernel(), &self.quantize(x, rows), rows, self.pairs, &self.packed, self.padded, &mut acc);
        for t in 0..rows {
            let a = &acc[t * self.padded..t * self.padded + self.outputs];
            for (o, out) in y[t * self.outputs..(t + 1) * self.outputs].iter_mut().enumerate() {
                *out = self.bias[o] + (a[o] as f32) * self.scale[o];
            }
        }
    }

    /// `q` as pairs of i16 in one i32 each (`rows x pairs`), the first feature in the low half.
    fn quantize(&self, x: &[f32], rows: usize) -> Vec<i32> {
        let mut q = vec![0i32; rows * self.pairs];
        #[cfg(target_arch = "x86_64")]
        if !matches!(kernel(), Kernel::Portable | Kernel::Avx2) {
            // SAFETY: the other kernels are picked only where AVX-512F is; `q` has `rows * pairs`
            // i32, `2 * pairs >= features` i16 a row.
            unsafe { x86::quantize_rows(x, &self.shift, rows, self.pairs, &mut q) };
            return q;
        }
        for t in 0..rows {
            let row = &x[t * self.features..(t + 1) * self.features];
            for p in 0..self.pairs {
                let lo = quantize_one(row[2 * p], self.shift[2 * p]);
                let hi =
                    if 2 * p + 1 < self.features { quantize_one(row[2 * p + 1], self.shift[2 * p + 1]) } else { 0 };
                q[t * self.pairs + p] = (lo as u16 as u32 | ((hi as u16 as u32) << 16)) as i32;
            }
        }
        q
    }
}

/// 1.5 * 2^23: adding and subtracting it rounds a float32 of magnitude below 2^22 to an
/// integer, ties to even (the default rounding, which Rust assumes), in two vectorisable
/// operations (`round_ties_even` is a library call without SSE4.1).
const ROUNDER: f32 = 12_582_912.0;

/// M1's `q` of one feature.
#[inline]
fn quantize_one(x: f32, scale: f32) -> i16 {
    let v = x * scale;
    // NaN -> 0; the clamp keeps the rounding trick in range (and +-inf at the ends)
    let v = if v.is_nan() { 0.0 } else { v.clamp(-32767.0, 32767.0) };
    ((v + ROUNDER) - ROUNDER) as i16
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AMX's int8 tiles (`amx`; the weights in their own layout, so not through `accumulate`).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    Amx,
}

fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static KERNEL: OnceLock<Kernel> = OnceLock::new();
        return *KERNEL.get_or_init(|| {
            let simd = std::env::var("SPECKV_SIMD").unwrap_or_default();
            let simd = simd.trim();
            let wide = simd != "0" && simd != "avx2";
            if wide && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                #[cfg(target_os = "linux")]
                // (every AMX processor has VNNI too: `accumulate` takes it for such a map's
                // tests, and the check keeps that true under a hypervisor that hides one)
                if is_x86_feature_detected!("avx512vnni")
                    && std::env::var("SPECKV_AMX").map_or(true, |v| v.trim() != "0")
                    && amx::available()
                {
                    return Kernel::Amx;
                }
                if is_x86_feature_detected!("avx512vnni") {
                    return Kernel::Vnni;
                }
                return Kernel::Avx512;
            }
            if simd != "0" && is_x86_feature_detected!("avx2") {
                return Kernel::Avx2;
            }
            Kernel::Portable
        });
    }
    #[allow(unreachable_code)]
    Kernel::Portable
}

/// Which kernel computes the maps in this process: `"amx-int8"`, `"avx512-vnni"`, `"avx512"`, `"avx2"` or
/// `"portable"` (all compute the same sums).
pub fn kernel_name() -> &'static str {
    match kernel() {
        Kernel::Portable => "portable",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => "avx512-vnni",
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Kernel::Amx => "amx-int8",
    }
}

/// `acc[t, o] += sum_p q[t, p] . packed[p, o]` (pairs of i16 products, mod 2^32).
fn accumulate(k: Kernel, q: &[i32], rows: usize, pairs: usize, packed: &[i16], padded: usize, acc: &mut [i32]) {
    debug_assert!(q.len() == rows * pairs && acc.len() == rows * padded && packed.len() == pairs * padded * 2);
    match k {
        Kernel::Portable => portable(q, rows, pairs, packed, padded, acc),
        // SAFETY: `kernel()` picks each only where the processor has its features; the
        // slices' lengths are checked above (and by `LinearMap`'s construction).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::avx2(q, rows, pairs, packed, padded, acc) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86::avx512(q, rows, pairs, packed, padded, acc) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { x86::vnni(q, rows, pairs, packed, padded, acc) },
        // a map that sums with AMX holds its own weights and does not come here: `Amx` is only
        // picked where VNNI is there too
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Kernel::Amx => unsafe { x86::vnni(q, rows, pairs, packed, padded, acc) },
    }
}

fn portable(q: &[i32], rows: usize, pairs: usize, packed: &[i16], padded: usize, acc: &mut [i32]) {
    for t in 0..rows {
        let out = &mut acc[t * padded..(t + 1) * padded];
        for p in 0..pairs {
            let pair = q[t * pairs + p];
            let (lo, hi) = (pair as i16 as i32, (pair >> 16) as i16 as i32);
            let w = &packed[p * padded * 2..(p + 1) * padded * 2];
            for (o, a) in out.iter_mut().enumerate() {
                let s = (lo * w[2 * o] as i32).wrapping_add(hi * w[2 * o + 1] as i32);
                *a = a.wrapping_add(s);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// M1's `q` of 16 features (`super::quantize_one`'s steps in a vector: NaN to 0, the
    /// clamp, rounding half to even), one per i32 lane.
    ///
    /// # Safety
    /// AVX-512F; 16 floats readable at `x` and at `scale`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn quantize16(x: *const f32, scale: *const f32) -> __m512i {
        // SAFETY: the caller's pointers (above).
        let v = unsafe { _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(scale)) };
        let v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), v);
        let v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-32767.0)), _mm512_set1_ps(32767.0));
        _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
    }

    /// `LinearMap::quantize` 16 features at a time (the pairs are the i16 in order).
    ///
    /// # Safety
    /// AVX-512F; `x` holds `rows * scale.len()` floats, `q` `rows * pairs` with `2 * pairs >=
    /// scale.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_rows(x: &[f32], scale: &[f32], rows: usize, pairs: usize, q: &mut [i32]) {
        let features = scale.len();
        let whole = features / 16 * 16;
        for t in 0..rows {
            let (x, out) =
                (&x[t * features..(t + 1) * features], q[t * pairs..(t + 1) * pairs].as_mut_ptr() as *mut i16);
            for j in (0..whole).step_by(16) {
                // SAFETY: `j + 16 <= features`: inside the row of `x`, of `scale`, and of the
                // row's `2 * pairs` i16.
                unsafe {
                    let v = quantize16(x.as_ptr().add(j), scale.as_ptr().add(j));
                    _mm256_storeu_si256(out.add(j) as *mut __m256i, _mm512_cvtepi32_epi16(v));
                }
            }
            for j in whole..features {
                // SAFETY: `j < features <= 2 * pairs`.
                unsafe { *out.add(j) = super::quantize_one(x[j], scale[j]) };
            }
        }
    }

    /// Rows per register tile: each row's pair is broadcast once per step and meets every
    /// output register of the tile.
    const ROWS: usize = 8;
    /// Output registers per tile.
    const REGS: usize = 3;

    /// One tile kernel per instruction set, over helpers of that set (`$ops`: `zero`, `load`,
    /// `store`, `set1`, `add`, and `step(acc, pair, weights)` adding one step's products).
    macro_rules! tiles {
        ($name:ident, $tile:ident, $feat:literal, $ops:ident, $vec:ty, $w:literal) => {
            /// One tile of `R` rows x `C` registers of outputs from `(t0, o0)`, every pair.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn $tile<const R: usize, const C: usize>(
                q: &[i32],
                pairs: usize,
                packed: &[i16],
                padded: usize,
                acc: &mut [i32],
                t0: usize,
                o0: usize,
            ) {
                use $ops::*;
                let mut a: [[$vec; C]; R] = [[zero(); C]; R];
                let qp = q.as_ptr().add(t0 * pairs);
                for p in 0..pairs {
                    let wp = packed.as_ptr().add((p * padded + o0) * 2);
                    let mut wv: [$vec; C] = [zero(); C];
                    for (c, v) in wv.iter_mut().enumerate() {
                        // SAFETY: o0 + C * $w <= padded: the load stays in pair p's row
                        *v = load(wp.add(c * $w * 2) as *const i32);
                    }
                    for (i, row) in a.iter_mut().enumerate() {
                        // SAFETY: t0 + i < rows and p < pairs
                        let x = set1(*qp.add(i * pairs + p));
                        for c in 0..C {
                            row[c] = step(row[c], x, wv[c]);
                        }
                    }
                }
                for (i, row) in a.iter().enumerate() {
                    for (c, v) in row.iter().enumerate() {
                        // SAFETY: row t0 + i < rows; outputs o0 + c * $w .. + $w <= padded
                        let dst = acc.as_mut_ptr().add((t0 + i) * padded + o0 + c * $w);
                        store(dst, add(load(dst as *const i32), *v));
                    }
                }
            }

            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $name(
                q: &[i32],
                rows: usize,
                pairs: usize,
                packed: &[i16],
                padded: usize,
                acc: &mut [i32],
            ) {
                let mut o0 = 0;
                while o0 < padded {
                    let wide = padded - o0 >= REGS * $w;
                    let mut t0 = 0;
                    while t0 < rows {
                        let full = rows - t0 >= ROWS;
                        match (full, wide) {
                            (true, true) => $tile::<ROWS, REGS>(q, pairs, packed, padded, acc, t0, o0),
                            (false, true) => $tile::<1, REGS>(q, pairs, packed, padded, acc, t0, o0),
                            (true, false) => $tile::<ROWS, 1>(q, pairs, packed, padded, acc, t0, o0),
                            (false, false) => $tile::<1, 1>(q, pairs, packed, padded, acc, t0, o0),
                        }
                        t0 += if full { ROWS } else { 1 };
                    }
                    o0 += if wide { REGS * $w } else { $w };
                }
            }
        };
    }

    mod ops256 {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) fn zero() -> __m256i {
            _mm256_setzero_si256()
        }
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) unsafe fn load(p: *const i32) -> __m256i {
            // SAFETY: the caller's pointer has 8 readable i32
            unsafe { _mm256_loadu_si256(p as *const __m256i) }
        }
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) unsafe fn store(p: *mut i32, v: __m256i) {
            // SAFETY: the caller's pointer has 8 writable i32
            unsafe { _mm256_storeu_si256(p as *mut __m256i, v) }
        }
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) fn set1(x: i32) -> __m256i {
            _mm256_set1_epi32(x)
        }
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) fn add(a: __m256i, b: __m256i) -> __m256i {
            _mm256_add_epi32(a, b)
        }
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) fn step(a: __m256i, x: __m256i, w: __m256i) -> __m256i {
            _mm256_add_epi32(a, _mm256_madd_epi16(x, w))
        }
    }

    /// The 512-bit helpers; `step` as `vpmaddwd` + `vpaddd` (`dpwssd` below: one `vpdpwssd`).
    mod ops512 {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) fn zero() -> __m512i {
            _mm512_setzero_si512()
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) unsafe fn load(p: *const i32) -> __m512i {
            // SAFETY: the caller's pointer has 16 readable i32
            unsafe { _mm512_loadu_si512(p as *const __m512i) }
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) unsafe fn store(p: *mut i32, v: __m512i) {
            // SAFETY: the caller's pointer has 16 writable i32
            unsafe { _mm512_storeu_si512(p as *mut __m512i, v) }
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) fn set1(x: i32) -> __m512i {
            _mm512_set1_epi32(x)
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) fn add(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        pub(super) fn step(a: __m512i, x: __m512i, w: __m512i) -> __m512i {
            _mm512_add_epi32(a, _mm512_madd_epi16(x, w))
        }
    }

    mod ops512vnni {
        pub(super) use super::ops512::{add, load, set1, store, zero};
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
        #[inline]
        pub(super) fn step(a: __m512i, x: __m512i, w: __m512i) -> __m512i {
            _mm512_dpwssd_epi32(a, x, w)
        }
    }

    tiles!(avx2, tile_avx2, "avx2", ops256, __m256i, 8);
    tiles!(avx512, tile_avx512, "avx512f,avx512bw", ops512, __m512i, 16);
    tiles!(vnni, tile_vnni, "avx512f,avx512bw,avx512vnni", ops512vnni, __m512i, 16);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = crate::test_env::lcg_step(*seed);
        *seed >> 33
    }

    fn random_map(features: usize, outputs: usize, seed: &mut u64, big: bool) -> LinearMap {
        let range = if big { 65535 } else { 4001 };
        let w: Vec<i16> = (0..features * outputs)
            .map(|_| ((lcg(seed) % range) as i32 - (range as i32 / 2)).max(-32767) as i16)
            .collect();
        let shift: Vec<i32> = (0..features).map(|_| (lcg(seed) % 8) as i32 + 4).collect();
        let scale: Vec<i32> = (0..outputs).map(|_| (lcg(seed) % 10) as i32 + 10).collect();
        let bias: Vec<f32> = (0..outputs).map(|_| (lcg(seed) % 1000) as f32 / 100.0 - 5.0).collect();
        LinearMap::new(features, outputs, &shift, &w, &bias, &scale).unwrap()
    }

    #[test]
    fn applying_to_sources_is_applying_to_their_gathered_features() {
        // batch 2 x 70 rows (more than a piece); a K of 2 heads x 8 with its rotation over 70
        // tokens, a V of 1 head x 6 holding the last 50 tokens, a third of 1 x 4 holding 80
        let mut seed = 5u64;
        let mut floats =
            |n: usize| -> Vec<f32> { (0..n).map(|_| (lcg(&mut seed) % 20001) as f32 / 1000.0 - 10.0).collect() };
        let (batch, rows) = (2usize, 70usize);
        let (k, cos, sin) = (floats(batch * 2 * 70 * 8), floats(70 * 8), floats(70 * 8));
        let (v, w) = (floats(batch * 50 * 6), floats(batch * 80 * 4));
        let sources = [
            Source { data: &k, heads: 2, tokens: 70, dim: 8, rope: Some((&cos, &sin)) },
            Source { data: &v, heads: 1, tokens: 50, dim: 6, rope: None },
            Source { data: &w, heads: 1, tokens: 80, dim: 4, rope: None },
        ];
        let features = 2 * 8 + 6 + 4;
        // the features written out one by one (the torch code's steps, invariant R1)
        let mut x = vec![0f32; batch * rows * features];
        for b in 0..batch {
            for t in 0..rows {
                let row = &mut x[(b * rows + t) * features..][..features];
                for head in 0..2 {
                    let at = |c: usize| k[((b * 2 + head) * 70 + t) * 8 + c];
                    for c in 0..8 {
                        let half = if c < 4 { -at(c + 4) } else { at(c - 4) };
                        row[head * 8 + c] = at(c) * cos[t * 8 + c] - half * sin[t * 8 + c];
                    }
                }
                for c in 0..6 {
                    row[16 + c] = if t >= 20 { v[(b * 50 + t - 20) * 6 + c] } else { 0.0 };
                }
                for c in 0..4 {
                    row[22 + c] = w[(b * 80 + t + 10) * 4 + c];
                }
            }
        }
        let m = random_map(features, 20, &mut seed, false);
        let mut want = vec![0f32; batch * rows * 20];
        m.apply(&x, batch * rows, &mut want, 1).unwrap();
        for threads in [1, 3] {
            let mut got = vec![0f32; batch * rows * 20];
            m.apply_sources(&sources, batch, rows, &mut got, threads).unwrap();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "threads {threads}");
        }
        let mut short = vec![0f32; 20];
        assert!(m.apply_sources(&sources, batch, rows, &mut short, 1).is_err());
        assert!(m.apply_sources(&sources[..2], batch, rows, &mut want, 1).is_err());
    }

    /// `acc` of `m` on `x` with AMX's tiles, where this machine and process have them.
    fn amx_sums(m: &LinearMap, x: &[f32], rows: usize) -> Option<Vec<i32>> {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if amx::available() {
            let w = amx::Packed::new(m.features, m.padded, &m.packed);
            let mut got = vec![0i32; rows * m.padded];
            // SAFETY: `available()` returned true.
            unsafe { amx::accumulate(&w, x, &m.shift, rows, &mut got, m.padded) };
            return Some(got);
        }
        let _ = (m, x, rows);
        None
    }

    fn inputs(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n).map(|_| (lcg(seed) % 200_000) as f32 / 10_000.0 - 10.0).collect()
    }

    /// Every kernel the processor has computes the portable sums, wrapping included, for
    /// shapes with row, output and feature tails.
    #[test]
    fn kernels_agree_with_the_portable_sums_bit_for_bit() {
        let mut seed = 7;
        for &(rows, features, outputs, big) in
            &[(1, 1, 1, false), (5, 7, 19, false), (67, 130, 200, false), (9, 64, 48, true), (130, 33, 70, true)]
        {
            let m = random_map(features, outputs, &mut seed, big);
            let x = inputs(rows * features, &mut seed);
            let q = m.quantize(&x, rows);
            let mut want = vec![0i32; rows * m.padded];
            portable(&q, rows, m.pairs, &m.packed, m.padded, &mut want);
            #[cfg(target_arch = "x86_64")]
            {
                let mut kinds = vec![];
                if is_x86_feature_detected!("avx2") {
                    kinds.push(Kernel::Avx2);
                }
                if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                    kinds.push(Kernel::Avx512);
                    if is_x86_feature_detected!("avx512vnni") {
                        kinds.push(Kernel::Vnni);
                    }
                }
                for k in kinds {
                    let mut got = vec![0i32; rows * m.padded];
                    accumulate(k, &q, rows, m.pairs, &m.packed, m.padded, &mut got);
                    assert_eq!(got, want, "{k:?} {rows}x{features}->{outputs}");
                }
            }
            if let Some(got) = amx_sums(&m, &x, rows) {
                assert_eq!(got, want, "AMX {rows}x{features}->{outputs}");
            }
        }
    }

    /// M1 against a direct i64 sum reduced mod 2^32, and the bytes of y for any thread count.
    #[test]
    fn sums_are_exact_mod_2_32_and_thread_independent() {
        let mut seed = 11;
        let (rows, features, outputs) = (200, 45, 23);
        let m = random_map(features, outputs, &mut seed, true);
        let x = inputs(rows * features, &mut seed);
        let mut y1 = vec![0f32; rows * outputs];
        m.apply(&x, rows, &mut y1, 1).unwrap();
        for threads in [2, 3, 8] {
            let mut y = vec![0f32; rows * outputs];
            m.apply(&x, rows, &mut y, threads).unwrap();
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        for t in [0, 77, rows - 1] {
            for o in [0, 5, outputs - 1] {
                let mut s: i64 = 0;
                for j in 0..features {
                    let qj = quantize_one(x[t * features + j], m.shift[j]) as i64;
                    s += qj * m.packed[((j / 2) * m.padded + o) * 2 + j % 2] as i64;
                }
                let want = m.bias[o] + ((s as u64 as u32 as i32) as f32) * m.scale[o];
                assert_eq!(y1[t * outputs + o].to_bits(), want.to_bits());
            }
        }
    }

    /// The vector quantizers (AVX-512's pairs, AMX's byte planes) give `quantize_one`'s
    /// integers on NaN, infinities, the clamp, ties and signed zeros, in rows whose features
    /// are no multiple of 16; the sums over them too.
    #[test]
    fn vector_quantizing_matches_the_scalar_rule() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e9,
            -1e9,
            2.5,
            -3.5,
            0.5,
            1.5,
            -0.0,
            1e-40,
            32767.4,
            -32767.6,
        ];
        let mut seed = 5;
        for features in [16, 37, 70] {
            let m = random_map(features, 40, &mut seed, true);
            let rows = 19;
            // the specials divided by the feature's scale, so that `x * scale` is the special
            let x: Vec<f32> = (0..rows * features)
                .map(|i| {
                    let s = specials[(i * 7 + i / features) % specials.len()];
                    if i % 3 == 0 {
                        s / m.shift[i % features]
                    } else {
                        s
                    }
                })
                .collect();
            let q = m.quantize(&x, rows);
            for t in 0..rows {
                for j in 0..features {
                    let got = (q[t * m.pairs + j / 2] >> (16 * (j % 2))) as i16;
                    assert_eq!(got, quantize_one(x[t * features + j], m.shift[j]), "row {t}, feature {j}");
                }
            }
            let mut want = vec![0i32; rows * m.padded];
            portable(&q, rows, m.pairs, &m.packed, m.padded, &mut want);
            if let Some(got) = amx_sums(&m, &x, rows) {
                assert_eq!(got, want, "AMX, {features} features");
            }
        }
    }

    #[test]
    fn quantizing_rounds_half_to_even_clamps_and_zeroes_nan() {
        assert_eq!(quantize_one(2.5, 1.0), 2);
        assert_eq!(quantize_one(-3.5, 1.0), -4);
        assert_eq!(quantize_one(1e9, 1.0), 32767);
        assert_eq!(quantize_one(f32::NEG_INFINITY, 1.0), -32767);
        assert_eq!(quantize_one(f32::NAN, 1.0), 0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(LinearMap::new(2, 1, &[0, 0], &[1, i16::MIN], &[0.0], &[0]).is_err());
        assert!(LinearMap::new(2, 1, &[0, 99], &[1, 1], &[0.0], &[0]).is_err());
        assert!(LinearMap::new(2, 1, &[0, 0], &[1], &[0.0], &[0]).is_err());
        assert!(LinearMap::new(2, 1, &[0, 0], &[1, 1], &[f32::NAN], &[0]).is_err());
        let m = LinearMap::new(2, 1, &[0, 0], &[1, 1], &[0.0], &[0]).unwrap();
        assert!(m.apply(&[1.0; 3], 2, &mut [0.0; 2], 1).is_err());
    }
}
