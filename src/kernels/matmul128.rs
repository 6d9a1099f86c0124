//! The body of `shaders/matmul128.wgsl`'s `main`, unrolled here rather than by the WGSL compiler:
//! naga keeps loops as loops and `a * b + c` unfused, and the H100 ran the 16 k steps 30%
//! faster written out with explicit `fma`. One template per repeated piece; `{{ROW}}`,
//! `{{SWZ}}` and `{{HALF}}` stay for the per-variant substitution in `Kernel::source`.

use super::per_dtype;
use crate::base::DType;
use std::fmt::Write;

/// Which operand layouts the vec4 kernel has compiled in, or whether it tests them at run time.
///
/// Compiled in, each layout measured on the H100 (`bench --suite matmul`, alternated runs
/// against the runtime tests). With each slice's loads and stores under `if more` (before
/// `flat_slices`): a column-major A with a row-major B, whose slices both go into shared memory
/// as whole vec4s (`g^T @ x`, a weight's gradient), ran 42.0-42.2 TFLOP/s against 37.9; the
/// three layouts that scatter a slice's four k values into four rows ran 32.0-34.5 against
/// 37.0-39.2 (`x @ W^T`, `g @ W`, `W @ W`), so only the first was compiled in. With flat
/// slices (2026-11-27, two alternated rounds on one machine instance): a row-major A by a column-major B
/// (`x @ W^T`, every Linear's forward) compiled in ran 42.4-42.8 against the runtime kernel's
/// 38.1-38.2, `x1 @ W1^T` (K = 784) 38.8-39.2 on a later instance (35.1-35.7 before), and the
/// f32 SGD step 1.646-1.655 -> 1.608 ms. A row-major A by a row-major B compiled in (`g @ W`, `W @ W`) ran 42.0 and 42.8
/// against 38.4 and 39.0 at run time, but the tuner's column-major copy of A beats both
/// (`g @ W` 0.402 against 0.420 ms compiled in), by less than the tuner's margin, so that the
/// compiled-in kernel kept the key and the step ran 1.625 against 1.608 ms: that layout keeps
/// the runtime tests, and the tuner the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operands {
    /// A's and B's unit-stride dims read from the strides (`sak == 1`, `sbn == 1`).
    Runtime,
    /// A column-major (`sam == 1`), B row-major (`sbn == 1`): both slices stored whole.
    ColRow,
    /// A row-major (`sak == 1`), B column-major (`sbk == 1`): `x @ W^T`.
    RowCol,
}

/// What the vec4 kernel does to its outputs besides the bias (flag bit 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// The outputs as they are, after the bias.
    Plain,
    /// The outputs clamped at zero after the bias (`ops::linear_relu`: `x @ W^T + b` with the
    /// ReLU that follows it). A kernel of its own: the same clamp behind a flag tested at run
    /// time cost every f32 product 2-3% on the H100.
    Relu,
    /// The outputs kept where a mask of the output's shape (the fourth binding, at
    /// `off_bias`) is not <= 0: `ReluBackward0`'s formula applied to the input gradient `g @ W`
    /// of the Linear after a ReLU (Note [Backward epilogues]).
    Mask,
    /// `Operands::ColRow` only: the sums of A's rows too (flag bit 1, into the bias binding),
    /// in one more column of workgroups (`ROW_SUMS`): a Linear's weight gradient `g^T @ x`
    /// gives its bias gradient, the sums over `g`'s batch rows, in the same launch, and the two
    /// launches of the column sums (`shaders/colsum.wgsl`) leave the MLP's step.
    RowSums,
}

/// One vec4 kernel: its operands' layouts and its epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Vec4Layout {
    /// The operands' layouts compiled in (or tested at run time).
    pub operands: Operands,
    /// What the kernel does to its outputs besides the bias.
    pub epilogue: Epilogue,
}

