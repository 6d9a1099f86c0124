//! The fused layer-norm kernels (`shaders/layer_norm_*.wgsl`): the forward pass, the input
//! gradient, and the weight and bias gradients' partial sums, specialised per storage dtype
//! and per unit (an element, or a vec4 of them where rows are whole vec4s at aligned offsets).

use crate::base::DType;

/// Which of the three passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerNormPass {
    /// y, and each row's mean and rstd.
    Forward,
    /// The input gradient.
    BackwardInput,
    /// The weight and bias gradients' per-chunk partial sums (f32).
    BackwardParams,
}

/// One layer-norm kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerNormKernel {
    /// The pass.
    pub pass: LayerNormPass,
    /// The storage dtype of x, the weight, the bias and the outputs (f32 arithmetic).
    pub dtype: DType,
    /// Rows of whole vec4s at vec4-aligned offsets, read and written a vec4 at a time.
    pub vec4: bool,
    /// One invocation per row, 64 rows a workgroup, no barriers (CPU adapters), instead of a
    /// workgroup of `LAYER_NORM_WG` per row. (The weight-gradient pass has one form.)
    pub serial: bool,
}

/// Invocations of a forward or input-gradient workgroup (one row each).
pub const LAYER_NORM_WG: u32 = 128;

impl LayerNormKernel {
    /// Every variant, for validation.
    pub fn all() -> Vec<LayerNormKernel> {
        let passes = [
            LayerNormPass::Forward,
            LayerNormPass::BackwardInput,
            LayerNormPass::BackwardParams,
        ];
        passes
            .into_iter()
            .flat_map(|pass| {
                [DType::F32, DType::F16].into_iter().flat_map(move |dtype| {
                    [(false, false), (true, false), (false, true), (true, true)].map(
                        |(vec4, serial)| LayerNormKernel {
                            pass,
                            dtype,
                            vec4,
                            serial,
                        },
                    )
                })
            })
            .collect()
    }

    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let pass = match self.pass {
            LayerNormPass::Forward => "fwd",
            LayerNormPass::BackwardInput => "bwd",
            LayerNormPass::BackwardParams => "wgrad",
        };
        let unit = if self.vec4 { "_vec4" } else { "" };
        let form = if self.serial { "_serial" } else { "" };
        format!("layer_norm_{pass}_{}{unit}{form}", self.dtype)
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        let body = match self.pass {
            LayerNormPass::Forward => include_str!("../../shaders/layer_norm_fwd.wgsl"),
            LayerNormPass::BackwardInput => include_str!("../../shaders/layer_norm_bwd.wgsl"),
            LayerNormPass::BackwardParams => include_str!("../../shaders/layer_norm_wgrad.wgsl"),
        };
        let (lanes, first) = match self.vec4 {
            true => ("return dot(v, vec4<f32>(1.0));", "f32(x[base].x)"),
            false => ("return v;", "f32(x[base])"),
        };
        let src = body
            .replace(
                "{{COMMON}}",
                include_str!("../../shaders/layer_norm_common.wgsl"),
            )
            .replace("{{LANES}}", lanes)
            .replace("{{WG}}", if self.serial { "1" } else { "128" })
            .replace("{{WG_SIZE}}", if self.serial { "64" } else { "128" })
            .replace(
                "{{ROW}}",
                match self.serial {
                    true => "return (wid.x + wid.y * nw.x) * 64u + lid;",
                    false => "return wid.x + wid.y * nw.x;",
                },
            )
            .replace(
                "{{LANE}}",
                if self.serial {
                    "return 0u;"
                } else {
                    "return lid;"
                },
            )
            .replace(
                "{{SUM2}}",
                match self.serial {
                    true => "return vec2<f32>(a, b);",
                    false => "return sum2_tree(a, b, li);",
                },
            )
            .replace("{{FIRST}}", first);
        super::float_io(&src, self.dtype, self.vec4).into_owned()
    }
}
