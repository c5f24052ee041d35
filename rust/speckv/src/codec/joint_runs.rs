//! A jointly coded chunk's pass, channel by channel, shared by the encoder and the decoder
//! (`crate::joint`, invariants J1-J3), and the chunk's fingerprint with the joint parameters.

use crate::chunk::StreamModel;
use crate::hash::Hasher;
use crate::joint::{residuals, residuals_of, values_into, Joint, BLOCK};
use crate::joint_integer::{block, even, finish, interleave, quantise_row, IntegerJoint, BLOCK as INT_BLOCK};
use crate::token_scale::TokenEnergy;
use crate::words::Word;

/// Fingerprint of a jointly coded chunk: the plain one (mu and sigma codes) and the digest of
/// each of its layers' joint parameters.
pub(super) fn joint_fingerprint(plain: u64, joint: &Joint, range: &std::ops::Range<usize>) -> u64 {
    let mut h = Hasher::new();
    h.update(&plain.to_le_bytes());
    for layer in range.start / joint.layer_scalars()..range.end.div_ceil(joint.layer_scalars()) {
        h.update(&joint.digest(layer).to_le_bytes());
    }
    h.finish()
}

/// Codes (or, with `decode`, decodes) a chunk of whole layers channel by channel, each
/// channel's run of tokens against its conditional mu (`crate::joint`, invariant J1) and, with
/// a token scale, sigma codes scaled per token (`crate::token_scale`, invariant J3); `x` and
/// `codes` are the chunk's, `mu` the whole tensor's. One pass serves both directions, so
/// encoder and decoder cannot disagree on the order.
///
/// Where the CPU has AVX-512, the per-run loops (the conditional mu's last terms, the values
/// and residuals, the token scale's codes and energy) are compiled for it: ~12% of a joint
/// stream's decode. The floats are the same: IEEE operations give one result whatever the
/// instruction, and Rust never fuses a multiply and an add unless asked (J1).
pub(super) fn joint_runs<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    #[cfg(target_arch = "x86_64")]
    if crate::joint::wide_kernels() {
        // SAFETY: `wide_kernels()` checked at run time that this CPU has AVX2 and AVX-512F,
        // the features `joint_runs_wide` is compiled for.
        unsafe { joint_runs_wide(model, joint, x, mu, codes, start, code_run) };
        return;
    }
    joint_runs_body(model, joint, x, mu, codes, start, code_run)
}

/// `joint_runs_body` compiled for AVX2 and AVX-512F.
///
/// # Safety
/// The CPU must have AVX2 and AVX-512F (`crate::joint::wide_kernels`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn joint_runs_wide<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    joint_runs_body(model, joint, x, mu, codes, start, code_run)
}

/// `joint_runs`' one implementation, inlined into each variant.
#[inline(always)]
fn joint_runs_body<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    mut code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    if let Some(integer) = &joint.integer {
        return integer_runs(model, joint, integer, x, mu, codes, start, code_run);
    }
    let (t, per_layer, dtype) = (joint.tokens, joint.layer_scalars(), model.dtype);
    let mut own = vec![0f32; per_layer];
    let mut corrected = vec![0f32; t];
    // channels in whole blocks take their first terms together (`Joint::block`)
    let blocked = joint.channels / BLOCK * BLOCK;
    let mut block = vec![0f32; BLOCK * t];
    let mut energy = energy(model, t);
    for local in (0..x.len()).step_by(per_layer) {
        let layer = (start + local) / per_layer;
        if plain_layer(joint, &mut energy, layer, local, x, mu, codes, start, &mut code_run) {
            continue;
        }
        for i in 0..joint.channels {
            let run = local + i * t..local + (i + 1) * t;
            let base = &mu[start + run.start..start + run.end];
            if i < blocked {
                let i0 = i / BLOCK * BLOCK;
                if i == i0 {
                    joint.block(layer, i0, &own, &mut block);
                }
                joint.finish(layer, i, i0, base, &own, &block[(i - i0) * t..(i - i0 + 1) * t], &mut corrected);
            } else {
                joint.conditional(layer, i, base, &own, &mut corrected);
            }
            let own_run = &mut own[i * t..(i + 1) * t];
            code_channel(
                dtype,
                &mut energy,
                i,
                &mut x[run.clone()],
                &corrected,
                &codes[run],
                base,
                own_run,
                &mut code_run,
            );
        }
    }
}

/// With a token scale: its energy, the scaled codes and the run's values (taken against two
/// means).
type Energy = Option<(TokenEnergy, Vec<i16>, Vec<f32>)>;

/// A stream's `Energy` for runs of `tokens` (None without a token scale).
fn energy(model: &StreamModel, tokens: usize) -> Energy {
    model.token_scale.map(|s| (TokenEnergy::new(s, tokens), vec![0i16; tokens], vec![0f32; tokens]))
}

