//! M1's sums with AMX's int8 tiles (Intel Sapphire Rapids and later, Linux): the same `acc`
//! mod 2^32 as every other kernel, 1.4-1.6x `vpdpwssd`'s throughput on an Intel Xeon
//! (`examples/map_speed.rs`; what holds it there: `docs/benchmarks/restore-profile.md`).
//!
//! AMX multiplies bytes, not 16-bit words, so each i16 `v` is split exactly into a signed
//! high byte and an unsigned low byte, `v = 256 h + l` (`h = v >> 8` in -128..=127,
//! `l = v & 0xFF`), for the features `q` and the weights `w` alike:
//!
//! ```text
//! q w = 65536 (qh wh) + 256 (qh wl + ql wh) + (ql wl)
//!         TDPBSSD         TDPBSUD   TDPBUSD     TDPBUUD
//! acc = 65536 C_hh + 256 C_mid + C_ll          (mod 2^32)
//! ```
//!
//! Each tile product sums its bytes' products into i32 lanes with wrapping, as M1's `acc`
//! does, and reduction mod 2^32 is a ring map: the combination is `acc` mod 2^32 exactly,
//! whatever order the tiles sum in.
//!
//! Tiles (palette 1, each 16 rows of 64 bytes): `tmm0`, `tmm1`/`tmm7` and `tmm2` the
//! accumulators of 16 tokens x 16 outputs (`C_hh`, `C_mid` as two tiles summed at the end, and
//! `C_ll`), `tmm3`/`tmm4` the features' high and low bytes (16 tokens x 64 features),
//! `tmm5`/`tmm6` the weights' (16 rows of 4 features x 16 outputs, AMX's B layout: row `r`
//! holds, per output `n`, the bytes of features `4 r .. 4 r + 4`). The weights are laid out
//! once per map (`Packed`), 1 KiB per block of 64 features x 16 outputs.
//!
//! Using AMX needs the kernel's permission (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, Linux 5.16 and later, once per process); without it the first tile
//! instruction faults, so `available` asks for it before any kernel is picked and the maps
//! keep `vpdpwssd` where it is refused (Linux refuses it, for one, while a thread's
//! alternate signal stack is too small for the tiles' state).

use std::arch::asm;
use std::sync::OnceLock;

/// Bytes of a tile's row and rows of a tile (palette 1).
const ROW_BYTES: usize = 64;
const TILE_ROWS: usize = 16;
/// Features per block (a tile's row of bytes) and outputs per block (a C tile's row of i32).
const K_BLOCK: usize = ROW_BYTES;
const O_BLOCK: usize = 16;
const TILE_BYTES: usize = ROW_BYTES * TILE_ROWS;

/// Linux's `arch_prctl` codes (arch/x86/include/uapi/asm/prctl.h) and the tile data's
/// XSAVE feature number.
const SYS_ARCH_PRCTL: usize = 158;
const ARCH_GET_XCOMP_PERM: usize = 0x1022;
const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
const XFEATURE_XTILEDATA: usize = 18;

/// True when this processor has AMX-TILE and AMX-INT8, the OS saves tile state, and this
/// process may use it (asked for once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // leaf 7 read only where the highest leaf covers it
        if __cpuid(0).eax < 7 {
            return false;
        }
        let (leaf1, leaf7) = (__cpuid(1), __cpuid_count(7, 0));
        let (amx_tile, amx_int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
        let osxsave = leaf1.ecx >> 27 & 1 == 1;
        if !(amx_tile && amx_int8 && osxsave) {
            return false;
        }
        // SAFETY: OSXSAVE is set, so `xgetbv` with ECX = 0 is allowed.
        let xcr0 = unsafe { std::arch::x86_64::_xgetbv(0) };
        // XTILECFG (17) and XTILEDATA (18) enabled by the OS
        if xcr0 >> 17 & 3 != 3 {
            return false;
        }
        request_permission()
    })
}

