//! The implicit-GEMM convolution kernels (`shaders/conv_gemm*.wgsl` on the 128-tile engine):
//! which product a variant computes (`ConvMode`), its tile, and how its WGSL is assembled from
//! the shared pieces and the mode's operand access.

use super::matmul128::{self, tiled_128};
use crate::base::DType;

/// Which product of a convolution an implicit-GEMM kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvMode {
    /// The output from the input and the weight.
    Fwd,
    /// The input's gradient from the output's and the weight.
    Dgrad,
    /// f32 partials of the weight's gradient from the output's gradient and the input.
    Wgrad,
    /// `Fwd` from an NHWC input on vec4 loads (f32, one group, channels a multiple of 16).
    FwdVec4,
    /// `Wgrad` from NHWC copies of the output's gradient and the input on vec4 loads (f32, one
    /// group, channels multiples of 4).
    WgradVec4,
    /// A pointwise convolution (1x1, stride 1, no padding) straight from NCHW on vec4 loads:
    /// the forward pass, or the input's gradient with the weight transposed (f32, one group,
    /// reduced channels a multiple of 16, pixels per image of 4).
    Pointwise,
    /// The pointwise convolution's weight gradient from NCHW on vec4 loads (pixels per image
    /// a multiple of 4).
    PointwiseWgrad,
}

impl ConvMode {
    /// Whether the mode runs on vec4 operands (f32 only; `Io::ConvVec4`).
    pub fn vec4(self) -> bool {
        matches!(
            self,
            ConvMode::FwdVec4
                | ConvMode::WgradVec4
                | ConvMode::Pointwise
                | ConvMode::PointwiseWgrad
        )
    }

    /// Whether the mode writes the output through `conv_gemm_out4.wgsl`'s strided store.
    pub fn out4(self) -> bool {
        matches!(self, ConvMode::FwdVec4 | ConvMode::Pointwise)
    }

    /// Whether the mode writes split f32 partials of the weight's gradient.
    pub fn wgrad(self) -> bool {
        matches!(
            self,
            ConvMode::Wgrad | ConvMode::WgradVec4 | ConvMode::PointwiseWgrad
        )
    }
}

/// One implicit-GEMM convolution kernel: its mode, the tensors' dtype (f32 or f16, f32
/// accumulation), padded (33 KiB) or swizzled (32 KiB) shared rows as `Matmul128`, and a
/// tile of 64 rows instead of 128 (`bm64`: for 64 channels, the common case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGemm {
    /// Forward, input gradient or weight gradient, and how the operands are read.
    pub mode: ConvMode,
    /// The tensors' dtype.
    pub dtype: DType,
    /// Shared rows padded (33 KiB) rather than swizzled (32 KiB).
    pub padded: bool,
    /// A tile of 64 rows instead of 128.
    pub bm64: bool,
    /// A 64x256 tile (`FwdVec4` with 64 rows, where a workgroup may have 48 KiB of shared
    /// memory: three tiles with padded rows, 42.5 KiB; `padded` does not apply).
    pub wide: bool,
}

impl ConvGemm {
    pub(super) fn all() -> Vec<ConvGemm> {
        let mut v = Vec::new();
        for mode in [
            ConvMode::Fwd,
            ConvMode::Dgrad,
            ConvMode::Wgrad,
            ConvMode::FwdVec4,
            ConvMode::WgradVec4,
            ConvMode::Pointwise,
            ConvMode::PointwiseWgrad,
        ] {
            for dtype in [DType::F32, DType::F16] {
                if mode.vec4() && dtype != DType::F32 {
                    continue;
                }
                for padded in [false, true] {
                    for bm64 in [false, true] {
                        v.push(ConvGemm {
                            mode,
                            dtype,
                            padded,
                            bm64,
                            wide: false,
                        });
                    }
                }
                if mode == ConvMode::FwdVec4 {
                    v.push(ConvGemm {
                        mode,
                        dtype,
                        padded: false,
                        bm64: true,
                        wide: true,
                    });
                }
            }
        }
        v
    }

    /// Rows of output a workgroup computes (64 or 128).
    pub fn bm(&self) -> u32 {
        if self.bm64 {
            64
        } else {
            128
        }
    }

    pub(super) fn source(&self) -> String {
        let window = include_str!("../../shaders/conv_gemm_window.wgsl");
        let io = match self.mode {
            ConvMode::Fwd => format!(
                "{}{window}",
                include_str!("../../shaders/conv_gemm_fwd.wgsl")
            ),
            ConvMode::Dgrad => format!(
                "{}{window}",
                include_str!("../../shaders/conv_gemm_dgrad.wgsl")
            ),
            ConvMode::Wgrad => include_str!("../../shaders/conv_gemm_wgrad.wgsl").to_string(),
            ConvMode::FwdVec4 => include_str!("../../shaders/conv_gemm_fwd4.wgsl").to_string(),
            ConvMode::WgradVec4 => include_str!("../../shaders/conv_gemm_wgrad4.wgsl").to_string(),
            ConvMode::Pointwise => include_str!("../../shaders/conv_gemm_pw.wgsl").to_string(),
            ConvMode::PointwiseWgrad => {
                include_str!("../../shaders/conv_gemm_pw_wgrad.wgsl").to_string()
            }
        };
        // The pieces the modes share: the vec4 tile, the output store, the wgrad partials.
        let shared = [
            (
                self.mode.vec4(),
                include_str!("../../shaders/conv_gemm_tile4.wgsl"),
            ),
            (
                self.mode.out4(),
                include_str!("../../shaders/conv_gemm_out4.wgsl"),
            ),
            (
                self.mode.wgrad(),
                include_str!("../../shaders/conv_gemm_partials.wgsl"),
            ),
        ];
        let io = shared
            .iter()
            .filter(|(used, _)| *used)
            .map(|(_, src)| *src)
            .chain([io.as_str()])
            .collect::<Vec<_>>()
            .join("\n");
        let (v, kind) = if self.mode.vec4() {
            let (bm, wide) = (self.bm(), self.wide);
            ("vec4<f32>", matmul128::Io::ConvVec4 { bm, wide })
        } else {
            ("{{T}}", matmul128::Io::Conv { bm: self.bm() })
        };
        // wgrad's partials stay f32 whatever the tensors' dtype.
        let o = if self.mode.wgrad() { "f32" } else { "{{T}}" };
        let io = format!("{}\n{io}", include_str!("../../shaders/conv_gemm.wgsl"))
            .replace("{{V}}", v)
            .replace("{{O}}", o)
            .replace("{{BM}}", &self.bm().to_string());
        tiled_128(&io, "", self.dtype, self.padded, kind)
    }

    pub(super) fn name(&self) -> String {
        let mode = match self.mode {
            ConvMode::Fwd => "fwd",
            ConvMode::Dgrad => "dgrad",
            ConvMode::Wgrad => "wgrad",
            ConvMode::FwdVec4 => "fwd_vec4",
            ConvMode::WgradVec4 => "wgrad_vec4",
            ConvMode::Pointwise => "pointwise",
            ConvMode::PointwiseWgrad => "pointwise_wgrad",
        };
        format!(
            "conv_gemm_{mode}_{}_{}{}{}",
            self.dtype,
            self.bm(),
            if self.wide { "x256" } else { "" },
            if self.padded { "_padded" } else { "" }
        )
    }
}
