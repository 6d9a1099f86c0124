//! Specialises `shaders/reduce.wgsl` per (op, input dtype, output dtype, layout).

use crate::base::DType;

/// Associative reductions (so that rows can be split across workgroups and merged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl ReduceOp {
    /// Every reduction op.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min];

    /// PyTorch's name (`sum`, `prod`, `amax`, `amin`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "amax",
            ReduceOp::Min => "amin",
        }
    }

    /// The identity, as WGSL evaluated at run time (naga refuses infinite constants).
    fn identity(self) -> &'static str {
        match self {
            ReduceOp::Sum => "0.0",
            ReduceOp::Prod => "1.0",
            ReduceOp::Max => "bitcast<f32>(0xff800000u | p.pad)",
            ReduceOp::Min => "bitcast<f32>(0x7f800000u | p.pad)",
        }
    }

    /// `a op b` in WGSL, with `nan` the NaN test for the operand type (`nan1` for f32, `nan4`
    /// for vec4<f32>; built-ins and `select` work per component). max and min propagate NaN.
    fn combine(self, nan: &str) -> String {
        match self {
            ReduceOp::Sum => "a + b".into(),
            ReduceOp::Prod => "a * b".into(),
            ReduceOp::Max => format!("select(select(max(a, b), a, {nan}(a)), b, {nan}(b))"),
            ReduceOp::Min => format!("select(select(min(a, b), a, {nan}(a)), b, {nan}(b))"),
        }
    }

    /// The CPU reference's fold (f64).
    pub fn cpu(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Max if a.is_nan() || b.is_nan() => f64::NAN,
            ReduceOp::Min if a.is_nan() || b.is_nan() => f64::NAN,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }

    /// The op's identity (0 for a sum, 1 for a product, -inf/inf for max/min).
    pub fn cpu_identity(self) -> f64 {
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
        }
    }
}

/// How a chunk of a row is split among invocations and merged (the candidates that autotuning
/// times; `Tree` is the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceStrategy {
    /// 256 invocations per chunk, merged by a tree in workgroup memory.
    Tree,
    /// 256 invocations per chunk, merged by subgroup operations (adapters with subgroups).
    Subgroup,
    /// One invocation per chunk, no workgroup memory and no barrier.
    Serial,
    /// 64 invocations per chunk reading it interleaved, each writing its own partial (no
    /// workgroup memory, no barrier).
    Interleaved,
    /// `Serial` over f32 rows of whole 32-byte words, each read as one `vec4<u64>` and split
    /// into two `vec4<f32>` (adapters with 64-bit integers). For llvmpipe (Mesa 22.3), which
    /// loads a storage buffer one component at a time, each load behind its own branches: a
    /// 64-bit component moves twice the bytes for the same branches (the 2^22 sum on two cores:
    /// 24-26 GB/s against 17-19 for 16-byte loads, in a bare wgpu program).
    SerialWide,
}

impl ReduceStrategy {
    /// Every strategy.
    pub const ALL: [ReduceStrategy; 5] = [
        ReduceStrategy::Tree,
        ReduceStrategy::Subgroup,
        ReduceStrategy::Serial,
        ReduceStrategy::Interleaved,
        ReduceStrategy::SerialWide,
    ];

    /// The strategy's name, as the tuner prints it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceStrategy::Tree => "tree",
            ReduceStrategy::Subgroup => "subgroup",
            ReduceStrategy::Serial => "serial",
            ReduceStrategy::Interleaved => "interleaved",
            ReduceStrategy::SerialWide => "serial_wide",
        }
    }

    /// Invocations per workgroup.
    pub fn workgroup(self) -> u32 {
        match self {
            ReduceStrategy::Serial | ReduceStrategy::Interleaved | ReduceStrategy::SerialWide => 64,
            _ => 256,
        }
    }

    /// Outputs (partials) one chunk writes.
    pub fn outputs_per_chunk(self) -> usize {
        match self {
            ReduceStrategy::Interleaved => 64,
            _ => 1,
        }
    }

    /// Units (elements or vec4s) one workgroup's chunk spans before a row is split.
    pub fn chunk_units(self) -> usize {
        match self {
            // 16 units per invocation.
            ReduceStrategy::Tree | ReduceStrategy::Subgroup => 4096,
            // One invocation's run: long enough that the merge passes stay small.
            ReduceStrategy::Serial => 256,
            // The same bytes as Serial's 256 vec4s.
            ReduceStrategy::SerialWide => 128,
            // 256 units per invocation.
            ReduceStrategy::Interleaved => 16384,
        }
    }
}

/// One reduction kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceKernel {
    /// The reduction.
    pub op: ReduceOp,
    /// The input's dtype.
    pub input: DType,
    /// The output's dtype.
    pub output: DType,
    /// Rows laid out contiguously (a reduction over the last dims).
    pub contiguous: bool,
    /// Contiguous rows of whole vec4s: 16-byte loads (32-byte ones in `SerialWide`).
    pub vector: bool,
    /// How the kernel walks a row.
    pub strategy: ReduceStrategy,
}

