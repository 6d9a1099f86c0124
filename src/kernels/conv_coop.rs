//! The f16 convolution's forward pass on the tensor-core kernel (`Kernel::ConvCoop`):
//! `matmul_coop.rs`'s generator with A gathered from the NHWC input (`GATHER`: a K slice lies in
//! one tap, so eight channels of one pixel are one 16-byte load), B the weight as `[o][tap][c]`,
//! and an epilogue that adds the bias and writes NCHW where every image's pixels are whole
//! 8-runs. Here: its immediates and gather (WGSL), its tile shapes and their choice.

use super::coop_gen::CoopKind;
use super::matmul_coop::{BIAS8, BIAS_BINDING};
use super::{CoopLayout, CoopTile};

/// The convolution's operands: A (the gathered input) row-major, B (the weight) transposed.
const LAYOUT: CoopLayout = CoopLayout {
    a_t: false,
    b_t: true,
};

/// The convolution's immediates: the matmul's first ten (`sab`, `sbb`, `lda` unused: zero), then
/// the geometry. `c8`: the input's channels in vectors of eight; `cg`: channels per group;
/// `taps`: kh x kw.
const PARAMS: &str = "struct Params {\n    m: u32,\n    n: u32,\n    k: u32,\n    \
    batch: u32,\n    off_a: u32,\n    sab: u32,\n    lda: u32,\n    off_b: u32,\n    sbb: u32,\n    \
    ldb: u32,\n    off_c: u32,\n    off_bias: u32,\n    h: u32,\n    w: u32,\n    c8: u32,\n    \
    oh: u32,\n    ow: u32,\n    kw: u32,\n    sh: u32,\n    sw: u32,\n    ph: u32,\n    pw: u32,\n    \
    dh: u32,\n    dw: u32,\n    cg: u32,\n    flags: u32,\n    taps: u32,\n    pad1: u32,\n}\n";

/// The convolution's gather: `conv_row` finds an output pixel's window once, `conv_slice` a
/// K slice's tap and first channel (the slice lies in one tap: `fits_conv`; in the flipped
/// variant the weight's tap t serves as tap `taps - 1 - t`: the input gradient's rotated
/// kernel, with no flipped copy of the weight; a variant, because a branch on a flag cost the
/// forward pass 2% on the H200), `gather` the eight
/// channels of one pixel at one tap (zeros in the padding and past the last pixel), as one
/// 16-byte load of the NHWC input.
const GATHER: &str =
    "struct Row {\n    base: u32,\n    ih: i32,\n    iw: i32,\n    ok: bool,\n}\n\n\
struct Slice {\n    dy: i32,\n    dx: i32,\n    v: u32,\n}\n\n\
fn conv_row(m: u32, v: u32) -> Row {\n    \
    let ohw = p.oh * p.ow;\n    \
    let img = m / ohw;\n    \
    let q = m % ohw;\n    \
    return Row(p.off_a / 8u + img * p.h * p.w * p.c8 + v, i32((q / p.ow) * p.sh) - i32(p.ph), \
    i32((q % p.ow) * p.sw) - i32(p.pw), m < p.m);\n}\n\n\
fn conv_slice(k: u32) -> Slice {\n    \
    let tap = {{TAP}};\n    \
    return Slice(i32((tap / p.kw) * p.dh), i32((tap % p.kw) * p.dw), (k % p.cg) / 8u);\n}\n\n\
fn gather(r: Row, s: Slice) -> vec4<u32> {\n    \
    let ih = r.ih + s.dy;\n    \
    let iw = r.iw + s.dx;\n    \
    if r.ok && ih >= 0 && iw >= 0 && ih < i32(p.h) && iw < i32(p.w) {\n        \
    return a[r.base + (u32(ih) * p.w + u32(iw)) * p.c8 + s.v];\n    }\n    \
    return vec4<u32>();\n}\n\n\
fn conv_bias1(co: u32) -> f32 {\n    \
    if (p.flags & 1u) == 0u {\n        return 0.0;\n    }\n    \
    let at = p.off_bias + co;\n    \
    let v = bias[at / 8u];\n    \
    var w = array<u32, 4>(v.x, v.y, v.z, v.w);\n    \
    return unpack2x16float(w[(at % 8u) / 2u])[at % 2u];\n}\n";

impl CoopTile {
    /// 128x64 per workgroup, four subgroups of 32x64 stacked along M: the convolution's tile
    /// for 64 output channels (ResNet's first stage), where a 128-wide tile is half empty
    /// (H100, 3x3 64->64 56x56 b32 with the input's transposes: 67.6 TFLOP/s; 256x64 from
    /// four 64x64 subgroups 57.5; 128x64 from two 58.0).
    pub const CONV64: CoopTile = CoopTile {
        wm: 4,
        wn: 1,
        tm: 2,
        tn: 4,
        bk: 32,
        depth: 0,
        group: 8,
    };