impl Vec4Layout {
    /// Every kernel there is (`Epilogue::RowSums` goes with `Operands::ColRow` alone).
    pub fn all() -> Vec<Vec4Layout> {
        let operands = [Operands::Runtime, Operands::ColRow, Operands::RowCol];
        let mut all = Vec::new();
        for o in operands {
            for e in [Epilogue::Plain, Epilogue::Relu, Epilogue::Mask] {
                all.push(Vec4Layout {
                    operands: o,
                    epilogue: e,
                });
            }
        }
        all.push(Vec4Layout {
            operands: Operands::ColRow,
            epilogue: Epilogue::RowSums,
        });
        all
    }

    /// The plain kernel for operands with A's k stride `sak` and B's n stride `sbn`.
    pub fn of(sak: usize, sbn: usize) -> Vec4Layout {
        let operands = match (sak == 1, sbn == 1) {
            (false, true) => Operands::ColRow,
            (true, false) => Operands::RowCol,
            _ => Operands::Runtime,
        };
        Vec4Layout {
            operands,
            epilogue: Epilogue::Plain,
        }
    }

    /// This kernel with another epilogue.
    pub fn with(self, epilogue: Epilogue) -> Vec4Layout {
        Vec4Layout { epilogue, ..self }
    }

    /// The kernel name's suffix.
    pub fn suffix(self) -> String {
        let operands = match self.operands {
            Operands::Runtime => "",
            Operands::ColRow => "_ac_br",
            Operands::RowCol => "_ar_bc",
        };
        let epilogue = match self.epilogue {
            Epilogue::Plain => "",
            Epilogue::Relu => "_relu",
            Epilogue::Mask => "_mask",
            Epilogue::RowSums => "_rowsum",
        };
        format!("{operands}{epilogue}")
    }

    /// `shaders/matmul128_vec4.wgsl` with the layout tests in place.
    pub(crate) fn io(self) -> String {
        // The runtime layouts load an operand read along m or n as eight 64-byte rows a
        // subgroup (`rowmap`), `ColRow` as one 512-byte row. See `LINES8_RUNTIME`.
        let (a_rows, b_rows, lines8) = match self.operands {
            Operands::Runtime => ("p.sak == 1u", "p.sbn == 1u", LINES8_RUNTIME),
            Operands::ColRow => ("false", "true", false),
            // (Both operands read along k: `rowmap` is not called.)
            Operands::RowCol => ("true", "false", LINES8_RUNTIME),
        };
        let epilogue = match self.epilogue {
            // Zero where x is below zero, by its bits: NVIDIA's compiler took the float
            // form, `select(x, 0, x < 0)`, for a max and returned 0 for NaN (relu keeps NaN).
            Epilogue::Relu => {
                "let u = bitcast<vec4<u32>>(x);\n    x = select(x, vec4<f32>(), (u > vec4<u32>(0x80000000u)) & (u <= vec4<u32>(0xff800000u)));"
            }
            Epilogue::Mask => {
                "x = select(x, vec4<f32>(), bias[(p.off_bias + (bt * p.m + m) * p.n + n) / 4u] <= vec4<f32>());"
            }
            Epilogue::Plain | Epilogue::RowSums => "",
        };
        include_str!("../../shaders/matmul128_vec4.wgsl")
            .replace("{{A_ROWS}}", a_rows)
            .replace("{{B_ROWS}}", b_rows)
            .replace("{{EPILOGUE}}", epilogue)
            .replace("{{LINES8}}", if lines8 { "true" } else { "false" })
    }
}

/// Whether the kernels that test the layouts at run time load an operand read along m or n as
/// eight 64-byte rows a subgroup (`rowmap` in `shaders/matmul128_vec4.wgsl`) instead of one
/// 512-byte row. Measured on the H100 (2026-11-27, two alternated runs): the 512-byte rows are
/// 3.4% faster where they run (`g^T @ x` on the compiled-in `ColRow` kernel 41.97 against
/// 40.53 TFLOP/s with eight rows), yet the runtime kernel's `x @ W^T`, which never takes those
/// paths (both its operands are read along k), ran 37.05 -> 38.12 TFLOP/s and `x1 @ W1^T`
/// 34.5 -> 35.3 with the eight-row index arithmetic in them: NVIDIA's compiler schedules the
/// whole kernel differently (139 registers against 135). Groups of 1, 2, 4 or 16 rows gave
/// 36.8-37.5: eight is a schedule found by measurement, not a rule, and a driver update may
/// move it. Every MLP forward product runs that path; the column-major and row-major paths it
/// slows run on `ColRow` (the tuner copies A column-major first where that wins).
const LINES8_RUNTIME: bool = true;

