//! The registry of kernel variants: every `Kernel` there is, for validation
//! (`tests/kernels.rs` parses and validates each with naga, as wgpu compiles it).

use super::{
    BatchNormPass, ConvGemm, CoopLayout, CoopTile, ElementwiseKernel, FlashAttnKernel, Kernel,
    LayerNormKernel, MatmulWide, Narrow, OptimKernel, PredicateKernel, ReduceKernel, RowCopy,
    SoftmaxKernel, Vec4Layout, SGD_MULTI,
};
use crate::base::DType;

impl Kernel {
    /// Every variant, for validation.
    pub fn all() -> Vec<Kernel> {
        std::iter::once(Kernel::Fill)
            .chain(
                ElementwiseKernel::all()
                    .into_iter()
                    .map(Kernel::Elementwise),
            )
            .chain(ReduceKernel::all().into_iter().map(Kernel::Reduce))
            .chain([DType::F32, DType::F16, DType::I32, DType::U32].map(Kernel::Transpose))
            .chain([Kernel::TransposePairs, Kernel::TransposeWords])
            .chain([DType::F32, DType::F16].map(Kernel::TransposeTwo))
            .chain(SoftmaxKernel::all().into_iter().map(Kernel::Softmax))
            .chain([DType::F32, DType::F16].map(Kernel::Matmul))
            .chain([DType::F32, DType::F16].map(Kernel::MatmulReg))
            .chain(MatmulWide::all().into_iter().map(Kernel::MatmulWide))
            .chain(
                [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|d| [Kernel::Matmul128(d, false), Kernel::Matmul128(d, true)]),
            )
            .chain(
                Vec4Layout::all()
                    .into_iter()
                    .flat_map(|l| [false, true].map(|padded| Kernel::Matmul128Vec4(padded, l))),
            )
            .chain(
                [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|d| Narrow::ALL.map(move |c| Kernel::MatmulNarrow(d, c))),
            )
            .chain([DType::F32, DType::F16].map(Kernel::MatmulHeadGrads))
            .chain(PredicateKernel::all().into_iter().map(Kernel::Predicate))
            .chain([DType::F32, DType::F16].map(Kernel::Random))
            .chain([DType::F32, DType::F16].map(Kernel::ArgReduce))
            .chain([DType::F32, DType::F16, DType::I32, DType::U32].map(Kernel::Gather))
            .chain([DType::F32, DType::F16].map(Kernel::Conv2d))
            .chain([DType::F32, DType::F16].map(Kernel::Pool2d))
            .chain([DType::F32, DType::F16].map(Kernel::Pool2dArgmax))
            .chain([DType::F32, DType::F16].map(Kernel::Pool2dBackward))
            .chain([DType::F32, DType::I32].map(Kernel::ScatterAdd))
            .chain(
                CoopTile::ALL
                    .into_iter()
                    .flat_map(|t| CoopLayout::ALL.map(|l| Kernel::MatmulCoop(t, l))),
            )
            .chain(CoopLayout::ALL.map(|l| Kernel::MatmulCoopPartials(CoopTile::DEFAULT, l)))
            .chain(
                CoopTile::CONV
                    .into_iter()
                    .flat_map(|t| [false, true].map(|flip| Kernel::ConvCoop(t, flip))),
            )
            .chain(CoopTile::WGRAD.map(Kernel::ConvCoopWgrad))
            .chain(
                OptimKernel::ALL
                    .into_iter()
                    .flat_map(|k| [DType::F32, DType::F16].map(|d| Kernel::Optim(k, d)))
                    // (The word kernels are f32 only.)
                    .filter(|k| !matches!(k, Kernel::Optim(o, DType::F16) if o.width() == 8)),
            )
            .chain(
                SGD_MULTI
                    .into_iter()
                    .flat_map(|n| [DType::F32, DType::F16].map(|d| Kernel::SgdMulti(d, n))),
            )
            .chain([false, true].map(Kernel::AmpUnscale))
            .chain([Kernel::AmpUnscaleMulti])
            .chain(ConvGemm::all().into_iter().map(Kernel::ConvGemm))
            .chain(
                [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|i| [DType::F32, DType::F16].map(move |o| Kernel::ColumnSum(i, o))),
            )
            .chain(BatchNormPass::all().into_iter().map(Kernel::BatchNorm))
            .chain(FlashAttnKernel::all().into_iter().map(Kernel::FlashAttn))
            .chain(LayerNormKernel::all().into_iter().map(Kernel::LayerNorm))
            .chain([
                Kernel::CastVec4(DType::F32, DType::F16),
                Kernel::CastVec4(DType::F16, DType::F32),
                Kernel::AddMixedVec4,
            ])
            .chain(RowCopy::ALL.map(Kernel::CopyRows))
            .chain(
                SoftmaxKernel::all()
                    .into_iter()
                    .map(Kernel::SoftmaxBackward),
            )
            .chain(
                [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|d| [false, true].map(move |b| Kernel::Nll(d, b))),
            )
            .chain(
                [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|d| [false, true].map(move |b| Kernel::CrossEntropy(d, b))),
            )
            .chain([DType::F32, DType::F16].into_iter().flat_map(|d| {
                [DType::F32, DType::F16].map(move |g| Kernel::CrossEntropyWords(d, g))
            }))
            .chain([DType::F32, DType::F16].map(Kernel::NllRows))
            .collect()
    }
}
