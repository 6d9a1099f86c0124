//! The f16 tensor-core matmul's WGSL, generated per tile shape (`CoopTile`).
//!
//! A workgroup of `wm x wn` subgroups (32 invocations each: the kernel is offered only where
//! subgroups have exactly 32) computes a `(wm*tm*16) x (wn*tn*16)` block of C; each subgroup a
//! `tm x tn` grid of 16x16 f32 accumulators. The K loop walks slices `bk` deep: every invocation
//! loads its share of the A and B slices from memory as 16-byte vectors (eight f16), stores them
//! into workgroup memory, and the subgroups read their 16x16 operands from there with
//! `coopLoadT` or `coopLoad`, as the operand's layout wants (`CoopLayout`; the driver turns
//! them into shared-memory matrix loads). The next slice is loaded
//! into registers while the current one is multiplied (`depth` 0 and 1; 2 loads two ahead), into
//! one shared buffer with two barriers per slice (`depth` 0) or two with one. The f32
//! accumulators leave through workgroup memory, rounded to f16 in the kernel: C is written
//! once, as f16, with no f32 temporary (as cuBLAS's f16 GEMM, whose output PyTorch allocates).
//!
//! What the H100 said (f16 4096, BENCHMARKS.md): operands loaded straight from global memory
//! (the first kernel) ran 72.7 TFLOP/s; naga's runtime bounds checks cost 40% (80 -> 133), so
//! the module is trusted (every access is in range by `coop_tile`'s conditions); the multiplies
//! alone reach 386 while loads, shared stores and barriers alone run at 167, so the kernel is
//! bound by its loads: slices of 32-64 f16 (64-128 contiguous bytes per row of A) beat slices of
//! 16 (32 bytes) by 40%, whatever the prefetch depth or the tile order.
//!
//! Workgroup memory is `array<vec4<f16>>`: `coopLoadT` wants a pointer to a scalar or vector
//! of the matrix's type. Loading f16 matrices from `array<u32>` (the load reinterprets, as
//! SPIR-V allows) passed naga but lost the device on NVIDIA's driver 580. Rows are padded by 16
//! bytes so that the rows of a 16x16 load fall in different banks. Global memory is read as
//! `vec4<u32>` and unpacked (`mat2x4<f16>` loads were 7% slower).
//!
//! naga 30: coop store addresses and strides must be `let`s, or its SPIR-V writer panics on an
//! expression it never emitted (spec/wgpu-notes.md, section 2).

use super::coop_gen::{CoopKind, Gen};

/// How the operands lie in memory: `a_t`, A is stored transposed (`[k][m]`, as `g^T` in a
/// weight gradient); `b_t`, B is stored transposed (`[n][k]`, as `W^T` in `x @ W^T`: every
/// `linear`). Each operand's slice is staged in workgroup memory in its own orientation and
/// read back with the matching cooperative load (row-major `coopLoadT` or column-major
/// `coopLoad`), so no layout costs a transpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CoopLayout {
    /// A is staged transposed (k-major).
    pub a_t: bool,
    /// B is staged transposed (n-major).
    pub b_t: bool,
}

impl CoopLayout {
    /// The four layouts.
    pub const ALL: [CoopLayout; 4] = [
        CoopLayout {
            a_t: false,
            b_t: false,
        },
        CoopLayout {
            a_t: false,
            b_t: true,
        },
        CoopLayout {
            a_t: true,
            b_t: false,
        },
        CoopLayout {
            a_t: true,
            b_t: true,
        },
    ];
}

/// One operand's slice (`bk` deep, `d` wide) as staged: `kc` (k contiguous) means rows along
/// m or n of `bk` values each, else rows along k of `d` values each.
#[derive(Clone, Copy)]
pub(super) struct Staged {
    pub(super) d: u32,
    pub(super) bk: u32,
    pub(super) kc: bool,
}

impl Staged {
    pub(super) fn rows(self) -> u32 {
        if self.kc {
            self.d
        } else {
            self.bk
        }
    }

    /// 16-byte vectors per row in memory.
    pub(super) fn vecs(self) -> u32 {
        if self.kc {
            self.bk / 8
        } else {
            self.d / 8
        }
    }