    /// The convolution's shapes, best first where several fit (`fits_conv`).
    pub const CONV: [CoopTile; 4] = [
        CoopTile::DEEP,
        CoopTile::DEFAULT,
        CoopTile::CONV64,
        // 256x64 from four subgroups of 64x64.
        CoopTile {
            wm: 4,
            wn: 1,
            tm: 4,
            tn: 4,
            bk: 32,
            depth: 0,
            group: 8,
        },
    ];

    /// The convolution's tile for `og` output channels of `cg` input channels:
    /// `KILN_CONV_TILE=wm,wn,tm,tn,bk,depth,group` where set (and fitting), else the first of
    /// `CONV` that fits.
    pub fn for_conv(og: usize, cg: usize, shared: u32) -> Option<CoopTile> {
        static OVERRIDE: std::sync::OnceLock<Option<CoopTile>> = std::sync::OnceLock::new();
        let forced = OVERRIDE.get_or_init(|| Self::parse(&std::env::var("KILN_CONV_TILE").ok()?));
        forced
            .iter()
            .chain(CoopTile::CONV.iter())
            .find(|t| t.fits_conv(og, cg) && t.valid(shared))
            .copied()
    }

    /// The convolution's forward pass on this tile (`ConvCoop`): A gathered from the NHWC
    /// input, B the weight as `[o][tap][ci]` (transposed: `b_t`), C NCHW (flags bit 1) or
    /// `[pixel][o]` (NHWC).
    /// With `flip`, the weight's taps are read in reverse.
    pub fn conv_source(&self, flip: bool) -> String {
        let tap = if flip {
            "p.taps - 1u - k / p.cg"
        } else {
            "k / p.cg"
        };
        // The bias binding, the gather, and the bias reads shared with the product's epilogue.
        let extra = format!("{BIAS_BINDING}{}\n{BIAS8}", GATHER.replace("{{TAP}}", tap));
        self.generate(LAYOUT, CoopKind::Conv { flip }, Some([PARAMS, &extra]))
    }

    /// The convolution kernel's name, as the profiler prints it.
    pub fn conv_name(&self, flip: bool) -> String {
        format!(
            "conv_coop_f16_{}x{}_{}x{}_k{}_d{}_g{}{}",
            self.wm,
            self.wn,
            self.tm,
            self.tn,
            self.bk,
            self.depth,
            self.group,
            if flip { "_flip" } else { "" }
        )
    }

    /// Whether the convolution kernel takes `og` output channels of `cg` input channels each
    /// (K = taps x cg, walked in slices that never cross a tap).
    pub fn fits_conv(&self, og: usize, cg: usize) -> bool {
        og.is_multiple_of(self.block_n() as usize) && cg.is_multiple_of(self.k_step() as usize)
    }
}

/// The weight gradient's operands: A (the output's gradient, `[pixel][o]`) and B (the gathered
/// input, `[pixel][tap, c]`), both staged K-major.
const WGRAD_LAYOUT: CoopLayout = CoopLayout {
    a_t: true,
    b_t: false,
};

/// The weight gradient's immediates: the product's first eleven (`m` and `n` padded to whole
/// tiles, `k` the pixels of one split, `sab` its stride in A), the real `m` (output channels),
/// `n` (taps x input channels) and pixel count, then the geometry.
const WGRAD_PARAMS: &str = "struct Params {\n    m: u32,\n    n: u32,\n    k: u32,\n    \
    batch: u32,\n    off_a: u32,\n    sab: u32,\n    lda: u32,\n    off_b: u32,\n    sbb: u32,\n    \
    ldb: u32,\n    off_c: u32,\n    k_total: u32,\n    m_real: u32,\n    n_real: u32,\n    \
    h: u32,\n    w: u32,\n    c8: u32,\n    oh: u32,\n    ow: u32,\n    kw: u32,\n    sh: u32,\n    \
    sw: u32,\n    ph: u32,\n    pw: u32,\n    dh: u32,\n    dw: u32,\n    cg: u32,\n    \
    pad0: u32,\n}\n";

