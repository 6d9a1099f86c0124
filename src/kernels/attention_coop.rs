//! Flash attention on cooperative matrices (tensor cores) for f16 storage
//! (`shaders/flash_attn_coop_*.wgsl`): the same three passes, immediates and bindings as the
//! SIMT kernels (`attention.rs`), with every product of a tile (`q k^T`, `dO v^T`, `P v`,
//! `dS k`, `P^T dO`, `dS^T q`) on 16 x 16 x 16 matrices with f32 accumulators. A workgroup is
//! four subgroups of 32, each owning 16 of the workgroup's 64 rows; tiles are 32 keys (or
//! queries) deep. The elementwise work between products (softmax, masks, dropout, dS) is done
//! by the lanes on the f32 results stored in workgroup memory, two lanes per row. This module
//! writes the unrolled matrix code the templates leave as `{{...}}` (WGSL has no arrays of
//! cooperative matrices).

use super::attention::{FlashAttnKernel, FlashPass};
use std::fmt::Write;

/// Keys (or queries) of a tile.
pub(super) const COOP_BT: u32 = 32;

/// Workgroup memory the largest pass needs for head-dim class `dp`, in bytes: the forward's
/// two buffers of 2 x 32 staged rows, 64 rows of f16 probabilities and a patch as wide as the
/// head (40,960 bytes at 64); the dK/dV pass's two buffers, two f32 patches and two f16 patches of 64 rows, and the
/// double-buffered log-sum-exps and deltas of a tile (47,616 bytes at 64, inside the 48 KiB
/// NVIDIA's Vulkan offers).
pub(super) fn shared_bytes(dp: u32) -> u32 {
    let f = Layout::new(dp, true);
    let fwd = 2 * 2 * COOP_BT * f.rs4 * 8 + 64 * f.rp4 * 8 + 64 * f.pw4 * 16;
    let b = Layout::new(dp, false);
    let kv = 2 * 2 * COOP_BT * b.rs4 * 8;
    let dkdv = kv + 2 * 64 * b.pw4 * 16 + 2 * 64 * b.rp4 * 8 + 2 * 2 * COOP_BT * 4;
    fwd.max(dkdv)
}

/// Row strides, in vectors: a staged row (vec4<f16>), a probabilities row (vec4<f16>), a patch
/// row (vec4<f32>; the forward's holds a row of P v, the head dim wide, else a tile's scores).
#[derive(Clone, Copy)]
struct Layout {
    dp: u32,
    rs4: u32,
    rp4: u32,
    pw4: u32,
}

impl Layout {
    fn new(dp: u32, wide_patch: bool) -> Layout {
        let pw = if wide_patch { dp.max(COOP_BT) } else { COOP_BT };
        Layout {
            dp,
            rs4: (dp + 8) / 4,
            rp4: (COOP_BT + 8) / 4,
            pw4: (pw + 4) / 4,
        }
    }

    /// `let {name}{kk} = ...`: operand A of the subgroup's 16 rows of `kv` (a staged row of
    /// `RS4` vectors), for each 16 columns of the head dim.
    fn load_a(&self, name: &str) -> String {
        operands_a(name, "kv", ("RS4", self.rs4), self.dp / 16, "    ")
    }

    /// Operand B from the staged rows of the current tile's buffer of `kv` (at `kvb`): the
    /// 16 x 16 block at 16-row block `row` and 16-column block `col`, loaded with `load`
    /// (`coopLoad` reads it transposed).
    fn rows_b(&self, load: &str, row: u32, col: u32) -> String {
        format!(
            "{load}<coop_mat16x16<f16, B>>(&kv[kvb + {}u], {}u)",
            (row * 16) * self.rs4 + col * 4,
            self.rs4
        )
    }