/// Which operand access a generated `main` calls: the plain matmul's (`Scalar`: any strides,
/// guarded; `Vec4`: whole aligned tiles), or a convolution's implicit GEMM
/// (`shaders/conv_gemm*.wgsl`) with a tile of `bm` rows (64 or 128) by 128 columns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Io {
    Scalar,
    /// With `row_sums`, `Epilogue::RowSums`'s sums of A's rows.
    Vec4 {
        row_sums: bool,
    },
    Conv {
        bm: u32,
    },
    /// The convolution's forward pass, or its weight's gradient, on vec4 loads from NHWC
    /// operands (`shaders/conv_gemm_{fwd4,wgrad4}.wgsl`). The loads get the global k: the
    /// slice's plus the K split's start (`kb`, zero outside wgrad).
    /// With `wide` (64 rows only), a 64x256 tile: each invocation computes 8 rows by 8
    /// columns as in the 128x128 tile (four shared reads per 64 FMAs), B's second 128 columns
    /// in a third shared tile (`tile_c`), the rows padded (A's 64 values to 17 vec4s, B's to
    /// 33), never swizzled: the swizzle's 16 indices held in registers cost the tile 5%.
    ConvVec4 {
        bm: u32,
        wide: bool,
    },
}

impl Io {
    fn bm(self) -> u32 {
        match self {
            Io::Conv { bm } | Io::ConvVec4 { bm, .. } => bm,
            _ => 128,
        }
    }

    pub(crate) fn wide(self) -> bool {
        matches!(self, Io::ConvVec4 { wide: true, .. })
    }

    /// Columns per tile.
    fn bn(self) -> u32 {
        if self.wide() {
            256
        } else {
            128
        }
    }

    /// A's vec4 loads per invocation per slice on the vec4 paths.
    fn a_vec4s(self) -> usize {
        self.bm() as usize / 64
    }

    /// B's vec4 loads per invocation per slice on the vec4 paths.
    fn b_vec4s(self) -> usize {
        if self.wide() {
            4
        } else {
            2
        }
    }

    /// A's elements per invocation per slice (B's are always eight).
    fn a_loads(self) -> usize {
        (self.bm() * 16 / 256) as usize
    }
}

/// Loads of the slices at k `k` (a WGSL expression) into the prefetch registers: one scalar
/// per 256 elements of each operand, or two vec4s; a convolution first works out the slice's
/// window (`slice_a`, `slice_b`) once per invocation.
fn loads(out: &mut String, k: &str, indent: &str, io: Io) {
    if let Io::ConvVec4 { .. } = io {
        for r in 0..io.a_vec4s() {
            let e = r * 256;
            let _ = writeln!(out, "{indent}ra[{r}] = load_a4(m0, kb + {k}, li + {e}u);");
        }
        for r in 0..io.b_vec4s() {
            let _ = writeln!(out, "{indent}rb[{r}] = load_b4(pb{r}, kb + {k});");
        }
        return;
    }
    if let Io::Vec4 { .. } = io {
        for r in 0..2 {
            let e = r * 256;
            let _ = writeln!(
                out,
                "{indent}ra[{r}] = load_a4(a_base, m0, {k}, li + {e}u);"
            );
            let _ = writeln!(
                out,
                "{indent}rb[{r}] = load_b4(b_base, n0, {k}, li + {e}u);"
            );
        }
        return;
    }
    if let Io::Conv { .. } = io {
        let _ = writeln!(out, "{indent}{{");
        let _ = writeln!(out, "{indent}    let sa = slice_a(pa, {k});");
        let _ = writeln!(out, "{indent}    let sb = slice_b(pb, {k});");
        for r in 0..8 {
            if r < io.a_loads() {
                let _ = writeln!(out, "{indent}    ra[{r}] = load_a(pa, sa, {k}, {r}u);");
            }
            let _ = writeln!(out, "{indent}    rb[{r}] = load_b(pb, sb, {k}, {r}u);");
        }
        let _ = writeln!(out, "{indent}}}");
        return;
    }
    for r in 0..8 {
        let e = r * 256;
        let _ = writeln!(out, "{indent}ra[{r}] = load_a(a_base, m0, {k}, li + {e}u);");
        let _ = writeln!(out, "{indent}rb[{r}] = load_b(b_base, n0, {k}, li + {e}u);");
    }
}

