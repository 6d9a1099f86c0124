//! The product without workgroup memory that loads its operands as 64-bit words
//! (`reg4x8_wide`): a CPU adapter's candidate beside `shaders/matmul_reg.wgsl`.
//!
//! Mesa 22.3's llvmpipe loads a storage buffer one component at a time, each behind an
//! exec-mask branch and a bounds branch (`docs/lab/tuning.md`), whatever the component's width:
//! a `u64` word carries two f32 or four f16 elements for the price of one. `reg4x4` loads eight
//! scalars per k step for 16 multiply-adds; this kernel computes 4x8 outputs per invocation and
//! loads twelve words per two k steps in f32 (64 multiply-adds), or per four in f16 (128); a
//! 16-row form (`reg16x8_wide`) is a second candidate.
//!
//! Each operand is read in words along its unit-stride dim, compiled in: along k (a row-major A,
//! a column-major B), whose word holds `E` consecutive k values of one row (or column), or along
//! m (n), whose word holds `E` neighbouring rows (columns) at one k. Every offset and stride
//! that a word address multiplies must be a multiple of `E`, and K too ([`MatmulWide::fits`]).
//! The WGSL is generated straight-line (no loop over a row's values), so that llvmpipe keeps
//! every value in a register instead of indexing a local array. Built trusted: every load is
//! clamped into its operand (the extra rows and columns are computed and never stored), and
//! stores are guarded. A bias row (`linear`'s) is added in the epilogue where `p.flags` says so.

use crate::base::DType;

/// Columns (n) one invocation computes; the workgroup is 8 invocations across n by `WG_ROWS`.
const COLS: usize = 8;

/// The workgroup's invocations along m: one. llvmpipe runs a workgroup on one thread, eight
/// invocations to a SIMD vector: a workgroup of eight is a whole vector, and more workgroups
/// share the threads better. With 8x8 invocations the 16-row form's workgroup covered 128
/// rows, half of it idle on the MLP's batch of 64 (lavapipe's layer-1 forward, 64x128x784:
/// 5.0 ms on the 4-row form with 8x8, 3.1 ms on the 16-row form with 8x1).
const WG_ROWS: usize = 1;

/// Elements per 64-bit word.
fn per_word(dtype: DType) -> usize {
    8 / dtype.size_bytes()
}

/// A product over 64-bit words (CPU adapters): its dtype, outputs per invocation and the operands' layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulWide {
    /// f32 or f16 operands and output (f32 accumulation).
    pub dtype: DType,
    /// A's words run along k (row-major A, `sak == 1`), else along m (`sam == 1`).
    pub a_k: bool,
    /// B's words run along k (column-major B, `sbk == 1`), else along n (`sbn == 1`).
    pub b_k: bool,
    /// Rows one invocation computes: 4 (`reg4x8_wide`) or 16 (`reg16x8_wide`, a quarter of the
    /// loads per multiply-add of the 4-row kernel's A and half of B's, for more live values;
    /// on lavapipe 256^3 f32 runs 9.6 ms against 16.2, and the MLP's batch-64 products win too
    /// since the workgroup is one row of invocations: `WG_ROWS`).
    pub rows: usize,
    /// A read from a uniform buffer (`reg16x8_wide_ubo`): a window of A's rows that the launch
    /// copies into the device's 64 KiB scratch (`launch::uniform_scratch`) before each
    /// dispatch. With lanes along n, every lane of a SIMD vector reads the same A address, and
    /// llvmpipe loads a uniform buffer at a lane-uniform offset once, where it walks a storage
    /// buffer's load lane by lane behind two branches (Mesa's `emit_load_ubo` and
    /// `emit_load_mem`). On the dtype's larger row count only (`rows_for`).
    pub ubo_a: bool,
}

impl MatmulWide {
    /// The workgroup's columns (its rows: [`MatmulWide::tile_m`]).
    pub const TILE_N: usize = COLS * 8;

    /// The invocation's row counts, each a tuner candidate.
    pub const ROWS: [usize; 2] = [4, 16];

    /// The row counts offered for `dtype`: 4 and 16 in f32; 4 and 8 in f16, whose word holds
    /// four k values, so that a 16-row loop body is twice f32's, and llvmpipe took about 2 s
    /// to compile it (the tuning budget of a key).
    pub fn rows_for(dtype: DType) -> [usize; 2] {
        match dtype {
            DType::F16 => [4, 8],
            _ => Self::ROWS,
        }
    }