    /// Words per shared row: the row padded by 16 bytes, so that the rows of a 16x16 load
    /// fall in different banks.
    pub(super) fn row_words(self) -> u32 {
        self.vecs() * 4 + PAD
    }

    pub(super) fn words(self) -> u32 {
        self.rows() * self.row_words()
    }
}

/// A tile shape for the tensor-core kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    /// Subgroups along M and N.
    pub wm: u32,
    /// Subgroups along N.
    pub wn: u32,
    /// 16x16 tiles per subgroup along M and N.
    pub tm: u32,
    /// 16x16 tiles per subgroup along N.
    pub tn: u32,
    /// Depth of a K slice (a multiple of 16).
    pub bk: u32,
    /// Slices loaded ahead into registers (1 or 2; 2 needs K in steps of two slices), with
    /// two shared buffers; 0: one slice ahead, one shared buffer, two barriers per slice.
    pub depth: u32,
    /// Rows of tiles walked together (grouped order, for L2 reuse of B); 0 walks row by row.
    pub group: u32,
}

pub(super) const MATMUL_PARAMS: &str = "struct Params {\n    m: u32,\n    n: u32,\n    k: u32,\n    \
    batch: u32,\n    off_a: u32,\n    sab: u32,\n    lda: u32,\n    off_b: u32,\n    sbb: u32,\n    \
    ldb: u32,\n    flags: u32,\n    off_bias: u32,\n}\n";

/// The bias binding of the product and of the convolution (`conv_coop.rs`), after the
/// operands'.
pub(super) const BIAS_BINDING: &str =
    "@group(0) @binding(3) var<storage, read_write> bias: array<vec4<u32>>;\n\n";

/// `bias8(col)`: the eight f16 bias values from column `col` (a multiple of 8, at an offset of
/// whole 16-byte vectors) as f32, zeros where flags bit 0 is clear; added to the f32 sums
/// before the rounding, as cuBLAS's epilogue does (`addmm`, a convolution's bias).
pub(super) const BIAS8: &str = "fn bias8(col: u32) -> array<f32, 8> {\n    \
    if (p.flags & 1u) == 0u {\n        return array<f32, 8>();\n    }\n    \
    let v = bias[(p.off_bias + col) / 8u];\n    \
    let u0 = unpack2x16float(v.x);\n    \
    let u1 = unpack2x16float(v.y);\n    \
    let u2 = unpack2x16float(v.z);\n    \
    let u3 = unpack2x16float(v.w);\n    \
    return array<f32, 8>(u0.x, u0.y, u1.x, u1.y, u2.x, u2.y, u3.x, u3.y);\n}\n";

/// Padding of a shared row, in words (16 bytes).
const PAD: u32 = 4;

/// Row stride of a subgroup's f32 epilogue patch: 16 columns padded by four, so that the rows
/// of a 16x16 store fall in different banks.
pub(super) const PATCH_ROW: u32 = 20;

impl CoopTile {
    /// The shape kiln uses unless `KILN_COOP_TILE=wm,wn,tm,tn,bk[,depth,group]` says otherwise:
    /// the fastest measured on the H100 (f16 4096: 289-294 TFLOP/s; BENCHMARKS.md lists the
    /// rest): 128x128 per workgroup, four subgroups of 64x64, K slices of 32 in one shared
    /// buffer, tiles walked in groups of eight rows. Two such workgroups share an SM (24 KiB of
    /// workgroup memory each), so one's barriers overlap the other's multiplies; the 128x256
    /// shape with eight subgroups fills an SM alone (284-287).
    pub const DEFAULT: CoopTile = CoopTile {
        wm: 2,
        wn: 2,
        tm: 4,
        tn: 4,
        bk: 32,
        depth: 0,
        group: 8,
    };

    /// Shapes the registry validates: the default and others measured against it (f16 4096,
    /// H100, with the in-kernel f16 epilogue).
    pub const ALL: [CoopTile; 6] = [
        CoopTile::DEFAULT,
        CoopTile::DEEP,
        CoopTile::TALL,
        // 128x256, eight subgroups (284-287).
        CoopTile {
            wm: 2,
            wn: 4,
            tm: 4,
            tn: 4,
            bk: 32,
            depth: 0,
            group: 8,
        },
        // Two shared buffers, one slice ahead (100), and two slices ahead (135).
        CoopTile {
            wm: 2,
            wn: 2,
            tm: 4,
            tn: 4,
            bk: 16,
            depth: 1,
            group: 8,
        },
        CoopTile {
            wm: 2,
            wn: 2,
            tm: 4,
            tn: 4,
            bk: 16,
            depth: 2,
            group: 8,
        },
    ];