/// A's shared buffer beside B's `base`: the same offset, except in the wide tile, whose A
/// rows are half as long (`a_buffer`).
fn a_base(base: &str, io: Io) -> String {
    match (io.wide(), base) {
        (true, "0u") | (false, _) => base.to_string(),
        (true, _) => format!("{base}_a"),
    }
}

/// Stores of the prefetch registers into the shared buffer at `base`.
fn stores(out: &mut String, base: &str, indent: &str, io: Io) {
    let base_a = a_base(base, io);
    if matches!(io, Io::Vec4 { .. } | Io::ConvVec4 { .. }) {
        let store_b = if io.wide() { "store_b4w" } else { "store_b4" };
        for r in 0..io.b_vec4s() {
            let e = r * 256;
            if r < io.a_vec4s() {
                let _ = writeln!(out, "{indent}store_a4({base_a}, li + {e}u, ra[{r}]);");
            }
            let _ = writeln!(out, "{indent}{store_b}({base}, li + {e}u, rb[{r}]);");
        }
        return;
    }
    for r in 0..8 {
        let e = r * 256;
        let _ = writeln!(out, "{indent}{{");
        if r < io.a_loads() {
            let _ = write!(
                out,
                "{indent}    let c = a_coord(li + {e}u);\n\
                 {indent}    tile_a[{base_a} + c.y * {{{{ROW_A}}}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{{{SWZ}}}}u))][c.x % 4u] = ra[{r}];\n"
            );
        }
        let _ = write!(
            out,
            "{indent}    let d = b_coord(li + {e}u);\n\
             {indent}    tile_b[{base} + d.x * {{{{ROW}}}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{{{SWZ}}}}u))][d.y % 4u] = rb[{r}];\n\
             {indent}}}\n"
        );
    }
}

/// One k step of the slice: four vec4 shared reads, 64 FMAs (three and 32 for a 64-row tile).
/// The wide tile reads the 128-row tile's four: its rows 32.. where that one has 64.., and
/// its columns 128.. from `tile_c` where that one has 64.. from `tile_b`.
fn k_step(out: &mut String, kk: usize, io: Io) {
    let full = io.bm() == 128 || io.wide();
    let s = kk % 8;
    let a_hi = if io.wide() { " + 8u" } else { " + 16u" };
    let (b_hi_buf, b_hi) = if io.wide() {
        ("c", "")
    } else {
        ("b", " + 16u")
    };
    let _ = writeln!(out, "        {{");
    for (v, buf, half, sw) in [
        ("a_lo", "a", "", "ys"),
        ("a_hi", "a", a_hi, "ys"),
        ("b_lo", "b", "", "xs"),
        ("b_hi", b_hi_buf, b_hi, "xs"),
    ] {
        if v == "a_hi" && !full {
            continue;
        }
        let (cur, row) = match buf {
            "a" => (a_base("cur", io) + " + ", "ROW_A"),
            _ => ("cur + ".to_string(), "ROW"),
        };
        let _ = writeln!(
            out,
            "            let {v} = tile_{buf}[{cur}{kk}u * {{{{{row}}}}}u{half} + {sw}{s}];"
        );
    }
    for (i, c) in ["x", "y", "z", "w"].iter().enumerate() {
        for (acc, a, b) in [
            (format!("acc{i}l"), "a_lo", "b_lo"),
            (format!("acc{i}h"), "a_lo", "b_hi"),
            (format!("acc{}l", i + 4), "a_hi", "b_lo"),
            (format!("acc{}h", i + 4), "a_hi", "b_hi"),
        ] {
            if a == "a_hi" && !full {
                continue;
            }
            let _ = writeln!(
                out,
                "            {acc} = fma(vec4<f32>({a}.{c}), {b}, {acc});"
            );
        }
    }
    let _ = writeln!(out, "        }}");
}