    /// Every variant, for validation.
    pub fn all() -> Vec<MatmulWide> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16] {
            for a_k in [false, true] {
                for b_k in [false, true] {
                    for rows in Self::rows_for(dtype) {
                        v.push(MatmulWide {
                            dtype,
                            a_k,
                            b_k,
                            rows,
                            ubo_a: false,
                        });
                    }
                    v.push(MatmulWide {
                        dtype,
                        a_k,
                        b_k,
                        rows: Self::rows_for(dtype)[1],
                        ubo_a: true,
                    });
                }
            }
        }
        v
    }

    /// The workgroup's rows.
    pub fn tile_m(&self) -> usize {
        self.rows * WG_ROWS
    }

    /// The tuner's name for the candidate.
    pub fn candidate(&self) -> &'static str {
        match (self.rows, self.ubo_a) {
            (4, _) => "reg4x8_wide",
            (8, false) => "reg8x8_wide",
            (8, true) => "reg8x8_wide_ubo",
            (_, false) => "reg16x8_wide",
            (_, true) => "reg16x8_wide_ubo",
        }
    }

    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let a = if self.a_k { "ak" } else { "am" };
        let b = if self.b_k { "bk" } else { "bn" };
        let ubo = if self.ubo_a { "_ubo" } else { "" };
        format!("matmul_reg{}x8_wide{ubo}_{}_{a}_{b}", self.rows, self.dtype)
    }

    /// The uniform form of `self` (A through the scratch uniform buffer), on the dtype's
    /// larger row count.
    pub fn with_ubo_a(self) -> MatmulWide {
        MatmulWide {
            rows: Self::rows_for(self.dtype)[1],
            ubo_a: true,
            ..self
        }
    }

    /// The word products (both row counts) for a product of `[m, n, k]` with A's offset and
    /// strides `(off_a, sab, sam, sak)` and B's `(off_b, sbb, sbk, sbn)` (elements): none where
    /// the words do not fit.
    pub fn fitting(
        dtype: DType,
        [m, n, k]: [usize; 3],
        (off_a, sab, sam, sak): (usize, usize, usize, usize),
        (off_b, sbb, sbk, sbn): (usize, usize, usize, usize),
    ) -> Vec<MatmulWide> {
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Vec::new();
        }
        let e = per_word(dtype);
        let whole = |v: &[usize]| v.iter().all(|x| x.is_multiple_of(e));
        if !whole(&[k, off_a, sab, off_b, sbb]) {
            return Vec::new();
        }
        let a_k = if sak == 1 && whole(&[sam]) {
            Some(true)
        } else if sam == 1 && whole(&[sak, m]) {
            Some(false)
        } else {
            None
        };
        let b_k = if sbn == 1 && whole(&[sbk, n]) {
            Some(false)
        } else if sbk == 1 && whole(&[sbn]) {
            Some(true)
        } else {
            None
        };
        let (Some(a_k), Some(b_k)) = (a_k, b_k) else {
            return Vec::new();
        };
        Self::rows_for(dtype)
            .map(|rows| MatmulWide {
                dtype,
                a_k,
                b_k,
                rows,
                ubo_a: false,
            })
            .to_vec()
    }

    /// The WGSL, after `prelude`: `shaders/matmul_params.wgsl` (the immediates and bindings) and
    /// `shaders/matmul_store_row.wgsl`.
    pub fn source(&self, prelude: &str) -> String {
        let e = per_word(self.dtype);
        let rows = self.rows;
        let t = self.dtype.name();
        let enables = if self.dtype == DType::F16 {
            "enable f16;"
        } else {
            ""
        };
        // A word's elements as f32, lowest address first.
        let (w, unpack) = if self.dtype == DType::F16 {
            (
                "vec4<f32>",
                "vec4<f32>(unpack2x16float(u32(x & 0xfffffffflu)), \
                 unpack2x16float(u32(x >> 32u)))",
            )
        } else {
            (
                "vec2<f32>",
                "vec2<f32>(bitcast<f32>(u32(x & 0xfffffffflu)), bitcast<f32>(u32(x >> 32u)))",
            )
        };
        // The bias epilogue's immediates and binding after the product's (`p.flags` bit 0:
        // `out += bias[off_bias + n]`, the row broadcast over every row and batch).
        let prelude = prelude
            .replace("{{ENABLES}}", enables)
            .replace("a: array<{{T}}>", "a: array<u64>")
            .replace("b: array<{{T}}>", "b: array<u64>")
            .replace(
                "    sbn: u32,\n}",
                "    sbn: u32,\n    flags: u32,\n    off_bias: u32,\n    m0: u32,\n    \
                 a_rows: u32,\n}",
            )
            .replace("{{T}}", t)
            + &format!("@group(0) @binding(3) var<storage, read_write> bias: array<{t}>;\n");
        // The uniform form: A's window (rows m0..m0 + a_rows of this dispatch, from element 0)
        // in 4096 vec4<u32>; `ua(x)` is the word at element x of the window, as `unpack` gives
        // a storage word.
        let prelude = if self.ubo_a {
            let word = if self.dtype == DType::F16 {
                "vec4<f32>(unpack2x16float(v[c]), unpack2x16float(v[c + 1u]))"
            } else {
                "vec2<f32>(bitcast<f32>(v[c]), bitcast<f32>(v[c + 1u]))"
            };
            let per_vec4 = 16 / self.dtype.size_bytes();
            let per_u32 = 4 / self.dtype.size_bytes();
            prelude.replace(
                "@group(0) @binding(0) var<storage, read_write> a: array<u64>;",
                &format!(
                    "@group(0) @binding(0) var<uniform> au: array<vec4<u32>, 4096>;\n\
                     fn ua(x: u32) -> {w} {{\n    \
                     let v = au[x / {per_vec4}u];\n    \
                     let c = (x % {per_vec4}u) / {per_u32}u;\n    \
                     return {word};\n}}"
                ),
            )
        } else {
            prelude
        };
        let mut s = format!(
            "{prelude}\nfn unpack(x: u64) -> {w} {{\n    return {unpack};\n}}\n\n\
             @compute @workgroup_size(8, {WG_ROWS})\n\
             fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {{\n    \
             let bt = wg.z;\n    \
             let mr = wg.y * {tile_m}u + l.y * {rows}u;\n    \
             let m = p.m0 + mr;\n    \
             let n = wg.x * {tile_n}u + l.x * {COLS}u;\n    \
             let a_base = {a_base};\n    \
             let b_base = p.off_b + bt * p.sbb;\n",
            tile_n = Self::TILE_N,
            tile_m = self.tile_m(),
            // The window starts at element 0 of the uniform buffer (one batch).
            a_base = if self.ubo_a { "0u" } else { "p.off_a + bt * p.sab" },
        );
        // A's rows (`mr`) count from the dispatch's first (`p.m0`, 0 but in the uniform form);
        // `p.a_rows` is the rows it holds (M but in the uniform form).
        // Word addresses (in elements) of each row or column, clamped into range.
        if self.a_k {
            for i in 0..rows {
                s += &format!("    let ar{i} = a_base + min(mr + {i}u, p.a_rows - 1u) * p.sam;\n");
            }
        } else {
            for g in 0..rows / e {
                s += &format!(
                    "    let ar{g} = a_base + min(mr + {}u, p.a_rows - {e}u);\n",
                    g * e
                );
            }
        }
        if self.b_k {
            for j in 0..COLS {
                s += &format!("    let bc{j} = b_base + min(n + {j}u, p.n - 1u) * p.sbn;\n");
            }
        } else {
            for g in 0..COLS / e {
                s += &format!(
                    "    let bc{g} = b_base + min(n + {}u, p.n - {e}u);\n",
                    g * e
                );
            }
        }
        for i in 0..rows {
            s += &format!("    var acc{i}0 = vec4<f32>();\n    var acc{i}1 = vec4<f32>();\n");
        }
        s += &format!("    for (var k = 0u; k < p.k; k += {e}u) {{\n");
        // A's word at element offset `x`, from storage or the uniform window.
        let load_a = |x: &str| match self.ubo_a {
            true => format!("ua({x})"),
            false => format!("unpack(a[({x}) / {e}u])"),
        };
        // a{i}_{kk}: A's row m + i at k + kk, as an expression.
        let mut a_val = vec![vec![String::new(); e]; rows];
        if self.a_k {
            for (i, row) in a_val.iter_mut().enumerate() {
                s += &format!("        let wa{i} = {};\n", load_a(&format!("ar{i} + k")));
                for (kk, v) in row.iter_mut().enumerate() {
                    *v = format!("wa{i}[{kk}]");
                }
            }
        } else {
            // A word holds `e` neighbouring rows (the invocation's rows are whole words: m is
            // a multiple of 4 and M of `e`).
            for kk in 0..e {
                for g in 0..rows / e {
                    s += &format!(
                        "        let wa{kk}_{g} = {};\n",
                        load_a(&format!("ar{g} + (k + {kk}u) * p.sak"))
                    );
                    for (x, row) in a_val[g * e..(g + 1) * e].iter_mut().enumerate() {
                        row[kk] = format!("wa{kk}_{g}[{x}]");
                    }
                }
            }
        }
        // b{kk}: B's row k + kk over the eight columns, as two vec4 expressions.
        let mut b_val = vec![vec![String::new(); COLS]; e];
        if self.b_k {
            for j in 0..COLS {
                s += &format!("        let wb{j} = unpack(b[(bc{j} + k) / {e}u]);\n");
                for (kk, row) in b_val.iter_mut().enumerate() {
                    row[j] = format!("wb{j}[{kk}]");
                }
            }
        } else {
            for (kk, row) in b_val.iter_mut().enumerate() {
                for g in 0..COLS / e {
                    s += &format!(
                        "        let wb{kk}_{g} = unpack(b[(bc{g} + (k + {kk}u) * p.sbk) / {e}u]);\n"
                    );
                    for x in 0..e {
                        row[g * e + x] = format!("wb{kk}_{g}[{x}]");
                    }
                }
            }
        }
        for (kk, row) in b_val.iter().enumerate() {
            s += &format!(
                "        let b{kk}0 = vec4<f32>({}, {}, {}, {});\n        \
                 let b{kk}1 = vec4<f32>({}, {}, {}, {});\n",
                row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]
            );
            for (i, a_row) in a_val.iter().enumerate() {
                s += &format!(
                    "        acc{i}0 += {a} * b{kk}0;\n        acc{i}1 += {a} * b{kk}1;\n",
                    a = a_row[kk]
                );
            }
        }
        s += "    }\n";
        s += "    if (p.flags & 1u) != 0u {\n";
        for h in 0..2 {
            let cols: Vec<String> = (0..4)
                .map(|j| format!("f32(bias[p.off_bias + min(n + {}u, p.n - 1u)])", 4 * h + j))
                .collect();
            s += &format!("        let bias{h} = vec4<f32>({});\n", cols.join(", "));
            for i in 0..rows {
                s += &format!("        acc{i}{h} += bias{h};\n");
            }
        }
        s += "    }\n";
        for i in 0..rows {
            s += &format!(
                "    store_row(bt, m + {i}u, n, acc{i}0);\n    store_row(bt, m + {i}u, n + 4u, acc{i}1);\n"
            );
        }
        s += "}\n";
        s
    }
}