    /// 128x128 per workgroup from eight subgroups of 64x32, K slices of 64: the fastest where
    /// only B is stored transposed (`x @ W^T`: 270 TFLOP/s on the H100, against 154 for the
    /// default), needing K in steps of 64.
    pub const DEEP: CoopTile = CoopTile {
        wm: 2,
        wn: 4,
        tm: 4,
        tn: 2,
        bk: 64,
        depth: 0,
        group: 8,
    };

    /// 256x128 per workgroup (eight subgroups of 64x64): next for `x @ W^T` (257).
    pub const TALL: CoopTile = CoopTile {
        wm: 4,
        wn: 2,
        tm: 4,
        tn: 4,
        bk: 32,
        depth: 0,
        group: 8,
    };

    /// The shapes to try for a product in `layout` with `tiles` 128x128 output tiles, best
    /// first: `KILN_COOP_TILE` alone where set (read once); else the layout's fastest on the
    /// H100 (f16 4096, BENCHMARKS.md), then the default (whose 128x128 tiles and K slices of 32
    /// fit more products). With both operands row-major and fewer than 256 tiles (under two
    /// workgroups per SM of a large GPU: an MLP's `g @ W` at batch 512), the eight-subgroup
    /// tile first: one workgroup keeps an SM busy where the default's four subgroups count on
    /// a second (H100, 512x4096x4096: 117 -> 78 us).
    pub fn for_layout(layout: CoopLayout, tiles: usize) -> &'static [CoopTile] {
        static OVERRIDE: std::sync::OnceLock<Option<[CoopTile; 1]>> = std::sync::OnceLock::new();
        if let Some(t) = OVERRIDE.get_or_init(|| Self::from_env().map(|t| [t])) {
            return t;
        }
        match (layout.a_t, layout.b_t) {
            (false, true) => &[CoopTile::DEEP, CoopTile::TALL, CoopTile::DEFAULT],
            (false, false) if tiles < 256 => &[CoopTile::DEEP, CoopTile::DEFAULT],
            _ => &[CoopTile::DEFAULT],
        }
    }

    /// `KILN_COOP_TILE=wm,wn,tm,tn,bk[,depth,group]`, where set and valid.
    fn from_env() -> Option<CoopTile> {
        Self::parse(&std::env::var("KILN_COOP_TILE").ok()?)
    }

    /// `wm,wn,tm,tn,bk[,depth,group]`, where valid.
    pub(super) fn parse(s: &str) -> Option<CoopTile> {
        let parsed = Some(s).and_then(|s| {
            let v: Vec<u32> = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            match v[..] {
                [wm, wn, tm, tn, bk] => Some(CoopTile {
                    wm,
                    wn,
                    tm,
                    tn,
                    bk,
                    depth: 1,
                    group: 0,
                }),
                [wm, wn, tm, tn, bk, depth, group] => Some(CoopTile {
                    wm,
                    wn,
                    tm,
                    tn,
                    bk,
                    depth,
                    group,
                }),
                _ => None,
            }
        });
        parsed.filter(|t| t.valid(48 * 1024))
    }

    /// Invocations per workgroup (32 per subgroup).
    pub fn threads(&self) -> u32 {
        self.wm * self.wn * 32
    }

    /// Rows of output a workgroup computes.
    pub fn block_m(&self) -> u32 {
        self.wm * self.tm * 16
    }

    /// Columns of output a workgroup computes.
    pub fn block_n(&self) -> u32 {
        self.wn * self.tn * 16
    }

    /// K must be a multiple of this.
    pub fn k_step(&self) -> u32 {
        self.bk * self.depth.max(1)
    }

    /// Shared buffers of each operand.
    pub(super) fn buffers(&self) -> u32 {
        if self.depth == 0 {
            1
        } else {
            2
        }
    }

    pub(super) fn staged(&self, layout: CoopLayout) -> (Staged, Staged) {
        let bk = self.bk;
        (
            Staged {
                d: self.block_m(),
                bk,
                kc: !layout.a_t,
            },
            Staged {
                d: self.block_n(),
                bk,
                kc: layout.b_t,
            },
        )
    }

    /// Bytes of workgroup memory in the layout that needs the most: all buffers of A and B,
    /// and the epilogue's patches.
    pub fn shared_bytes(&self) -> u32 {
        CoopLayout::ALL
            .iter()
            .map(|&l| {
                let (a, b) = self.staged(l);
                self.buffers() * 4 * (a.words() + b.words())
            })
            .max()
            .unwrap_or(0)
            + 4 * self.wm * self.wn * 16 * PATCH_ROW
    }

    /// Vector loads per invocation per slice, for A and for B.
    pub(super) fn loads(&self) -> (u32, u32) {
        (
            self.block_m() * self.bk / 8 / self.threads(),
            self.bk * self.block_n() / 8 / self.threads(),
        )
    }

    /// Whether the shape is well formed and fits `shared_limit` bytes of workgroup memory.
    pub fn valid(&self, shared_limit: u32) -> bool {
        let t = self.threads();
        self.wm > 0
            && self.wn > 0
            && self.tm > 0
            && self.tn > 0
            && self.bk >= 16
            && self.bk.is_multiple_of(16)
            && self.depth <= 2
            && t <= 1024
            && (self.block_m() * self.bk / 8).is_multiple_of(t)
            && (self.bk * self.block_n() / 8).is_multiple_of(t)
            && self.loads().0 > 0
            && self.loads().1 > 0
            && self.shared_bytes() <= shared_limit
    }

    /// The kernel's name for `layout`, as the profiler and tuner print it.
    pub fn name(&self, layout: CoopLayout) -> String {
        format!(
            "matmul_coop_f16_{}x{}_{}x{}_k{}_d{}_g{}{}{}",
            self.wm,
            self.wn,
            self.tm,
            self.tn,
            self.bk,
            self.depth,
            self.group,
            if layout.a_t { "_at" } else { "" },
            if layout.b_t { "_bt" } else { "" }
        )
    }

    /// The WGSL.
    pub fn source(&self, layout: CoopLayout) -> String {
        self.generate(layout, CoopKind::Product, None)
    }

    /// The kernel whose workgroup layer z multiplies K slice z into an f32 partial (the
    /// batch's strides step through K; no bias).
    pub fn partials_source(&self, layout: CoopLayout) -> String {
        self.generate(layout, CoopKind::Partials, None)
    }

    /// The kernel for `layout` of `kind` (`coop_gen.rs`), with `header_extra`: the WGSL of its
    /// immediates (in place of the product's) and of its bindings and functions after the
    /// operands' (a convolution's gather there: with the gather declared before them, the same
    /// module ran the 3x3 64->64 convolution at 57 TFLOP/s instead of 81 on the H100).
    pub(super) fn generate(
        &self,
        layout: CoopLayout,
        kind: CoopKind,
        header_extra: Option<[&str; 2]>,
    ) -> String {
        Gen::new(*self, layout, kind).module(header_extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_fit_the_h100s_shared_memory() {
        for t in CoopTile::ALL {
            assert!(t.valid(48 * 1024), "{t:?}: {} bytes", t.shared_bytes());
        }
        // The largest layout: both operands staged as 128 (or 256) rows of bk values.
        assert_eq!(
            CoopTile::DEFAULT.shared_bytes(),
            4 * (128 * 20 + 128 * 20) + 4 * 4 * 16 * 20
        );
        assert_eq!(
            CoopTile::ALL[3].shared_bytes(),
            4 * (128 * 20 + 256 * 20) + 4 * 8 * 16 * 20
        );
        assert_eq!(
            CoopTile::ALL[4].shared_bytes(),
            2 * 4 * (128 * 12 + 128 * 12) + 4 * 4 * 16 * 20
        );
        assert!(!CoopTile {
            bk: 24,
            ..CoopTile::DEFAULT
        }
        .valid(48 * 1024));
    }
}