/// `Epilogue::RowSums`'s extra column of workgroups (`wg.x == 0`, the product's tiles
/// after it, so that these short workgroups start first), which sum the tile's rows of a
/// column-major A over all of K instead of multiplying: a warp reads 512 contiguous bytes of
/// one k, the workgroup's eight warps eight k at a time, eight loads in flight, and shared
/// memory adds up the eight partial sums of each row. The
/// product's own workgroups return from nothing: its loop is the plain `ColRow` kernel's.
/// (Summing the slices in the product's workgroups as they are loaded cost the H100's MLP
/// step 100 us: four more live registers in its loop.)
const ROW_SUMS: &str = "    if wg.x == 0u {
        let q = li / 32u;
        let col = (a_base + m0) / 4u + li % 32u;
        let step = 8u * p.sak / 4u;
        var s0 = vec4<f32>();
        var s1 = vec4<f32>();
        var s2 = vec4<f32>();
        var s3 = vec4<f32>();
        var s4 = vec4<f32>();
        var s5 = vec4<f32>();
        var s6 = vec4<f32>();
        var s7 = vec4<f32>();
        var k = q;
        var at = col + q * p.sak / 4u;
        for (; k + 56u < p.k; k += 64u) {
            s0 += a[at];
            s1 += a[at + step];
            s2 += a[at + 2u * step];
            s3 += a[at + 3u * step];
            s4 += a[at + 4u * step];
            s5 += a[at + 5u * step];
            s6 += a[at + 6u * step];
            s7 += a[at + 7u * step];
            at += 8u * step;
        }
        for (; k < p.k; k += 8u) {
            s0 += a[at];
            at += step;
        }
        tile_a[li] = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
        workgroupBarrier();
        if li < 32u {
            var t = tile_a[li];
            for (var j = 1u; j < 8u; j++) {
                t += tile_a[j * 32u + li];
            }
            bias[(p.off_bias + m0) / 4u + li] = t;
        }
        return;
    }
";

/// Whether each slice loads and stores the next one unconditionally (the last slice loads
/// itself again and stores it into the buffer nobody reads after it) instead of under
/// `if more { .. }` twice, around the loads and around the stores.
///
/// Measured on the H100 (2026-11-27, alternated rounds on one machine instance): the plain matmul's vec4
/// products whose layout was compiled in gained 1.5-2.5% (`g @ W` after A's copy 42.5-42.8 ->
/// 43.4-43.7 TFLOP/s, `g^T @ x` 41.8-42.2 -> 42.5-42.9, `W @ W` 43.7-44.1 -> 44.6-44.7), the
/// runtime-layout ones were unchanged (`x @ W^T` 38.1 -> 38.1-38.4), and the f32 SGD step went
/// 1.674-1.675 -> 1.659-1.660 ms; flat slices then made `x @ W^T`'s layout pay compiled in
/// (`Operands::RowCol`). The f32 convolution (`bench --suite conv`, 3x3 64->64 at 56x56, b32):
/// forward 24.2-24.3 -> 24.7 TFLOP/s, forward and both gradients 21.7 -> 22.3. A likely
/// reading, not a checked one (the driver gives no ISA to read): with the same condition
/// around both, NVIDIA's compiler may merge the two blocks and issue the loads next to the
/// stores they feed, so that the slice's FMAs no longer cover their latency. The scalar
/// kernel (guarded loads, any shape) was not measured and keeps the conditions.
fn flat_slices(io: Io) -> bool {
    !matches!(io, Io::Scalar)
}