/// How the uniform form of the word product (`MatmulWide::ubo_a`) splits A into windows that
/// each fit the 64 KiB uniform scratch: `rows` rows a dispatch (a multiple of the `tile` rows,
/// 0 where not even one tile fits), for A of `[m, k]` with strides `sam`, `sak` (one of them 1).
pub struct UboWindows {
    /// Rows a dispatch (0: not even one tile fits).
    pub rows: usize,
    k: usize,
    sam: usize,
    sak: usize,
}

impl UboWindows {
    /// The windows for A of `[m, k]` with strides `sam`, `sak` in `dtype`, `tile` rows at a time.
    pub fn new(
        dtype: DType,
        [m, k]: [usize; 2],
        sam: usize,
        sak: usize,
        tile: usize,
    ) -> UboWindows {
        let mut w = UboWindows {
            rows: 0,
            k,
            sam,
            sak,
        };
        let fits = |w: &UboWindows, rows| {
            w.elems(rows) * dtype.size_bytes() <= super::UNIFORM_SCRATCH as usize
        };
        let mut rows = tile;
        while rows < m.next_multiple_of(tile) && fits(&w, rows + tile) {
            rows += tile;
        }
        w.rows = if fits(&w, tile) { rows } else { 0 };
        w
    }

    /// Elements a window of `rows` rows spans, from its first row's first element.
    fn elems(&self, rows: usize) -> usize {
        match self.sak == 1 {
            true => (rows - 1) * self.sam + self.k,
            false => (self.k - 1) * self.sak + (rows - 1) * self.sam + 1,
        }
    }

    /// (first row, rows, elements) of each window over `m` rows.
    pub fn windows(&self, m: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..m).step_by(self.rows.max(1)).map(move |m0| {
            let rows = self.rows.min(m - m0);
            (m0, rows, self.elems(rows))
        })
    }
}