/// The weight gradient's loads: `wgrad_a` one vector of the output's gradient (zeros past the
/// last pixel or channel), `wgrad_col` a column's tap and channel vector (found once),
/// `wgrad_b` the eight channels of the input under that tap for one output pixel (zeros in the
/// padding, past the last pixel or column).
const WGRAD_GATHER: &str = "fn wgrad_a(at: u32, k: u32, ok: bool) -> vec4<u32> {\n    \
    if ok && k < p.k_total {\n        return a[at];\n    }\n    return vec4<u32>();\n}\n\n\
struct Col {\n    dy: i32,\n    dx: i32,\n    v: u32,\n    ok: bool,\n}\n\n\
fn wgrad_col(n: u32) -> Col {\n    \
    let tap = n / p.cg;\n    \
    return Col(i32((tap / p.kw) * p.dh) - i32(p.ph), i32((tap % p.kw) * p.dw) - i32(p.pw), \
    (n % p.cg) / 8u, n < p.n_real);\n}\n\n\
fn wgrad_b(k: u32, col: Col) -> vec4<u32> {\n    \
    let ohw = p.oh * p.ow;\n    \
    let q = k % ohw;\n    \
    let ih = i32((q / p.ow) * p.sh) + col.dy;\n    \
    let iw = i32((q % p.ow) * p.sw) + col.dx;\n    \
    if col.ok && k < p.k_total && ih >= 0 && iw >= 0 && ih < i32(p.h) && iw < i32(p.w) {\n        \
    return b[p.off_b / 8u + ((k / ohw) * p.h * p.w + u32(ih) * p.w + u32(iw)) * p.c8 + col.v];\n    }\n    \
    return vec4<u32>();\n}\n";

impl CoopTile {
    /// The weight gradient's shapes, larger first: 128x128 (the product's default), 128x64,
    /// 64x128 and 64x64 (rows the output channels, columns the taps times the input channels).
    pub const WGRAD: [CoopTile; 4] = [
        CoopTile::DEFAULT,
        CoopTile::wgrad(4, 1, 2, 4),
        CoopTile::wgrad(2, 2, 2, 4),
        CoopTile::wgrad(2, 2, 2, 2),
    ];

    const fn wgrad(wm: u32, wn: u32, tm: u32, tn: u32) -> CoopTile {
        CoopTile {
            wm,
            wn,
            tm,
            tn,
            bk: 32,
            depth: 0,
            group: 8,
        }
    }

    /// The weight gradient's tile for `o` output channels and `n` columns (taps times input
    /// channels): `KILN_WGRAD_TILE` where set (and valid), else the one that pads the product
    /// least, the larger on a tie. ResNet's 3x3 layer over 64 channels has 576 columns, which
    /// 128-wide tiles pad to 640: on the H200 (b32 56x56 f16, forward + both gradients) the
    /// 64x128 tile ran 59.5 TFLOP/s and the 64x64 66.9 (docs/lab/convolution.md).
    pub fn for_wgrad(o: usize, n: usize, shared: u32) -> Option<CoopTile> {
        static OVERRIDE: std::sync::OnceLock<Option<CoopTile>> = std::sync::OnceLock::new();
        let forced = OVERRIDE.get_or_init(|| Self::parse(&std::env::var("KILN_WGRAD_TILE").ok()?));
        if let Some(t) = forced.filter(|t| t.valid(shared)) {
            return Some(t);
        }
        let padded = |t: &CoopTile| {
            o.next_multiple_of(t.block_m() as usize) * n.next_multiple_of(t.block_n() as usize)
        };
        // `min_by_key` keeps the first of equals: the larger tile.
        CoopTile::WGRAD
            .into_iter()
            .filter(|t| t.valid(shared))
            .min_by_key(padded)
    }

    /// The convolution's weight gradient on this tile (`ConvCoopWgrad`): A the output's
    /// gradient NHWC, B gathered from the NHWC input, one f32 partial per K split.
    pub fn wgrad_source(&self) -> String {
        self.generate(
            WGRAD_LAYOUT,
            CoopKind::ConvWgrad,
            Some([WGRAD_PARAMS, WGRAD_GATHER]),
        )
    }

    /// The weight gradient kernel's name, as the profiler prints it.
    pub fn wgrad_name(&self) -> String {
        format!(
            "conv_coop_wgrad_f16_{}x{}_{}x{}_k{}_d{}_g{}",
            self.wm, self.wn, self.tm, self.tn, self.bk, self.depth, self.group
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weight_gradients_tile_pads_least() {
        let tile = |o, n| CoopTile::for_wgrad(o, n, 48 * 1024).map(|t| (t.block_m(), t.block_n()));
        // ResNet's 3x3 over 64 channels: 576 columns, which 128-wide tiles pad to 640.
        assert_eq!(tile(64, 576), Some((64, 64)));
        assert_eq!(tile(128, 1152), Some((128, 128)));
        assert_eq!(tile(256, 64), Some((128, 64)));
        assert_eq!(tile(64, 128), Some((64, 128)));
        for t in CoopTile::WGRAD {
            assert!(t.valid(48 * 1024), "{t:?}");
        }
    }
}