/// Invariant J2 for the layer at `local` of the chunk: where its parameters are all zero, the
/// layer is coded against `mu` as it is, one run, and this returns true; otherwise the token
/// scale's energy starts over for it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn plain_layer<W: Word>(
    joint: &Joint,
    energy: &mut Energy,
    layer: usize,
    local: usize,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    code_run: &mut impl FnMut(&mut [W], &[f32], &[i16]),
) -> bool {
    if joint.is_plain(layer) {
        let run = local..local + joint.layer_scalars();
        code_run(&mut x[run.clone()], &mu[start + run.start..start + run.end], &codes[run]);
        return true;
    }
    if let Some((e, _, _)) = energy {
        e.reset();
    }
    false
}

/// Codes channel `i`'s run `x` against its conditional mu `corrected` and calibrated sigma
/// codes (scaled per token with a token scale, J3), then writes its residuals against the
/// unconditional `base` into `own` (J1's `e`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn code_channel<W: Word>(
    dtype: crate::dtype::DType,
    energy: &mut Energy,
    i: usize,
    x: &mut [W],
    corrected: &[f32],
    calibrated: &[i16],
    base: &[f32],
    own: &mut [f32],
    code_run: &mut impl FnMut(&mut [W], &[f32], &[i16]),
) {
    match energy {
        Some((e, scaled, values)) => {
            e.codes(i, calibrated, scaled);
            code_run(x, corrected, scaled);
            values_into(dtype, x, values);
            e.add(values, corrected, calibrated);
            residuals_of(values, base, own);
        }
        None => {
            code_run(x, corrected, calibrated);
            residuals(dtype, x, base, own);
        }
    }
}