    /// One 16 x 16 product `sum_i a_i b_i` into a fresh matrix, stored row-major into `patch`
    /// at the subgroup's column block `col`.
    fn stored_product(&self, terms: &[(String, String)], patch: &str, col: u32) -> String {
        let mut s = String::from("        {\n            var x = coop_mat16x16<f32, C>();\n");
        for (a, b) in terms {
            let _ = writeln!(s, "            x = coopMultiplyAdd({a}, {b}, x);");
        }
        let _ = writeln!(
            s,
            "            let at = own + {}u;\n            coopStoreT(x, &{patch}[at], {}u);\n        }}",
            col * 4,
            self.pw4
        );
        s
    }

    /// Products of a subgroup's operands `a{kk}` with the transposes of the tile's staged rows
    /// from row `first` of `kv` (its keys or queries), stored row-major into `patch`.
    fn scores(&self, a: &str, first: u32, patch: &str) -> String {
        (0..COOP_BT / 16)
            .map(|t| {
                let terms: Vec<_> = (0..self.dp / 16)
                    .map(|kk| {
                        (
                            format!("{a}{kk}"),
                            self.rows_b("coopLoad", first / 16 + t, kk),
                        )
                    })
                    .collect();
                self.stored_product(&terms, patch, t)
            })
            .collect()
    }

    /// The forward's `P v`: operands `pa{t}` times the tile's staged values (rows from
    /// `COOP_BT`), stored row-major into the patch, per 16 columns of the head dim.
    fn pv(&self) -> String {
        let mut s = self.load_tile_a("pa", "ps");
        for c in 0..self.dp / 16 {
            let terms: Vec<_> = (0..COOP_BT / 16)
                .map(|t| {
                    (
                        format!("pa{t}"),
                        self.rows_b("coopLoadT", COOP_BT / 16 + t, c),
                    )
                })
                .collect();
            s += &self.stored_product(&terms, "res", c);
        }
        s
    }

    /// `let {name}{t} = ...`: the subgroup's 16 rows of f16 values in `buf` (rows of `RP4`
    /// vectors) as operand A, for each 16 columns of the tile.
    fn load_tile_a(&self, name: &str, buf: &str) -> String {
        operands_a(name, buf, ("RP4", self.rp4), COOP_BT / 16, "        ")
    }

    /// `acc{c} += sum_t a{t} * rows(first + 16 t, 16 c)`: the tile's staged rows from `first`
    /// as operand B, per 16 columns of the head dim.
    fn accumulate(&self, a: &str, first: u32, acc: &str) -> String {
        let mut s = String::new();
        for c in 0..self.dp / 16 {
            for t in 0..COOP_BT / 16 {
                let b = self.rows_b("coopLoadT", first / 16 + t, c);
                let _ = writeln!(
                    s,
                    "        {acc}{c} = coopMultiplyAdd({a}{t}, {b}, {acc}{c});"
                );
            }
        }
        s
    }

    fn acc_init(&self, acc: &str) -> String {
        (0..self.dp / 16)
            .map(|c| format!("    var {acc}{c} = coop_mat16x16<f32, C>();\n"))
            .collect()
    }

    /// Writes accumulators `acc{c}` times `factor` as f16 into `out` (rows of `width` for each
    /// of the `len` rows of (b, h) `n`), a 16-column matrix at a time through the patch; lane
    /// pair `row` writes its row, eight columns each.
    fn epilogue(
        &self,
        acc: &str,
        out: &str,
        (row, len, width): (&str, &str, &str),
        factor: &str,
    ) -> String {
        let mut s = String::new();
        for c in 0..self.dp / 16 {
            let _ = writeln!(
                s,
                "    workgroupBarrier();\n    {{\n        let at = own;\n        \
                 coopStoreT({acc}{c}, &res[at], {pw4}u);\n    }}\n    workgroupBarrier();\n    \
                 if {row} < {len} && {c16}u + h * 8u < {width} {{\n        \
                 {out}[row_out(n, {row}, {len}, {width} / 8u) + {c2}u + h] = \
                 pack8(res[mine + h * 2u] * {factor}, res[mine + h * 2u + 1u] * {factor});\n    }}",
                pw4 = self.pw4,
                c16 = c * 16,
                c2 = c * 2,
            );
        }
        s
    }
}

