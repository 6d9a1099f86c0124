//! Specialises `shaders/softmax.wgsl` per (dtype, vec4 or strided rows).

use crate::base::DType;

/// One softmax kernel (forward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxKernel {
    /// The tensors' dtype.
    pub dtype: DType,
    /// Contiguous rows of whole vec4s.
    pub vector: bool,
    /// One invocation per row (`softmax_serial.wgsl`) instead of a workgroup per row.
    pub serial: bool,
}

impl SoftmaxKernel {
    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        format!(
            "softmax_{}_{}_{}",
            self.dtype,
            if self.vector { "vec4" } else { "strided" },
            if self.serial { "serial" } else { "tree" }
        )
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        let t = if self.dtype == DType::F16 {
            "f16"
        } else {
            "f32"
        };
        let (tx, load, store) = if self.vector {
            (
                format!("vec4<{t}>"),
                "return vec4<f32>(x[p.off + e]);".to_string(),
                format!("out[e] = vec4<{t}>(v);"),
            )
        } else {
            (
                t.to_string(),
                "return vec4<f32>(f32(x[offset(e)]), neg_inf(), neg_inf(), neg_inf());".to_string(),
                format!("out[e] = {t}(v.x);"),
            )
        };
        let main = if self.serial {
            include_str!("../../shaders/softmax_serial.wgsl")
        } else {
            include_str!("../../shaders/softmax_tree.wgsl")
        };
        include_str!("../../shaders/softmax.wgsl")
            .replace("{{MAIN}}", main)
            .replace(
                "{{ENABLES}}",
                if self.dtype == DType::F16 {
                    "enable f16;"
                } else {
                    ""
                },
            )
            .replace("{{TX}}", &tx)
            .replace("{{LOAD}}", &load)
            .replace("{{STORE}}", &store)
    }

    /// The backward's kernel name (`shaders/softmax_backward.wgsl`).
    pub fn backward_name(&self) -> String {
        format!(
            "softmax_backward{}_{}{}",
            if self.serial { "" } else { "_tree" },
            self.dtype,
            if self.vector { "_vec4" } else { "" }
        )
    }

    /// `shaders/softmax_backward.wgsl` for these rows: vec4 units, or one element in lane x of
    /// a vec4 whose other lanes are 0. (Its entry point, `main` or `rows_tree`, picks serial.)
    pub fn backward_source(&self) -> String {
        let (tx, load, store) = match self.vector {
            true => (
                "vec4<{{T}}>",
                "return vec4<f32>(SRC[at]);",
                "out[at] = vec4<{{T}}>(v);",
            ),
            false => (
                "{{T}}",
                "return vec4<f32>(f32(SRC[at]), 0.0, 0.0, 0.0);",
                "out[at] = {{T}}(v.x);",
            ),
        };
        super::per_dtype(
            &include_str!("../../shaders/softmax_backward.wgsl")
                .replace("{{TX}}", tx)
                .replace("{{LOAD_Y}}", &load.replace("SRC", "y"))
                .replace("{{LOAD_G}}", &load.replace("SRC", "g"))
                .replace("{{STORE}}", store),
            self.dtype,
        )
        .into_owned()
    }

    /// Every variant, for validation.
    pub fn all() -> Vec<SoftmaxKernel> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16] {
            for vector in [true, false] {
                for serial in [false, true] {
                    v.push(SoftmaxKernel {
                        dtype,
                        vector,
                        serial,
                    });
                }
            }
        }
        v
    }
}