/// `main`: accumulators, the first slice, then per slice prefetch / 16 k steps / store, for
/// the operand access `io` provides.
pub(crate) fn main_fn(io: Io) -> String {
    let full = io.bm() == 128;
    // The wide tile's columns 128..255 of B: a third shared tile, and the store that picks it
    // (B's vectors scatter four k values into four rows, as `conv_gemm_fwd4.wgsl`'s do).
    let wide = if io.wide() {
        "var<workgroup> tile_c: array<vec4<f32>, {{TILE}}>;\n\n\
         fn store_b4w(buf: u32, v: u32, x: vec4<f32>) {\n\
         \x20   let n = v / 4u;\n\
         \x20   if n < 128u {\n\
         \x20       store_b4(buf, v, x);\n\
         \x20       return;\n\
         \x20   }\n\
         \x20   let c = n - 128u;\n\
         \x20   let k = 4u * (v % 4u);\n\
         \x20   for (var j = 0u; j < 4u; j++) {\n\
         \x20       tile_c[tile_at(buf, k + j, c)][c % 4u] = x[j];\n\
         \x20   }\n\
         }\n\n"
    } else {
        ""
    };
    let mut out = String::from(wide);
    out += "@compute @workgroup_size(16, 16)\n\
         fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) li: u32) {\n\
         \x20   let bt = wg.z;\n";
    let _ = writeln!(out, "    let m0 = wg.y * {}u;", io.bm());
    // The row sums' workgroups come first (`ROW_SUMS`), the product's tiles after them.
    let col = match io {
        Io::Vec4 { row_sums: true } => "(wg.x - 1u)",
        _ => "wg.x",
    };
    let _ = writeln!(out, "    let n0 = {col} * {}u;", io.bn());
    match io {
        Io::Conv { .. } => {
            out += "    let pa = pre_a(bt, m0, li);\n    let pb = pre_b(bt, n0, li);\n"
        }
        Io::ConvVec4 { .. } => {
            out += "    let kb = bt * p.k;\n";
            for r in 0..io.b_vec4s() {
                let _ = writeln!(out, "    let pb{r} = pre_b4(n0, li + {}u);", r * 256);
            }
        }
        _ => {
            out +=
                "    let a_base = p.off_a + bt * p.sab;\n    let b_base = p.off_b + bt * p.sbb;\n"
        }
    }
    if let Io::Vec4 { row_sums: true } = io {
        out += ROW_SUMS;
    }
    for i in 0..8 {
        let _ = writeln!(out, "    var acc{i}l = vec4<f32>();");
        let _ = writeln!(out, "    var acc{i}h = vec4<f32>();");
    }
    if matches!(io, Io::Vec4 { .. } | Io::ConvVec4 { .. }) {
        let (na, nb) = (io.a_vec4s(), io.b_vec4s());
        let _ = writeln!(
            out,
            "    var ra: array<vec4<f32>, {na}>;\n    var rb: array<vec4<f32>, {nb}>;"
        );
    } else {
        out += "    var ra: array<f32, 8>;\n    var rb: array<f32, 8>;\n";
    }
    loads(&mut out, "0u", "    ", io);
    stores(&mut out, "0u", "    ", io);
    out += "    workgroupBarrier();\n";
    // The invocation's place in the 16x16 grid of 4x4 output blocks. With 128 rows a subgroup
    // of 32 covers 8 columns by 4 rows of blocks (not 16 by 2), so that its B reads span 128
    // bytes: f32 products 0.8-1.6% faster on the H100. The 64-row tile keeps the plain layout
    // (the same remap cost its 3x3 convolution 7%: 21.3 -> 19.7 TFLOP/s).
    out += if io.wide() {
        // 8 x 32 blocks: a subgroup is one row of blocks (A's reads one broadcast address, B's
        // 512 contiguous bytes).
        "    let tx = li % 32u;\n    let ty = li / 32u;\n"
    } else if full {
        "    let tx = (li % 8u) + 8u * ((li / 32u) % 2u);\n    let ty = (li / 8u) % 4u + 4u * (li / 64u);\n"
    } else {
        "    let tx = l.x;\n    let ty = l.y;\n"
    };
    out += "    // The swizzled columns this invocation reads, one per row class k % 8.\n";
    for i in 0..8 {
        let _ = writeln!(out, "    let ys{i} = ty ^ ({i}u * {{{{SWZ}}}}u);");
        let _ = writeln!(out, "    let xs{i} = tx ^ ({i}u * {{{{SWZ}}}}u);");
    }
    if io.wide() {
        out += "    var cur_a = 0u;\n";
    }
    // The next slice's loads and stores: unconditional (the last slice loads itself again and
    // stores it into the buffer that no invocation reads after it), or each under `if more`.
    let flat = flat_slices(io);
    let (next_k, open, close, indent) = if flat {
        ("kn", "", "", "        ")
    } else {
        ("k1", "        if more {\n", "        }\n", "            ")
    };
    out += "    var cur = 0u;\n\
            \x20   for (var k0 = 0u; k0 < p.k; k0 += 16u) {\n\
            \x20       let k1 = k0 + 16u;\n\
            \x20       let more = k1 < p.k;\n";
    if flat {
        out += "        let kn = select(k0, k1, more);\n";
    }
    out += open;
    loads(&mut out, next_k, indent, io);
    out += close;
    for kk in 0..16 {
        k_step(&mut out, kk, io);
    }
    out += "        let next = {{HALF}}u - cur;\n";
    if io.wide() {
        out += "        let next_a = {{HALF_A}}u - cur_a;\n";
    }
    out += open;
    stores(&mut out, "next", indent, io);
    out += close;
    out += "        workgroupBarrier();\n        cur = next;\n";
    if io.wide() {
        out += "        cur_a = next_a;\n";
    }
    out += "    }\n";
    // The wide tile: rows 4 ty.. and 32 + 4 ty.., columns 4 tx.. and 128 + 4 tx..
    let (r_hi, c_hi) = if io.wide() { (32, 128) } else { (64, 64) };
    let _ = write!(
        out,
        "    let r_lo = m0 + 4u * ty;\n\
         \x20   let r_hi = m0 + {r_hi}u + 4u * ty;\n\
         \x20   let c_lo = n0 + 4u * tx;\n\
         \x20   let c_hi = n0 + {c_hi}u + 4u * tx;\n"
    );
    let full = full || io.wide();
    for i in 0..4 {
        let _ = writeln!(out, "    store4(bt, r_lo + {i}u, c_lo, acc{i}l);");
        let _ = writeln!(out, "    store4(bt, r_lo + {i}u, c_hi, acc{i}h);");
        if full {
            let _ = writeln!(out, "    store4(bt, r_hi + {i}u, c_lo, acc{}l);", i + 4);
            let _ = writeln!(out, "    store4(bt, r_hi + {i}u, c_hi, acc{}h);", i + 4);
        }
    }
    out += "}\n";
    out
}

