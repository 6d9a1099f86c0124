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

use std::fmt::Write;

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
struct Staged {
    d: u32,
    bk: u32,
    kc: bool,
}

impl Staged {
    fn rows(self) -> u32 {
        if self.kc {
            self.d
        } else {
            self.bk
        }
    }

    /// 16-byte vectors per row in memory.
    fn vecs(self) -> u32 {
        if self.kc {
            self.bk / 8
        } else {
            self.d / 8
        }
    }

    /// Words per shared row: the row padded by 16 bytes, so that the rows of a 16x16 load
    /// fall in different banks.
    fn row_words(self) -> u32 {
        self.vecs() * 4 + PAD
    }

    fn words(self) -> u32 {
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

const MATMUL_PARAMS: &str = "struct Params {\n    m: u32,\n    n: u32,\n    k: u32,\n    \
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
const PATCH_ROW: u32 = 20;

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
    fn buffers(&self) -> u32 {
        if self.depth == 0 {
            1
        } else {
            2
        }
    }

    fn staged(&self, layout: CoopLayout) -> (Staged, Staged) {
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
    fn loads(&self) -> (u32, u32) {
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
        self.generate(layout, None)
    }

    /// The kernel for `layout`; a convolution's (`conv_coop.rs`) with `conv`, the WGSL of its
    /// immediates (in place of the product's) and of its bias binding and gather (after the
    /// operands' bindings: with the gather declared before them, the same module ran the 3x3
    /// 64->64 convolution at 57 TFLOP/s instead of 81 on the H100).
    pub(super) fn generate(&self, layout: CoopLayout, conv: Option<[&str; 2]>) -> String {
        let product_extra = format!("{BIAS_BINDING}{BIAS8}");
        let [header, extra] = conv.unwrap_or([MATMUL_PARAMS, &product_extra]);
        let conv = conv.is_some();
        let (t, bm, bn, bk) = (self.threads(), self.block_m(), self.block_n(), self.bk);
        let (sta, stb) = self.staged(layout);
        let (ra, rb) = (sta.row_words(), stb.row_words());
        let (wa, wb) = (sta.words(), stb.words());
        let (la, lb) = self.loads();
        let (ca, cb) = (sta.vecs(), stb.vecs());
        // Offsets and strides are counted in words (two halves); the shared arrays hold
        // `vec4<f16>`s (two words), so an index or stride there is half the word count.
        let at = |w: &str| format!("({w}) / 2u");
        let mut s = String::new();
        let _ = write!(
            s,
            "// Generated by src/kernels/matmul_coop.rs: {name}.\n\
             enable f16;\n\
             enable wgpu_cooperative_matrix;\n\n\
             {header}\n\
             var<immediate> p: Params;\n\n\
             @group(0) @binding(0) var<storage, read_write> a: array<vec4<u32>>;\n\
             @group(0) @binding(1) var<storage, read_write> b: array<vec4<u32>>;\n\
             @group(0) @binding(2) var<storage, read_write> c: array<vec4<u32>>;\n\
             {extra}\n\
             var<workgroup> sa: array<vec4<f16>, {sa}>;\n\
             var<workgroup> sb: array<vec4<f16>, {sb}>;\n\
             var<workgroup> sc: array<f32, {sc}>;\n\n\
             @compute @workgroup_size({t})\n\
             fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,\n        \
             @builtin(local_invocation_index) li: u32) {{\n    \
             let bt = wg.z;\n    \
             let lda8 = p.lda / 8u;\n    \
             let ldb8 = p.ldb / 8u;\n    \
             let ldc = p.n;\n    \
             {origin}\n    \
             let a_base = (p.off_a + bt * p.sab) / 8u + {a_origin};\n    \
             let b_base = (p.off_b + bt * p.sbb) / 8u + {b_origin};\n    \
             let sg_m = (sg / {wn}u) * {sm}u;\n    \
             let sg_n = (sg % {wn}u) * {sn}u;\n",
            name = if conv {
                self.conv_name()
            } else {
                self.name(layout)
            },
            // Tiles along M rounded up (a convolution's pixels need not fill the last).
            origin = if self.group == 0 {
                format!("let m0 = wg.y * {bm}u;\n    let n0 = wg.x * {bn}u;")
            } else {
                format!(
                    "let tiles_n = p.n / {bn}u;\n    \
                     let id = wg.y * tiles_n + wg.x;\n    \
                     let width = {g}u * tiles_n;\n    \
                     let first = (id / width) * {g}u;\n    \
                     let gm = min((p.m + {bm1}u) / {bm}u - first, {g}u);\n    \
                     let m0 = (first + (id % width) % gm) * {bm}u;\n    \
                     let n0 = ((id % width) / gm) * {bn}u;",
                    g = self.group,
                    bm1 = bm - 1,
                )
            },
            sa = self.buffers() * wa / 2,
            sb = self.buffers() * wb / 2,
            sc = self.wm * self.wn * 16 * PATCH_ROW,
            wn = self.wn,
            a_origin = if sta.kc { "m0 * lda8" } else { "m0 / 8u" },
            b_origin = if stb.kc { "n0 * ldb8" } else { "n0 / 8u" },
            sm = self.tm * 16,
            sn = self.tn * 16,
        );
        // Where each invocation's loads come from (vectors relative to the slice start) and go
        // to (words in a shared buffer): each operand's slice is rows of ca (cb) vectors.
        // A k-contiguous operand with four vectors (64 bytes) per row is loaded four lanes
        // to a row, and a 16-lane phase of the shared stores then covers four rows. Taking
        // rows 0, 4, 8, 12 (then 1, 5, 9, 13, ...) of each 16-row group instead of rows 0-3
        // spreads a phase's 8-byte stores over twice the banks (2-way conflicts instead of
        // 3-way at the 80-byte row stride) while a warp still reads eight 64-byte rows: f16
        // A @ B 4096 went from 291 to 305 TFLOP/s on the H100.
        for (x, count, vecs, row, kc) in [("a", la, ca, ra, sta.kc), ("b", lb, cb, rb, stb.kc)] {
            for i in 0..count {
                let q = format!("(li + {}u)", i * t);
                let r = if kc && vecs == 4 {
                    format!("(({q} / 64u) * 16u + (({q} / 4u) % 4u) * 4u + (({q} / 16u) % 4u))")
                } else {
                    format!("({q} / {vecs}u)")
                };
                let _ = writeln!(
                    s,
                    "    let g{x}{i} = {r} * ld{x}8 + {q} % {vecs}u;\n    \
                     let s{x}{i} = {r} * {row}u + ({q} % {vecs}u) * 4u;"
                );
                if conv && x == "a" {
                    let _ = writeln!(s, "    let pa{i} = conv_row(m0 + {r}, {q} % {vecs}u);");
                }
            }
        }
        for i in 0..self.tm {
            for j in 0..self.tn {
                let _ = writeln!(s, "    var c{i}_{j} = coop_mat16x16<f32, C>();");
            }
        }
        let loads = |s: &mut String, k: &str, set: &str, decl: &str, indent: &str| {
            for (x, count, kc) in [("a", la, sta.kc), ("b", lb, stb.kc)] {
                // The slice's first vector: k / 8 along a row, or k rows down.
                let at_k = if kc {
                    format!("{k} / 8u")
                } else {
                    format!("{k} * ld{x}8")
                };
                if conv && x == "a" {
                    let _ = writeln!(s, "{indent}let sl{set} = conv_slice({k});");
                    for i in 0..count {
                        let _ = writeln!(s, "{indent}{decl}ra{set}{i} = gather(pa{i}, sl{set});");
                    }
                    continue;
                }
                for i in 0..count {
                    let _ = writeln!(
                        s,
                        "{indent}{decl}r{x}{set}{i} = {x}[{x}_base + {at_k} + g{x}{i}];"
                    );
                }
            }
        };
        let stores = |s: &mut String, buf: &str, set: &str, indent: &str| {
            for (n, count, words) in [("a", la, wa), ("b", lb, wb)] {
                for i in 0..count {
                    let w = at(&format!("{buf} * {words}u + s{n}{i}"));
                    let _ = writeln!(s, "{indent}{{\n{indent}    let w = {w};");
                    let half = |q: usize| {
                        let c = ["x", "y", "z", "w"][q];
                        format!("vec2<f16>(unpack2x16float(r{n}{set}{i}.{c}))")
                    };
                    let _ = writeln!(
                        s,
                        "{indent}    s{n}[w] = vec4<f16>({}, {});\n\
                         {indent}    s{n}[w + 1u] = vec4<f16>({}, {});",
                        half(0),
                        half(1),
                        half(2),
                        half(3)
                    );
                    let _ = writeln!(s, "{indent}}}");
                }
            }
        };
        // The multiplies of the slice in shared buffer `cur` (a WGSL expression).
        let compute = |s: &mut String, cur: &str| {
            for kk in 0..bk / 16 {
                // The 16x16 operand tiles of this k step: A's along m, B's along n. A staged
                // tile is row-major where its rows run along the matrix's rows (A's when k
                // is contiguous, B's when not).
                for (x, role, count, origin, st, row, words, along_rows) in [
                    ("a", "A", self.tm, "sg_m", sta, ra, wa, sta.kc),
                    ("b", "B", self.tn, "sg_n", stb, rb, wb, !stb.kc),
                ] {
                    for i in 0..count {
                        let off = if st.kc {
                            format!("({origin} + {}u) * {row}u + {}u", i * 16, kk * 8)
                        } else {
                            format!("{}u * {row}u + ({origin} + {}u) / 2u", kk * 16, i * 16)
                        };
                        let _ = writeln!(
                            s,
                            "        let p{x}{kk}_{i} = {cur} * {words}u + {off};\n        \
                             let {x}{kk}_{i} = {load}<coop_mat16x16<f16, {role}>>(&s{x}[{ix}], {rf}u);",
                            ix = at(&format!("p{x}{kk}_{i}")),
                            rf = row / 2,
                            load = if along_rows { "coopLoadT" } else { "coopLoad" },
                        );
                    }
                }
                for i in 0..self.tm {
                    for j in 0..self.tn {
                        let _ = writeln!(
                            s,
                            "        c{i}_{j} = coopMultiplyAdd(a{kk}_{i}, b{kk}_{j}, c{i}_{j});"
                        );
                    }
                }
            }
        };
        // Stores of register set `set` into buffer `buf`, where a next slice exists, and the
        // slice's barrier.
        let finish = |s: &mut String, more: &str, buf: &str, set: &str| {
            let _ = writeln!(s, "        if {more} {{");
            stores(s, buf, set, "            ");
            let _ = writeln!(s, "        }}\n        workgroupBarrier();");
        };
        // Prologue: slice 0 into buffer 0 (and slice 1 into registers).
        if self.depth == 2 {
            for i in 0..la {
                let _ = writeln!(s, "    var ra0{i}: vec4<u32>;\n    var ra1{i}: vec4<u32>;");
            }
            for i in 0..lb {
                let _ = writeln!(s, "    var rb0{i}: vec4<u32>;\n    var rb1{i}: vec4<u32>;");
            }
            loads(&mut s, "0u", "0", "", "    ");
            stores(&mut s, "0u", "0", "    ");
            loads(&mut s, &format!("{bk}u"), "1", "", "    ");
            let _ = writeln!(s, "    workgroupBarrier();");
            let _ = writeln!(s, "    for (var k0 = 0u; k0 < p.k; k0 += {}u) {{", 2 * bk);
            for par in 0..2u32 {
                // Slice ks: load slice ks + 2 into the set it came from, multiply, store slice
                // ks + 1 (loaded a slice ago) into the other buffer.
                let _ = writeln!(
                    s,
                    "        let ks{par} = k0 + {o}u;\n        \
                     let more{par} = ks{par} + {bk}u < p.k;\n        \
                     let kl{par} = select(ks{par}, ks{par} + {bk2}u, ks{par} + {bk2}u < p.k);",
                    o = par * bk,
                    bk2 = 2 * bk
                );
                let _ = writeln!(s, "        {{");
                loads(
                    &mut s,
                    &format!("kl{par}"),
                    &par.to_string(),
                    "",
                    "        ",
                );
                compute(&mut s, &format!("{par}u"));
                let _ = writeln!(s, "        }}");
                finish(
                    &mut s,
                    &format!("more{par}"),
                    &format!("{}u", 1 - par),
                    &(1 - par).to_string(),
                );
            }
            let _ = writeln!(s, "    }}");
        } else {
            let _ = writeln!(s, "    {{");
            loads(&mut s, "0u", "", "let ", "        ");
            stores(&mut s, "0u", "", "        ");
            let _ = writeln!(s, "    }}\n    workgroupBarrier();");
            let _ = writeln!(
                s,
                "    for (var k0 = 0u; k0 < p.k; k0 += {bk}u) {{\n        \
                 let cur = (k0 / {bk}u) % 2u;\n        \
                 let nxt = 1u - cur;\n        \
                 let more = k0 + {bk}u < p.k;\n        \
                 let kn = select(k0, k0 + {bk}u, more);"
            );
            // The next slice into registers (a repeat of the current one on the last slice:
            // the loads stay unconditional, the stores are skipped).
            loads(&mut s, "kn", "", "let ", "        ");
            if self.depth == 0 {
                compute(&mut s, "0u");
                let _ = writeln!(s, "        workgroupBarrier();");
                finish(&mut s, "more", "0u", "");
            } else {
                compute(&mut s, "cur");
                finish(&mut s, "more", "nxt", "");
            }
            let _ = writeln!(s, "    }}");
        }

        // Epilogue: each 16x16 f32 accumulator goes through the subgroup's own patch of
        // workgroup memory (cooperative matrices have no f32 -> f16 conversion in naga 30), and
        // each invocation packs eight of its values to f16 and stores them as one 16-byte
        // vector: half a row of the tile (row = lane / 2). Barriers between a tile's store and
        // its reads (WGSL has no subgroup-scope barrier) and before the next tile's store.
        // Patches of a whole row of tiles (fewer barriers) were measured slower: the 128x128
        // shape fell from 292 to 173 TFLOP/s with two tiles per patch.
        let _ = writeln!(
            s,
            "    let lane = li % 32u;\n    \
             let own = sg * {patch}u;\n    \
             let mine = own + (lane / 2u) * {PATCH_ROW}u + (lane % 2u) * 8u;\n    \
             let o = (bt * p.m + m0 + sg_m + lane / 2u) * ldc + n0 + sg_n + (lane % 2u) * 8u;",
            patch = 16 * PATCH_ROW
        );
        if conv {
            s.push_str("    let nchw = (p.flags & 2u) != 0u;\n    let ohw = p.oh * p.ow;\n");
        }
        // A convolution's C may end inside a tile (rows past M are skipped) and lies at an
        // offset; its bias (flags bit 0) is added to the f32 sums before the rounding. With
        // flags bit 1 (every image's pixels a whole number of 8-runs), C is NCHW: the patch is
        // stored column-major, each lane reads eight pixels of one channel and writes them as
        // one 16-byte vector of the output's plane, so no transpose follows.
        let pack = |v: &dyn Fn(usize) -> String| {
            format!(
                "vec4<u32>(pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})), \
                 pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})))",
                v(0),
                v(1),
                v(2),
                v(3),
                v(4),
                v(5),
                v(6),
                v(7)
            )
        };
        let read = "let q = array<f32, 8>(sc[mine], sc[mine + 1u], sc[mine + 2u], sc[mine + 3u], \
                    sc[mine + 4u], sc[mine + 5u], sc[mine + 6u], sc[mine + 7u]);";
        for i in 0..self.tm {
            for j in 0..self.tn {
                // Before each store but the first: the previous tile's reads of the patch.
                if i + j > 0 {
                    s.push_str("    workgroupBarrier();\n");
                }
                let (r, c) = (i * 16, j * 16);
                let rows = if conv {
                    format!(
                        "if m0 + sg_m + lane / 2u + {r}u < p.m {{\n        {read}\n        \
                         let bb = bias8(n0 + sg_n + (lane % 2u) * 8u + {c}u);\n        \
                         c[p.off_c / 8u + (o + {r}u * ldc + {c}u) / 8u] = {};\n    }}",
                        pack(&|e| format!("q[{e}] + bb[{e}]"))
                    )
                } else {
                    format!(
                        "{{\n        {read}\n        \
                         let bb = bias8(n0 + sg_n + (lane % 2u) * 8u + {c}u);\n        \
                         c[(o + {r}u * ldc + {c}u) / 8u] = {};\n    }}",
                        pack(&|e| format!("q[{e}] + bb[{e}]"))
                    )
                };
                if conv {
                    let planes = format!(
                        "let m = m0 + sg_m + {r}u + (lane % 2u) * 8u;\n        \
                         if m < p.m {{\n            \
                         let co = n0 + sg_n + {c}u + lane / 2u;\n            \
                         let bias1 = conv_bias1(co);\n            \
                         {read}\n            \
                         let at = p.off_c + ((m / ohw) * p.n + co) * ohw + m % ohw;\n            \
                         c[at / 8u] = {};\n        }}",
                        pack(&|e| format!("q[{e}] + bias1"))
                    );
                    let _ = writeln!(
                        s,
                        "    if nchw {{\n        \
                         coopStore(c{i}_{j}, &sc[own], {PATCH_ROW}u);\n        \
                         workgroupBarrier();\n        \
                         {planes}\n    \
                         }} else {{\n        \
                         coopStoreT(c{i}_{j}, &sc[own], {PATCH_ROW}u);\n        \
                         workgroupBarrier();\n        \
                         {rows}\n    }}"
                    );
                } else {
                    let _ = writeln!(
                        s,
                        "    coopStoreT(c{i}_{j}, &sc[own], {PATCH_ROW}u);\n    \
                         workgroupBarrier();\n    \
                         {rows}"
                    );
                }
            }
        }
        s.push_str("}\n");
        s
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