fn wgsl_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        _ => "f32",
    }
}

impl ReduceKernel {
    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let layout = match (self.contiguous, self.vector) {
            (true, true) => "vec4",
            (true, false) => "contig",
            _ => "strided",
        };
        format!(
            "{}_{}_{}_{layout}_{}",
            self.op.name(),
            self.input,
            self.output,
            self.strategy.name()
        )
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        let offset = if self.contiguous {
            "return p.off + e;"
        } else {
            "var rem = e;\n    var o = p.off;\n    for (var d = i32(p.rank) - 1; d >= 0; d--) {\n        \
             let q = u32(d) / 4u;\n        let r = u32(d) % 4u;\n        let n = p.shape[q][r];\n        \
             o += (rem % n) * p.stride[q][r];\n        rem = rem / n;\n    }\n    return o;"
        };
        let f16 = self.input == DType::F16 || self.output == DType::F16;
        let ti = wgsl_type(self.input);
        let (ti, acc, load, hsum) = if self.vector {
            // SerialWide reads a 32-byte word where the others read a vec4.
            let (ti, load) = if self.strategy == ReduceStrategy::SerialWide {
                ("vec4<u64>".to_string(), "wide(x[p.off + e])")
            } else {
                (format!("vec4<{ti}>"), "vec4<f32>(x[p.off + e])")
            };
            (
                ti,
                "vec4<f32>",
                load,
                "combine1(combine1(s.x, s.y), combine1(s.z, s.w))",
            )
        } else {
            (ti.to_string(), "f32", "f32(x[offset(e)])", "s")
        };
        let main = match self.strategy {
            ReduceStrategy::Tree => include_str!("../../shaders/reduce_tree.wgsl"),
            ReduceStrategy::Subgroup => include_str!("../../shaders/reduce_subgroup.wgsl"),
            ReduceStrategy::Serial => include_str!("../../shaders/reduce_serial.wgsl"),
            ReduceStrategy::Interleaved => include_str!("../../shaders/reduce_interleaved.wgsl"),
            ReduceStrategy::SerialWide => concat!(
                include_str!("../../shaders/reduce_serial.wgsl"),
                "\n// A 32-byte word of x as eight f32s, merged pairwise into four.\n\
                 fn wide(v: vec4<u64>) -> vec4<f32> {\n    \
                 let lo = bitcast<vec4<f32>>(vec4<u32>(v & vec4<u64>(0xfffffffflu)));\n    \
                 let hi = bitcast<vec4<f32>>(vec4<u32>(v >> vec4<u32>(32u)));\n    \
                 return combine(lo, hi);\n}\n"
            ),
        };
        let subgroup = match self.op {
            ReduceOp::Sum => "subgroupAdd(v)".to_string(),
            ReduceOp::Prod => "subgroupMul(v)".to_string(),
            ReduceOp::Max | ReduceOp::Min => format!(
                "select({}(v), bitcast<f32>(0x7fc00000u | p.pad), subgroupAny(nan1(v)))",
                if self.op == ReduceOp::Max {
                    "subgroupMax"
                } else {
                    "subgroupMin"
                }
            ),
        };
        include_str!("../../shaders/reduce.wgsl")
            .replace("{{MAIN}}", main)
            .replace("{{SUBGROUP}}", &subgroup)
            .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
            .replace("{{TI}}", &ti)
            .replace("{{ACC}}", acc)
            .replace("{{LOAD}}", load)
            .replace("{{HSUM}}", hsum)
            .replace("{{IDENTITY}}", self.op.identity())
            .replace("{{COMBINE1}}", &self.op.combine("nan1"))
            .replace(
                "{{COMBINE}}",
                &self.op.combine(if self.vector { "nan4" } else { "nan1" }),
            )
            .replace("{{TO}}", wgsl_type(self.output))
            .replace("{{OFFSET}}", offset)
    }

    /// Every variant, for validation.
    pub fn all() -> Vec<ReduceKernel> {
        let mut v = Vec::new();
        for op in ReduceOp::ALL {
            for (input, output) in [
                (DType::F32, DType::F32),
                (DType::F16, DType::F16),
                (DType::F16, DType::F32),
                (DType::F32, DType::F16),
            ] {
                for (contiguous, vector) in [(true, true), (true, false), (false, false)] {
                    for strategy in ReduceStrategy::ALL {
                        // 32-byte words of f32 only.
                        if strategy == ReduceStrategy::SerialWide
                            && !(vector && input == DType::F32)
                        {
                            continue;
                        }
                        v.push(ReduceKernel {
                            op,
                            input,
                            output,
                            contiguous,
                            vector,
                            strategy,
                        });
                    }
                }
            }
        }
        v
    }
}
