//! Specialises `shaders/reduce_sum.wgsl` per (input dtype, output dtype, contiguity).

use crate::tensor::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceKernel {
    pub input: DType,
    pub output: DType,
    pub contiguous: bool,
    /// Contiguous rows of whole vec4s: 16-byte loads.
    pub vector: bool,
}

fn wgsl_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        _ => "f32",
    }
}

impl ReduceKernel {
    pub fn name(&self) -> String {
        format!(
            "sum_{}_{}_{}",
            self.input,
            self.output,
            if self.contiguous { "contig" } else { "strided" }
        )
    }

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
            (
                format!("vec4<{ti}>"),
                "vec4<f32>",
                "vec4<f32>(x[p.off + e])",
                "s.x + s.y + s.z + s.w",
            )
        } else {
            (ti.to_string(), "f32", "f32(x[offset(e)])", "s")
        };
        include_str!("../../shaders/reduce_sum.wgsl")
            .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
            .replace("{{TI}}", &ti)
            .replace("{{ACC}}", acc)
            .replace("{{LOAD}}", load)
            .replace("{{HSUM}}", hsum)
            .replace("{{TO}}", wgsl_type(self.output))
            .replace("{{OFFSET}}", offset)
    }

    pub fn all() -> Vec<ReduceKernel> {
        let mut v = Vec::new();
        for (input, output) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F16),
            (DType::F16, DType::F32),
            (DType::F32, DType::F16),
        ] {
            for (contiguous, vector) in [(true, true), (true, false), (false, false)] {
                v.push(ReduceKernel {
                    input,
                    output,
                    contiguous,
                    vector,
                });
            }
        }
        v
    }
}