/// `shaders/matmul128.wgsl` around the operand access `io` (with its immediates `params`),
/// its `main` generated for `kind`.
pub(crate) fn tiled_128(io: &str, params: &str, d: DType, padded: bool, kind: Io) -> String {
    // Rows of vec4s padded to 33 (where the device allows 33 KiB of shared memory) or swizzled.
    // The wide tile (64x256, only where a workgroup may have 48 KiB) is always padded, its A
    // rows (64 values) to 17: 42.5 KiB in all, and no swizzled indices held in registers.
    let (row, swz) = if padded || kind.wide() {
        (33, 0)
    } else {
        (32, 1)
    };
    let row_a = if kind.wide() { 17 } else { row };
    per_dtype(
        &include_str!("../../shaders/matmul128.wgsl")
            .replace("{{PARAMS}}", params)
            .replace("{{IO}}", io),
        d,
    )
    .replace("{{MAIN}}", &main_fn(kind))
    .replace("{{ROW_A}}", &row_a.to_string())
    .replace("{{TILE_A}}", &(32 * row_a).to_string())
    .replace("{{HALF_A}}", &(16 * row_a).to_string())
    .replace("{{ROW}}", &row.to_string())
    .replace("{{SWZ}}", &swz.to_string())
    .replace("{{TILE}}", &(32 * row).to_string())
    .replace("{{HALF}}", &(16 * row).to_string())
}