/// `joint_runs_body` for a stream in the integer form (`crate::joint_integer`, invariant J4):
/// each layer's residuals quantised into a pair-interleaved buffer (the outside channels' at
/// the layer's start, each own channel's once it is coded), each block of channels' sums over
/// the sources before it in one integer pass, the block's own earlier channels added per
/// channel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn integer_runs<W: Word>(
    model: &StreamModel,
    joint: &Joint,
    integer: &IntegerJoint,
    x: &mut [W],
    mu: &[f32],
    codes: &[i16],
    start: usize,
    mut code_run: impl FnMut(&mut [W], &[f32], &[i16]),
) {
    let (t, per_layer, dtype) = (joint.tokens, joint.layer_scalars(), model.dtype);
    let (c, e) = (joint.channels, joint.outside_channels);
    let (ep, width) = (even(e), e + c);
    let row_len = ep + even(c);
    // the sources' residuals in pairs (the block sums'), and the own channels' row by row
    // (the last terms'); a pair is written once both its channels are coded
    let mut q = vec![0i16; row_len * t];
    let mut own_q = vec![0i16; (c + 1) * t];
    let mut outside_q = vec![0i16; 2 * t];
    let mut own = vec![0f32; t];
    let mut corrected = vec![0f32; t];
    let mut acc = vec![0i32; INT_BLOCK * t];
    let zero_row = vec![0i16; row_len];
    let mut energy = energy(model, t);
    for local in (0..x.len()).step_by(per_layer) {
        let layer = (start + local) / per_layer;
        if plain_layer(joint, &mut energy, layer, local, x, mu, codes, start, &mut code_run) {
            continue;
        }
        let scale = &integer.scale[layer * width..(layer + 1) * width];
        let rows = &integer.coef[layer * c * row_len..(layer + 1) * c * row_len];
        let outside = &joint.outside[layer * e * t..(layer + 1) * e * t];
        for p in 0..ep / 2 {
            outside_q.fill(0); // an odd count's last pair: its second source is 0
            for h in 0..2 {
                if let Some(source) = outside.chunks_exact(t).nth(2 * p + h) {
                    quantise_row(source, scale[2 * p + h], &mut outside_q[h * t..(h + 1) * t]);
                }
            }
            let (first, second) = outside_q.split_at(t);
            interleave(first, second, p, t, &mut q);
        }
        for i in 0..c {
            let i0 = i / INT_BLOCK * INT_BLOCK;
            if i == i0 {
                // the sources before the block: every outside channel, own channels ..i0
                let block_rows: [&[i16]; INT_BLOCK] = std::array::from_fn(|k| {
                    if i0 + k < c {
                        &rows[(i0 + k) * row_len..(i0 + k + 1) * row_len]
                    } else {
                        &zero_row[..]
                    }
                });
                block(block_rows, &q, t, (ep + i0) / 2, &mut acc);
            }
            let run = local + i * t..local + (i + 1) * t;
            let base = &mu[start + run.start..start + run.end];
            let ch = layer * c + i;
            let row = &rows[i * row_len..(i + 1) * row_len];
            let sums = &acc[(i - i0) * t..(i - i0 + 1) * t];
            let earlier = &own_q[i0 * t..i * t];
            finish(row, ep, i0, earlier, sums, joint.offset[ch], integer.unit[ch], base, &mut corrected);
            code_channel(
                dtype,
                &mut energy,
                i,
                &mut x[run.clone()],
                &corrected,
                &codes[run],
                base,
                &mut own,
                &mut code_run,
            );
            quantise_row(&own, scale[e + i], &mut own_q[i * t..(i + 1) * t]);
            if i % 2 == 1 || i + 1 == c {
                // channel i - 1's pair complete (an odd count's last pair: row c is 0)
                let j = i / 2 * 2;
                let (first, second) = own_q[j * t..(j + 2) * t].split_at(t);
                interleave(first, second, (ep + j) / 2, t, &mut q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ModelKind;
    use crate::dtype::DType;
    use crate::model::ModelParams;
    use crate::token_scale::TokenScale;

    /// The runs a pass over a chunk hands its coder: each run's conditional mu and sigma
    /// codes, as bits.
    fn runs_of(wide: bool, model: &StreamModel, joint: &Joint, x: &mut [u16], mu: &[f32], codes: &[i16]) -> Vec<u32> {
        let mut seen = Vec::new();
        let record = |_: &mut [u16], corrected: &[f32], run_codes: &[i16]| {
            seen.extend(corrected.iter().map(|v| v.to_bits()));
            seen.extend(run_codes.iter().map(|&c| c as u16 as u32));
        };
        if wide {
            joint_runs(model, joint, x, mu, codes, 0, record);
        } else {
            joint_runs_body(model, joint, x, mu, codes, 0, record);
        }
        seen
    }

    #[test]
    fn joint_runs_compiled_for_avx512_hand_the_coder_the_portable_runs() {
        #[cfg(target_arch = "x86_64")]
        if !crate::test_env::have("avx512", crate::joint::wide_kernels(), "no AVX-512 here, only the portable runs") {
            return;
        }
        let mut seed = 11u64;
        let mut next = move || {
            seed = crate::test_env::lcg_step(seed);
            (seed >> 40) as u32
        };
        let (c, t, layers) = (9usize, 37usize, 2usize);
        let n = layers * c * t;
        // bfloat16 patterns of every kind, infinities and NaNs among them
        let mut x: Vec<u16> = (0..n).map(|_| next() as u16).collect();
        let mu: Vec<f32> = (0..n).map(|_| f32::from_bits(((next() as u16) as u32) << 16) * 0.5).collect();
        let codes: Vec<i16> = (0..n).map(|k| if k % 3 == 0 { 120 } else { 100 + (next() % 200) as i16 }).collect();
        let small = |v: u32| (v % 2000) as f32 * 1e-3 - 1.0;
        let coef: Vec<f32> = (0..layers * c * c).map(|k| if k % 4 == 0 { 0.0 } else { small(next()) }).collect();
        let offset: Vec<f32> = (0..layers * c).map(|_| small(next())).collect();
        let joint = Joint {
            channels: c,
            tokens: t,
            outside_channels: 0,
            outside: &[],
            coef: &coef,
            offset: &offset,
            integer: None,
        };
        for scale in [None, Some(TokenScale::default())] {
            let mut model = StreamModel::new(DType::BFloat16, ModelParams::default(), ModelKind::Bins, 1, 1);
            model.token_scale = scale;
            let wide = runs_of(true, &model, &joint, &mut x.clone(), &mu, &codes);
            let portable = runs_of(false, &model, &joint, &mut x, &mu, &codes);
            assert_eq!(wide.len(), 2 * n);
            assert!(wide == portable, "token scale {scale:?}");
        }
        // the integer form (J4), an odd count of outside channels and of own ones
        let e = 3;
        let outside: Vec<f32> = (0..layers * e * t).map(|_| small(next()) * 4.0).collect();
        let coef: Vec<f32> = (0..layers * c * (e + c)).map(|k| if k % 4 == 0 { 0.0 } else { small(next()) }).collect();
        let sigma: Vec<f32> = (0..layers * (e + c)).map(|_| 0.01 + small(next()).abs()).collect();
        let (scale, a, unit) = crate::joint_integer::build(c, e, &coef, &sigma).unwrap();
        let integer = IntegerJoint { scale: &scale, coef: &a, unit: &unit };
        let float = Joint { outside_channels: e, outside: &outside, coef: &coef, ..joint };
        let joint = Joint { integer: Some(integer), ..float };
        for scale in [None, Some(TokenScale::default())] {
            let mut model = StreamModel::new(DType::BFloat16, ModelParams::default(), ModelKind::Bins, 1, 1);
            model.token_scale = scale;
            let wide = runs_of(true, &model, &joint, &mut x.clone(), &mu, &codes);
            let portable = runs_of(false, &model, &joint, &mut x.clone(), &mu, &codes);
            assert!(wide == portable, "integer form, token scale {scale:?}");
            // (the integer form's runs are not the float form's: its flag tells decoders)
            assert!(runs_of(false, &model, &float, &mut x.clone(), &mu, &codes) != wide);
        }
    }
}