/// `let {name}{i} = ...` for `count` 16-column blocks: operand A of the subgroup's 16 rows
/// of `buf`, whose rows are `stride` vectors (`stride.0` names the constant).
fn operands_a(name: &str, buf: &str, stride: (&str, u32), count: u32, indent: &str) -> String {
    let mut s = format!("{indent}let {name}_base = sg * 16u * {};\n", stride.0);
    for i in 0..count {
        let _ = writeln!(
            s,
            "{indent}let {name}{i} = coopLoadT<coop_mat16x16<f16, A>>(&{buf}[{name}_base + {}u], {}u);",
            i * 4,
            stride.1
        );
    }
    s
}

/// The WGSL of a cooperative-matrix pass.
pub(super) fn source(k: &FlashAttnKernel) -> String {
    let bt = COOP_BT;
    let forward = k.pass == FlashPass::Forward;
    let l = Layout::new(k.dp, forward);
    let body = match k.pass {
        FlashPass::Forward => include_str!("../../shaders/flash_attn_coop_fwd.wgsl"),
        FlashPass::BackwardDq => include_str!("../../shaders/flash_attn_coop_dq.wgsl"),
        FlashPass::BackwardDkDv => include_str!("../../shaders/flash_attn_coop_dkdv.wgsl"),
    };
    let mut src = body.to_string();
    let mut put = |key: &str, val: String| src = src.replace(&format!("{{{{{key}}}}}"), &val);
    match k.pass {
        FlashPass::Forward => {
            put("LOAD_QA", l.load_a("qa"));
            put("SCORES", l.scores("qa", 0, "res"));
            put("PV", l.pv());
        }
        FlashPass::BackwardDq => {
            put("LOAD_QA", l.load_a("qa"));
            put("LOAD_DA", l.load_a("da"));
            put("ACC_INIT", l.acc_init("dqa"));
            put(
                "SCORES",
                l.scores("qa", 0, "res") + &l.scores("da", bt, "res2"),
            );
            put(
                "ACCUMULATE",
                l.load_tile_a("sa", "ps") + &l.accumulate("sa", 0, "dqa"),
            );
            put(
                "EPILOGUE",
                l.epilogue("dqa", "dq", ("i", "p.lq", "p.d"), "p.scale"),
            );
        }
        FlashPass::BackwardDkDv => {
            put("LOAD_KA", l.load_a("ka"));
            put("LOAD_VA", l.load_a("va"));
            put("ACC_INIT", l.acc_init("dka") + &l.acc_init("dva"));
            put(
                "SCORES",
                l.scores("ka", 0, "res") + &l.scores("va", bt, "res2"),
            );
            put(
                "ACCUMULATE",
                l.load_tile_a("pa", "ps")
                    + &l.accumulate("pa", bt, "dva")
                    + &l.load_tile_a("sa", "ps2")
                    + &l.accumulate("sa", 0, "dka"),
            );
            put(
                "EPILOGUE",
                l.epilogue("dka", "dk", ("j", "p.lk", "p.d"), "p.scale")
                    + &l.epilogue("dva", "dv", ("j", "p.lk", "p.dv"), "1.0"),
            );
        }
    }
    let shared = include_str!("../../shaders/flash_attn_coop_common.wgsl")
        .replace("{{RS4}}", &l.rs4.to_string())
        .replace("{{RP4}}", &l.rp4.to_string())
        .replace("{{PW4}}", &l.pw4.to_string());
    let common = k.common_source();
    src.replace("{{COOP_SHARED}}", &shared)
        .replace("{{COMMON}}", &common)
        .replace(
            "{{ENABLES}}",
            "enable f16;\nenable wgpu_cooperative_matrix;",
        )
        .replace("{{DP}}", &k.dp.to_string())
        .replace("{{BT}}", &bt.to_string())
        .replace("{{T}}", "f16")
}