/// Asks Linux for the tile data's permission and checks it was granted.
fn request_permission() -> bool {
    let ret: isize;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, 18)` takes two integers and touches no memory
    // of ours; `syscall` clobbers rcx and r11, declared.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL as isize => ret, in("rdi") ARCH_REQ_XCOMP_PERM,
             in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if ret != 0 {
        return false;
    }
    let mut granted: u64 = 0;
    let ret: isize;
    // SAFETY: `ARCH_GET_XCOMP_PERM` writes one u64 at the address given, `granted`'s.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL as isize => ret, in("rdi") ARCH_GET_XCOMP_PERM,
             in("rsi") &mut granted as *mut u64, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0 && granted >> XFEATURE_XTILEDATA & 1 == 1
}

/// A map's weights in AMX's B layout, high and low bytes apart (module doc).
#[derive(Debug, Clone)]
pub(super) struct Packed {
    k_blocks: usize,
    o_blocks: usize,
    /// Per output block, per feature block: one tile of 1 KiB.
    high: Vec<u8>,
    low: Vec<u8>,
}

impl Packed {
    /// From `LinearMap`'s pair layout, `packed[((j / 2) * padded + o) * 2 + j % 2] = w[j, o]`.
    pub(super) fn new(features: usize, padded: usize, packed: &[i16]) -> Packed {
        let (k_blocks, o_blocks) = (features.div_ceil(K_BLOCK), padded / O_BLOCK);
        let mut high = vec![0u8; k_blocks * o_blocks * TILE_BYTES];
        let mut low = vec![0u8; k_blocks * o_blocks * TILE_BYTES];
        for j in 0..features {
            let (kb, r, i) = (j / K_BLOCK, (j % K_BLOCK) / 4, j % 4);
            for o in 0..padded {
                let w = packed[((j / 2) * padded + o) * 2 + j % 2];
                let at = ((o / O_BLOCK) * k_blocks + kb) * TILE_BYTES + r * ROW_BYTES + (o % O_BLOCK) * 4 + i;
                high[at] = (w >> 8) as u8;
                low[at] = w as u8;
            }
        }
        Packed { k_blocks, o_blocks, high, low }
    }
}

/// Palette 1 with tiles 0..7 each 16 rows of 64 bytes (the `ldtilecfg` operand's layout).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn all_full() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(ROW_BYTES as u16).to_le_bytes());
            c[48 + t] = TILE_ROWS as u8;
        }
        TileConfig(c)
    }
}

/// `acc[t, o] += sum_j q[t, j] w[j, o]` (mod 2^32), `q` M1's features of `x` (`rows x
/// features`, `scale` per feature), `acc` `rows x padded`.
///
/// # Safety
/// `available()` must have returned true in this process (which also means AVX-512F and BW,
/// which the loops around the tiles are compiled for).
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn accumulate(w: &Packed, x: &[f32], scale: &[f32], rows: usize, acc: &mut [i32], padded: usize) {
    let features = scale.len();
    let stride = w.k_blocks * K_BLOCK;
    let row_tiles = rows.div_ceil(TILE_ROWS);
    // the features' bytes, tokens padded to whole tiles and features to whole blocks with zeros
    let mut high = vec![0u8; row_tiles * TILE_ROWS * stride];
    let mut low = vec![0u8; row_tiles * TILE_ROWS * stride];
    for t in 0..rows {
        let (x, h, l) = (&x[t * features..(t + 1) * features], &mut high[t * stride..], &mut low[t * stride..]);
        let whole = features / 16 * 16;
        for j in (0..whole).step_by(16) {
            // SAFETY: `j + 16 <= features`: 16 floats of `x` and `scale`, 16 bytes of each plane's
            // row (`stride >= features`).
            unsafe { split16(x.as_ptr().add(j), scale.as_ptr().add(j), h.as_mut_ptr().add(j), l.as_mut_ptr().add(j)) };
        }
        for j in whole..features {
            let v = super::quantize_one(x[j], scale[j]);
            (h[j], l[j]) = ((v >> 8) as u8, v as u8);
        }
    }
    let cfg = TileConfig::all_full();
    let mut c = [[0i32; O_BLOCK * TILE_ROWS]; 4];
    // SAFETY: AMX-TILE and the permission (`available`); the configuration is 64 readable
    // bytes.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
    for ob in 0..w.o_blocks {
        for rt in 0..row_tiles {
            // SAFETY: AMX-TILE, configured above.
            unsafe {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm7", options(nostack, nomem))
            };
            for kb in 0..w.k_blocks {
                let a = rt * TILE_ROWS * stride + kb * K_BLOCK;
                let b = (ob * w.k_blocks + kb) * TILE_BYTES;
                // SAFETY: AMX-INT8; each load reads 16 rows of 64 bytes: from `a`, `stride`
                // apart, inside the features' planes (`row_tiles * 16` rows of `stride`); from
                // `b`, 64 apart, one tile of the weights' planes.
                unsafe {
                    asm!(
                        "tileloadd tmm3, [{ah} + {s}*1]",
                        "tileloadd tmm4, [{al} + {s}*1]",
                        "tileloadd tmm5, [{bh} + {r}*1]",
                        "tileloadd tmm6, [{bl} + {r}*1]",
                        "tdpbssd tmm0, tmm3, tmm5",
                        "tdpbsud tmm1, tmm3, tmm6",
                        "tdpbusd tmm7, tmm4, tmm5",
                        "tdpbuud tmm2, tmm4, tmm6",
                        ah = in(reg) high.as_ptr().add(a),
                        al = in(reg) low.as_ptr().add(a),
                        bh = in(reg) w.high.as_ptr().add(b),
                        bl = in(reg) w.low.as_ptr().add(b),
                        s = in(reg) stride,
                        r = in(reg) ROW_BYTES,
                        options(nostack, readonly),
                    );
                }
            }
            // SAFETY: each store writes 16 rows of 64 bytes, 64 apart: one array of `c`.
            unsafe {
                asm!(
                    "tilestored [{c0} + {r}*1], tmm0",
                    "tilestored [{c1} + {r}*1], tmm1",
                    "tilestored [{c2} + {r}*1], tmm2",
                    "tilestored [{c3} + {r}*1], tmm7",
                    c0 = in(reg) c[0].as_mut_ptr(),
                    c3 = in(reg) c[3].as_mut_ptr(),
                    c1 = in(reg) c[1].as_mut_ptr(),
                    c2 = in(reg) c[2].as_mut_ptr(),
                    r = in(reg) ROW_BYTES,
                    options(nostack),
                );
            }
            for i in 0..TILE_ROWS.min(rows - rt * TILE_ROWS) {
                let out = &mut acc[(rt * TILE_ROWS + i) * padded + ob * O_BLOCK..][..O_BLOCK];
                let k = i * O_BLOCK;
                let rows = (&c[0][k..k + O_BLOCK], &c[1][k..k + O_BLOCK], &c[2][k..k + O_BLOCK], &c[3][k..k + O_BLOCK]);
                for (n, a) in out.iter_mut().enumerate() {
                    let sum =
                        (rows.0[n] << 16).wrapping_add(rows.1[n].wrapping_add(rows.3[n]) << 8).wrapping_add(rows.2[n]);
                    *a = a.wrapping_add(sum);
                }
            }
        }
    }
    // SAFETY: AMX-TILE; returns the tiles to their initial state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// M1's `q` of 16 features split into their high and low bytes.
///
/// # Safety
/// AVX-512F; 16 floats readable at `x` and `scale`, 16 bytes writable at `high` and `low`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn split16(x: *const f32, scale: *const f32, high: *mut u8, low: *mut u8) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's pointers (above).
    unsafe {
        let q = super::x86::quantize16(x, scale);
        _mm_storeu_si128(high as *mut __m128i, _mm512_cvtepi32_epi8(_mm512_srai_epi32::<8>(q)));
        _mm_storeu_si128(low as *mut __m128i, _mm512_cvtepi32_epi8(q));
    }
}
