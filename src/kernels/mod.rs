//! The shader registry: every WGSL kernel, reached by a typed id, with its pipeline and
//! bind-group layout created once per device and cached. One launch path encodes every dispatch.
//! The families and the autotuner are described below (`families.md`, beside this file).
#![doc = include_str!("families.md")]

mod amp;
mod attention;
mod attention_coop;
mod batch_norm;
mod conv_coop;
mod conv_gemm;
mod coop_gen;
mod copy_rows;
mod elementwise;
mod fill;
mod launch;
mod layer_norm;
mod matmul128;
mod matmul_coop;
mod matmul_wide;
mod optim;
mod predicate;
mod reduce;
mod registry;
mod softmax;
pub mod tune;

pub use crate::base::CmpOp;
pub use amp::AMP_MULTI;
pub use attention::{FlashAttnKernel, FlashPass, FLASH_HEAD_DIMS};
pub use batch_norm::BatchNormPass;
pub use conv_gemm::{ConvGemm, ConvMode};
pub use copy_rows::RowCopy;
pub use elementwise::{ElementwiseKernel, Form, PER_THREAD};
use launch::launch_state_of;
pub(crate) use launch::{
    aligned_rows, coop_f16, grid, launch, launch_groups, launch_groups_uniform, launch_wg,
    past_one_binding, pipelines, spans, whole, window_bytes, window_covering, window_from, Operand,
    Window, ARRIVALS, UNIFORM_SCRATCH,
};
pub use layer_norm::{LayerNormKernel, LayerNormPass, LAYER_NORM_WG};
pub use matmul128::{Epilogue, Operands, Vec4Layout};
pub use matmul_coop::{CoopLayout, CoopTile};
pub use matmul_wide::{MatmulWide, UboWindows};
pub use optim::{sgd_multi_immediates, sgd_multi_slots, OptimKernel, SGD_MULTI};
pub use predicate::{PredicateForm, PredicateKernel};
pub use reduce::{ReduceKernel, ReduceOp, ReduceStrategy};
pub use softmax::{RowLayout, SoftmaxKernel};

use crate::base::DType;
use std::borrow::Cow;

/// Every kernel kiln has. The `every_kernel_validates` test compiles each variant with naga.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Fill 32-bit words with a value (immediates: len_words, value).
    Fill,
    /// `shaders/elementwise.wgsl`, specialised.
    Elementwise(ElementwiseKernel),
    /// `shaders/reduce.wgsl`, specialised (sum, prod, max, min).
    Reduce(ReduceKernel),
    /// `shaders/transpose.wgsl` for one dtype: a 2-D transposed copy through shared memory.
    Transpose(DType),
    /// `shaders/transpose_pairs.wgsl`: the same copy for 16-bit elements, two to a word.
    TransposePairs,
    /// `shaders/transpose_words.wgsl`: 4-byte elements as 4x4 blocks of 64-bit words, no
    /// workgroup memory (a candidate for CPU adapters).
    TransposeWords,
    /// `shaders/transpose_two.wgsl`: two of `Transpose`'s copies in one launch.
    TransposeTwo(DType),
    /// `shaders/softmax.wgsl`, specialised.
    Softmax(SoftmaxKernel),
    /// `shaders/matmul.wgsl` for one float dtype: tiled, batched, strided.
    Matmul(DType),
    /// `shaders/matmul_reg.wgsl` for one float dtype: `Matmul`'s contract without workgroup
    /// memory (4x4 outputs per invocation), for CPU adapters.
    MatmulReg(DType),
    /// `reg4x4`'s contract (4x8 or 16x8 outputs an invocation) with the operands loaded as
    /// 64-bit words, for CPU adapters with 64-bit integers (`matmul_wide.rs`).
    MatmulWide(MatmulWide),
    /// `shaders/matmul128.wgsl`: the same contract with 128x128 tiles, for large products; with
    /// padded shared rows (33 KiB) or swizzled ones (32 KiB, `false`).
    Matmul128(DType, bool),
    /// The 128-tile kernel for f32 operands in whole tiles with 16-byte aligned rows
    /// (`shaders/matmul128_vec4.wgsl`): vector loads, no guards, a bias epilogue (addmm), and
    /// the operands' layouts compiled in.
    Matmul128Vec4(bool, Vec4Layout),
    /// `shaders/matmul_narrow.wgsl` for one float dtype: a product with 16 or fewer columns
    /// (entry `rows`), rows (`cols`), or a K of 16 or less (`short`).
    MatmulNarrow(DType, Narrow),
    /// `Narrow::Cols` and `Narrow::Short4` in one dispatch: a classifier head's two
    /// gradients (`shaders/matmul_head_grads.wgsl`).
    MatmulHeadGrads(DType),
    /// `shaders/predicate.wgsl`: comparisons, casts, masked select.
    Predicate(PredicateKernel),
    /// `shaders/random.wgsl` for one float dtype: the counter-based generator.
    Random(DType),
    /// `shaders/argreduce.wgsl` for one float dtype: max/min with indices.
    ArgReduce(DType),
    /// `shaders/gather.wgsl` for one dtype: gather along a dim (checks its indices).
    Gather(DType),
    /// `shaders/conv2d.wgsl` for one float dtype: direct convolution.
    Conv2d(DType),
    /// `shaders/pool2d.wgsl` for one float dtype: max and average pooling.
    Pool2d(DType),
    /// `shaders/pool2d.wgsl` storing max pooling's index per window instead of its value.
    Pool2dArgmax(DType),
    /// `shaders/pool2d_backward.wgsl`: pooling's input gradient, gathered per input element.
    Pool2dBackward(DType),
    /// `shaders/scatter_add.wgsl` for f32 or i32 (checks its indices).
    ScatterAdd(DType),
    /// f16 matmul on cooperative matrices (tensor cores), generated per tile shape by
    /// `matmul_coop.rs`.
    MatmulCoop(CoopTile, CoopLayout),
    /// `MatmulCoop` with K split across workgroup layers into f32 partials (a weight
    /// gradient's few output tiles over a long K: `matmul_partials::coop_partials`).
    MatmulCoopPartials(CoopTile, CoopLayout),
    /// The f16 convolution's forward pass on the tensor-core kernel, gathering its input from
    /// NHWC (`matmul_coop.rs`, `CoopTile::conv_source`).
    ConvCoop(CoopTile, bool),
    /// The f16 convolution's weight gradient on tensor cores: B gathered from the NHWC input, K
    /// split over workgroup layers into f32 partials (`conv_coop.rs`, `CoopTile::wgrad_source`).
    ConvCoopWgrad(CoopTile),
    /// `shaders/colsum.wgsl`: sums over the leading dims of a contiguous tensor (input, output
    /// dtypes: f32 or f16, f32 accumulation).
    ColumnSum(DType, DType),
    /// `shaders/optim.wgsl`: a fused optimizer update over f32 or f16 parameters (f32 math).
    Optim(OptimKernel, DType),
    /// `shaders/optim_multi.wgsl`: SGD over up to this many parameters (`SGD_MULTI`) of vec4s
    /// of one float dtype in one launch.
    SgdMulti(DType, usize),
    /// Convolution as implicit GEMM on the 128-tile kernel (`shaders/conv_gemm*.wgsl`).
    ConvGemm(ConvGemm),
    /// `shaders/amp.wgsl`: GradScaler's unscale and inf/NaN check over one f32 gradient, four
    /// elements per invocation with `true`. (GradScaler refuses f16 gradients, as PyTorch's.)
    AmpUnscale(bool),
    /// `shaders/amp_multi.wgsl`: the same over up to `AMP_MULTI` f32 gradients of whole vec4s
    /// in one launch.
    AmpUnscaleMulti,
    /// One pass of the fused batch normalisation (`shaders/batch_norm_*.wgsl`): f32 or f16 input,
    /// f32 statistics.
    BatchNorm(BatchNormPass),
    /// One pass of flash attention (`shaders/flash_attn_*.wgsl`).
    FlashAttn(FlashAttnKernel),
    /// One pass of the fused layer norm (`shaders/layer_norm_*.wgsl`).
    LayerNorm(LayerNormKernel),
    /// `shaders/cast_vec4.wgsl`: a contiguous float cast (from, to), four elements per
    /// invocation.
    CastVec4(DType, DType),
    /// `shaders/add_mixed_vec4.wgsl`: an f32 plus an f16 tensor into f32, contiguous, four
    /// elements per invocation.
    AddMixedVec4,
    /// `shaders/softmax_backward.wgsl`, specialised as the forward is (dtype, vec4 units or
    /// elements, an invocation or a workgroup per row).
    SoftmaxBackward(SoftmaxKernel),
    /// `shaders/nll.wgsl` for one float dtype: nll_loss's forward (`false`) or backward.
    Nll(DType, bool),
    /// `shaders/cross_entropy.wgsl` for one float dtype: log_softmax and nll_loss forward in
    /// one kernel (`false`), or their two backwards in one (`true`).
    CrossEntropy(DType, bool),
    /// `shaders/cross_entropy_backward_words.wgsl`: `CrossEntropy`'s backward 16 bytes an
    /// invocation, for log_softmax's output (and the gradient) of the first dtype and an
    /// upstream gradient of the second.
    CrossEntropyWords(DType, DType),
    /// `shaders/nll_rows.wgsl`: nll_loss's backward as one record a row, for an upstream
    /// gradient of this dtype.
    NllRows(DType),
    /// `shaders/copy_rows.wgsl` and `copy_rows_vectors.wgsl`: rows copied between row strides
    /// with zero padding.
    CopyRows(RowCopy),
}

/// The entry points of `shaders/matmul_narrow.wgsl`: which side of the product is narrow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Narrow {
    /// 16 or fewer columns (a classifier head `h @ W^T`).
    Rows,
    /// 16 or fewer rows (its weight's gradient `g^T @ h`).
    Cols,
    /// A K of 16 or less (the head's input gradient `g @ W`, or a layer with few inputs).
    Short,
    /// `Short` four columns at a time where B is row-major on whole vec4s
    /// (`shaders/matmul_short4.wgsl`).
    Short4,
    /// `Rows` on 16-byte loads along K, four rows a workgroup, the shares added by subgroup
    /// operations, where A is row-major and B a row-major W read transposed
    /// (`shaders/matmul_rows4.wgsl`; adapters with subgroups).
    Rows4,
}

impl Narrow {
    /// Every narrow kernel.
    pub const ALL: [Narrow; 5] = [
        Narrow::Rows,
        Narrow::Cols,
        Narrow::Short,
        Narrow::Short4,
        Narrow::Rows4,
    ];

    /// The WGSL entry point.
    pub fn entry_point(self) -> &'static str {
        match self {
            Narrow::Rows => "rows",
            Narrow::Cols => "cols",
            Narrow::Short => "short",
            Narrow::Short4 => "short4",
            Narrow::Rows4 => "rows4",
        }
    }
}

/// Workgroup size shared by the 1-D kernels.
pub const WORKGROUP: u32 = 256;

impl Kernel {
    /// The kernel's WGSL, specialised.
    pub fn source(&self) -> Cow<'static, str> {
        match self {
            Kernel::Fill => Cow::Borrowed(include_str!("../../shaders/fill.wgsl")),
            Kernel::Elementwise(k) => Cow::Owned(k.source()),
            Kernel::Reduce(k) => Cow::Owned(k.source()),
            // Each after its `enable`s, the immediates the three share.
            Kernel::Transpose(d) => per_dtype(
                concat!(
                    include_str!("../../shaders/transpose.wgsl"),
                    include_str!("../../shaders/transpose_params.wgsl")
                ),
                *d,
            ),
            Kernel::TransposePairs => Cow::Borrowed(concat!(
                include_str!("../../shaders/transpose_pairs.wgsl"),
                include_str!("../../shaders/transpose_params.wgsl")
            )),
            Kernel::TransposeWords => Cow::Borrowed(concat!(
                include_str!("../../shaders/transpose_words.wgsl"),
                include_str!("../../shaders/transpose_params.wgsl")
            )),
            Kernel::TransposeTwo(d) => {
                per_dtype(include_str!("../../shaders/transpose_two.wgsl"), *d)
            }
            Kernel::Softmax(k) => Cow::Owned(k.source()),
            Kernel::Predicate(k) => Cow::Owned(k.source()),
            Kernel::Conv2d(d) => per_dtype(include_str!("../../shaders/conv2d.wgsl"), *d),
            Kernel::MatmulNarrow(d, kind) => {
                let src = match kind {
                    Narrow::Short4 => Cow::Owned(short4_source(1)),
                    Narrow::Rows4 => Cow::Borrowed(include_str!("../../shaders/matmul_rows4.wgsl")),
                    _ => Cow::Borrowed(include_str!("../../shaders/matmul_narrow.wgsl")),
                };
                per_dtype(&src.replace("{{PARAMS}}", NARROW_PARAMS), *d)
            }
            Kernel::MatmulHeadGrads(d) => {
                // The two kernels' sources, each on its own half of the immediates and
                // without its header, around the entry point that picks one per workgroup.
                let part = |src: &str, params: &str| {
                    src.replace("{{ENABLES}}", "")
                        .replace("{{PARAMS}}", "")
                        .replace("p.", params)
                };
                let params = NARROW_PARAMS.replace(
                    "var<immediate> p: Params;",
                    "struct HeadParams {\n    p: Params,\n    q: Params,\n}\n\nvar<immediate> hp: HeadParams;",
                );
                let src = include_str!("../../shaders/matmul_head_grads.wgsl")
                    .replace("{{PARAMS}}", &params)
                    .replace(
                        "{{COLS}}",
                        &part(include_str!("../../shaders/matmul_narrow.wgsl"), "hp.p."),
                    )
                    .replace("{{SHORT4}}", &part(&short4_source(4), "hp.q."));
                per_dtype(&src, *d)
            }
            Kernel::MatmulCoop(t, l) => Cow::Owned(t.source(*l)),
            Kernel::MatmulCoopPartials(t, l) => Cow::Owned(t.partials_source(*l)),
            Kernel::ConvCoop(t, flip) => Cow::Owned(t.conv_source(*flip)),
            Kernel::ConvCoopWgrad(t) => Cow::Owned(t.wgrad_source()),
            Kernel::Optim(k, d) => Cow::Owned(k.source(*d)),
            Kernel::SgdMulti(d, n) => Cow::Owned(float_io(&optim::sgd_multi_source(*n), *d, true).into_owned()),
            Kernel::AmpUnscale(vec4) => {
                let u = if *vec4 { "vec4<u32>" } else { "u32" };
                let src = float_io(include_str!("../../shaders/amp.wgsl"), DType::F32, *vec4);
                Cow::Owned(src.replace("{{U}}", u))
            }
            Kernel::AmpUnscaleMulti => Cow::Owned(amp::amp_multi_source()),
            Kernel::ColumnSum(i, o) => {
                let f16 = *i == DType::F16 || *o == DType::F16;
                Cow::Owned(
                    include_str!("../../shaders/colsum.wgsl")
                        .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
                        .replace("{{I}}", i.name())
                        .replace("{{O}}", o.name()),
                )
            }
            Kernel::ScatterAdd(d) => {
                let (atomic, add) = if *d == DType::I32 {
                    ("i32", "atomicAdd(&out[at], src[e]);")
                } else {
                    (
                        "u32",
                        "var old = atomicLoad(&out[at]);\n    loop {\n        \
                         let sum = bitcast<u32>(bitcast<f32>(old) + src[e]);\n        \
                         let r = atomicCompareExchangeWeak(&out[at], old, sum);\n        \
                         if r.exchanged {\n            break;\n        }\n        old = r.old_value;\n    }",
                    )
                };
                Cow::Owned(
                    include_str!("../../shaders/scatter_add.wgsl")
                        .replace("{{T}}", d.name())
                        .replace("{{ATOMIC}}", atomic)
                        .replace("{{ADD}}", add),
                )
            }
            Kernel::Pool2d(d) => per_dtype(
                &include_str!("../../shaders/pool2d.wgsl")
                    .replace("{{PARAMS}}", include_str!("../../shaders/pool2d_params.wgsl"))
                    .replace("{{O}}", "{{T}}")
                    .replace(
                        "{{STORE}}",
                        "if p.is_max == 1u {\n        out[e] = {{T}}(best);\n    } else {\n        \
                         out[e] = {{T}}(sum / f32(p.kh * p.kw));\n    }",
                    ),
                *d,
            ),
            Kernel::Pool2dArgmax(d) => per_dtype(
                &include_str!("../../shaders/pool2d.wgsl")
                    .replace("{{PARAMS}}", include_str!("../../shaders/pool2d_params.wgsl"))
                    .replace("{{O}}", "u32")
                    .replace("{{STORE}}", "out[e] = at;"),
                *d,
            ),
            Kernel::Pool2dBackward(d) => per_dtype(
                &include_str!("../../shaders/pool2d_backward.wgsl")
                    .replace("{{PARAMS}}", include_str!("../../shaders/pool2d_params.wgsl")),
                *d,
            ),
            Kernel::Gather(d) => per_dtype(include_str!("../../shaders/gather.wgsl"), *d),
            Kernel::ArgReduce(d) => per_dtype(include_str!("../../shaders/argreduce.wgsl"), *d),
            Kernel::Random(d) => per_dtype(&random_source(include_str!("../../shaders/random.wgsl")), *d),
            Kernel::MatmulWide(w) => Cow::Owned(w.source(concat!(
                include_str!("../../shaders/matmul_params.wgsl"),
                include_str!("../../shaders/matmul_store_row.wgsl")
            ))),
            Kernel::Matmul(d) | Kernel::MatmulReg(d) => {
                let body = match self {
                    Kernel::Matmul(_) => include_str!("../../shaders/matmul.wgsl"),
                    _ => concat!(
                        include_str!("../../shaders/matmul_store_row.wgsl"),
                        include_str!("../../shaders/matmul_reg.wgsl")
                    ),
                };
                let params = include_str!("../../shaders/matmul_params.wgsl");
                per_dtype(&format!("{params}{body}"), *d)
            }
            Kernel::Matmul128(d, padded) => Cow::Owned(matmul128::tiled_128(
                concat!(
                    include_str!("../../shaders/matmul128_io.wgsl"),
                    include_str!("../../shaders/matmul_store_row.wgsl")
                ),
                include_str!("../../shaders/matmul128_params.wgsl"),
                *d,
                *padded,
                matmul128::Io::Scalar,
            )),
            Kernel::Matmul128Vec4(padded, l) => Cow::Owned(matmul128::tiled_128(
                &l.io(),
                include_str!("../../shaders/matmul128_params.wgsl"),
                DType::F32,
                *padded,
                matmul128::Io::Vec4 {
                    row_sums: l.epilogue == Epilogue::RowSums,
                },
            )),
            Kernel::ConvGemm(c) => Cow::Owned(c.source()),
            Kernel::BatchNorm(b) => Cow::Owned(b.source()),
            Kernel::FlashAttn(k) => Cow::Owned(k.source()),
            Kernel::LayerNorm(k) => Cow::Owned(k.source()),
            Kernel::CastVec4(from, to) => {
                let f16 = *from == DType::F16 || *to == DType::F16;
                Cow::Owned(
                    include_str!("../../shaders/cast_vec4.wgsl")
                        .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
                        .replace("{{I}}", from.name())
                        .replace("{{O}}", to.name()),
                )
            }
            Kernel::SoftmaxBackward(k) => Cow::Owned(k.backward_source()),
            Kernel::AddMixedVec4 => Cow::Borrowed(include_str!("../../shaders/add_mixed_vec4.wgsl")),
            Kernel::Nll(d, _) => per_dtype(
                &include_str!("../../shaders/nll.wgsl").replace("{{COMMON}}", NLL_COMMON),
                *d,
            ),
            Kernel::CrossEntropy(d, _) => per_dtype(
                &include_str!("../../shaders/cross_entropy.wgsl").replace("{{COMMON}}", NLL_COMMON),
                *d,
            ),
            Kernel::CrossEntropyWords(d, g) => {
                let f16 = *d == DType::F16 || *g == DType::F16;
                Cow::Owned(
                    softmax::words_chunks(
                        include_str!("../../shaders/cross_entropy_backward_words.wgsl"),
                        *d,
                    )
                    .replace("{{COMMON}}", NLL_PARAMS)
                    .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
                    .replace("{{G}}", g.name())
                    .replace("{{T}}", d.name()),
                )
            }
            Kernel::NllRows(g) => Cow::Owned(
                include_str!("../../shaders/nll_rows.wgsl")
                    .replace("{{COMMON}}", NLL_PARAMS)
                    .replace("{{ENABLES}}", if *g == DType::F16 { "enable f16;" } else { "" })
                    .replace("{{G}}", g.name()),
            ),
            Kernel::CopyRows(form) => Cow::Owned(form.source()),
        }
    }

    /// The kernel's name, as the profiler, the tuner and `shader_stats` print it.
    pub fn name(&self) -> Cow<'static, str> {
        match self {
            Kernel::Fill => Cow::Borrowed("fill"),
            Kernel::Elementwise(k) => Cow::Owned(k.name()),
            Kernel::Reduce(k) => Cow::Owned(k.name()),
            Kernel::Transpose(d) => Cow::Owned(format!("transpose_{d}")),
            Kernel::TransposePairs => Cow::Borrowed("transpose_pairs"),
            Kernel::TransposeWords => Cow::Borrowed("transpose_words"),
            Kernel::TransposeTwo(d) => Cow::Owned(format!("transpose_two_{d}")),
            Kernel::Softmax(k) => Cow::Owned(k.name()),
            Kernel::Matmul(d) => Cow::Owned(format!("matmul_{d}")),
            Kernel::MatmulReg(d) => Cow::Owned(format!("matmul_reg4x4_{d}")),
            Kernel::MatmulWide(w) => Cow::Owned(w.name()),
            Kernel::MatmulNarrow(d, kind) => {
                Cow::Owned(format!("matmul_narrow_{}_{d}", kind.entry_point()))
            }
            Kernel::MatmulHeadGrads(d) => Cow::Owned(format!("matmul_narrow_head_grads_{d}")),
            Kernel::Matmul128(d, padded) => Cow::Owned(format!(
                "matmul128_{d}{}",
                if *padded { "_padded" } else { "" }
            )),
            Kernel::Matmul128Vec4(padded, l) => Cow::Owned(format!(
                "matmul128_vec4_f32{}{}",
                if *padded { "_padded" } else { "" },
                l.suffix()
            )),
            Kernel::Predicate(k) => Cow::Owned(k.name()),
            Kernel::Random(d) => Cow::Owned(format!("random_{d}")),
            Kernel::ArgReduce(d) => Cow::Owned(format!("argreduce_{d}")),
            Kernel::Gather(d) => Cow::Owned(format!("gather_{d}")),
            Kernel::Conv2d(d) => Cow::Owned(format!("conv2d_{d}")),
            Kernel::Pool2d(d) => Cow::Owned(format!("pool2d_{d}")),
            Kernel::Pool2dArgmax(d) => Cow::Owned(format!("pool2d_argmax_{d}")),
            Kernel::Pool2dBackward(d) => Cow::Owned(format!("pool2d_backward_{d}")),
            Kernel::ScatterAdd(d) => Cow::Owned(format!("scatter_add_{d}")),
            Kernel::MatmulCoop(t, l) => Cow::Owned(t.name(*l)),
            Kernel::MatmulCoopPartials(t, l) => Cow::Owned(format!("{}_partials", t.name(*l))),
            Kernel::ConvCoop(t, flip) => Cow::Owned(t.conv_name(*flip)),
            Kernel::ConvCoopWgrad(t) => Cow::Owned(t.wgrad_name()),
            Kernel::ColumnSum(i, o) => Cow::Owned(format!("colsum_{i}_{o}")),
            Kernel::Optim(k, d) => Cow::Owned(format!(
                "optim_{}_{d}{}",
                k.entry_point(),
                match k.width() {
                    8 => "_words",
                    4 => "_vec4",
                    _ => "",
                }
            )),
            Kernel::SgdMulti(d, n) => Cow::Owned(format!("optim_sgd_multi{n}_{d}_vec4")),
            Kernel::ConvGemm(c) => Cow::Owned(c.name()),
            Kernel::BatchNorm(b) => Cow::Owned(b.name()),
            Kernel::FlashAttn(k) => Cow::Owned(k.name()),
            Kernel::LayerNorm(k) => Cow::Owned(k.name()),
            Kernel::CastVec4(from, to) => Cow::Owned(format!("cast_{from}_{to}_vec4")),
            Kernel::AddMixedVec4 => Cow::Borrowed("binary_add_f32_f16_vec4"),
            Kernel::SoftmaxBackward(k) => Cow::Owned(k.backward_name()),
            Kernel::Nll(d, backward) => Cow::Owned(format!(
                "nll_loss_{}_{d}",
                if *backward { "backward" } else { "forward" }
            )),
            Kernel::CrossEntropy(d, backward) => Cow::Owned(format!(
                "cross_entropy_{}_{d}",
                if *backward { "backward" } else { "forward" }
            )),
            Kernel::CrossEntropyWords(d, g) => Cow::Owned(match d == g {
                true => format!("cross_entropy_backward_{d}_words"),
                false => format!("cross_entropy_backward_{d}_words_from_{g}"),
            }),
            Kernel::NllRows(g) => Cow::Owned(format!("nll_loss_backward_rows_from_{g}")),
            Kernel::CopyRows(form) => Cow::Borrowed(form.name()),
            Kernel::AmpUnscaleMulti => Cow::Borrowed("amp_unscale_f32_multi"),
            Kernel::AmpUnscale(vec4) => Cow::Owned(format!(
                "amp_unscale_f32{}",
                if *vec4 { "_vec4" } else { "" }
            )),
        }
    }

    /// The binding the kernel reads as a uniform buffer (the launch binds the device's scratch
    /// there: `launch_groups_uniform`), if any; the others are storage buffers.
    pub(crate) fn uniform_binding(&self) -> Option<u32> {
        match self {
            Kernel::MatmulWide(w) if w.ubo_a => Some(0),
            _ => None,
        }
    }

    /// Buffers the kernel binds, in binding order.
    fn bindings(&self) -> u32 {
        match self {
            Kernel::Fill => 1,
            Kernel::Elementwise(k) => k.bindings(),
            Kernel::Reduce(_) | Kernel::Transpose(_) => 2,
            Kernel::Softmax(k) => k.bindings(),
            Kernel::TransposePairs | Kernel::TransposeWords => 2,
            Kernel::TransposeTwo(_) => 4,
            Kernel::Matmul(_) | Kernel::MatmulReg(_) | Kernel::Matmul128(..) => 3,
            Kernel::MatmulWide(_) => 4,
            Kernel::Matmul128Vec4(..) => 4,
            Kernel::MatmulNarrow(..) => 4,
            Kernel::MatmulHeadGrads(_) => 7,
            Kernel::Predicate(k) => k.bindings(),
            Kernel::Random(_) => 1,
            Kernel::ArgReduce(_) => 3,
            Kernel::Gather(_) | Kernel::Conv2d(_) | Kernel::ScatterAdd(_) => 4,
            Kernel::MatmulCoop(..) | Kernel::MatmulCoopPartials(..) => 4,
            Kernel::ConvCoop(..) => 4,
            Kernel::ConvCoopWgrad(_) => 3,
            Kernel::Pool2d(_) => 2,
            Kernel::Pool2dArgmax(_) => 2,
            Kernel::Pool2dBackward(_) => 3,
            Kernel::Optim(..) | Kernel::ConvGemm(_) => 4,
            Kernel::SgdMulti(_, n) => 3 * *n as u32,
            Kernel::AmpUnscale(_) => 2,
            Kernel::AmpUnscaleMulti => AMP_MULTI as u32 + 1,
            Kernel::ColumnSum(..) => 2,
            Kernel::BatchNorm(b) => b.bindings(),
            Kernel::CastVec4(..) => 2,
            Kernel::AddMixedVec4 => 3,
            Kernel::CopyRows(_) => 2,
            Kernel::Nll(..) => 5,
            // Five blocks, and the forward's assert flag.
            Kernel::CrossEntropy(_, backward) => 6 - *backward as u32,
            // y and the gradient bound twice (scalars, 16-byte chunks).
            Kernel::CrossEntropyWords(..) => 7,
            Kernel::NllRows(_) => 4,
            Kernel::SoftmaxBackward(k) => 3 * k.bindings() / 2,
            Kernel::FlashAttn(k) => k.bindings(),
            Kernel::LayerNorm(_) => 5,
        }
    }

    /// The user-facing op a checking kernel serves (for the assert message).
    fn op_name(&self) -> &'static str {
        match self {
            Kernel::Gather(_) => "gather/index_select/embedding",
            Kernel::ScatterAdd(_) => "scatter_add",
            Kernel::Nll(..) => "nll_loss",
            Kernel::CrossEntropy(..) => "cross_entropy/nll_loss",
            _ => "kernel",
        }
    }

    /// Whether the kernel binds the device's arrival counters after its blocks (Note [Folded
    /// finalize]).
    fn counts_arrivals(&self) -> bool {
        matches!(self, Kernel::BatchNorm(b) if b.counts_arrivals())
    }

    /// Whether the kernel raises the device's assert flag (bound after its blocks).
    fn checks_input(&self) -> bool {
        matches!(
            self,
            Kernel::Gather(_)
                | Kernel::ScatterAdd(_)
                | Kernel::Nll(..)
                | Kernel::CrossEntropy(_, false)
        )
    }

    /// Whether the pipeline is built without naga's runtime checks (ALU-bound kernels whose
    /// every index is guarded in the WGSL). On a software adapter (`software`: llvmpipe) flash
    /// attention keeps the checks: without naga's loop-bounding counters LLVM unrolls its
    /// 32-key tiles of vec4 rows, and one forward kernel then took 8 s (head dim 16) to 220 s
    /// (128) to compile cold against 1-5 s checked; a CPU runs it no faster unrolled.
    fn trusted(&self, software: bool) -> bool {
        if software && matches!(self, Kernel::FlashAttn(_)) {
            return false;
        }
        // The words kernels, the halves copy and the column sums stream rows with their loads
        // unrolled: naga's loop-bounding counter kept the loads of an unrolled iteration apart
        // (H200: the f16 [8192, 50257] log_softmax 1.97 ms checked).
        let streaming = matches!(
            self,
            Kernel::Softmax(SoftmaxKernel {
                layout: RowLayout::Words,
                ..
            }) | Kernel::SoftmaxBackward(SoftmaxKernel {
                layout: RowLayout::Words,
                ..
            }) | Kernel::CopyRows(RowCopy::HalvesToVectors | RowCopy::WordsToVectors)
                | Kernel::CrossEntropyWords(..)
                | Kernel::ColumnSum(..)
        );
        streaming
            || matches!(
                self,
                Kernel::Matmul(_)
                    | Kernel::MatmulReg(_)
                    | Kernel::MatmulWide(_)
                    | Kernel::Matmul128(..)
                    | Kernel::Matmul128Vec4(..)
                    | Kernel::ConvGemm(_)
                    | Kernel::Reduce(_)
                    | Kernel::FlashAttn(_)
            )
            || (matches!(
                self,
                Kernel::MatmulCoop(..)
                    | Kernel::MatmulCoopPartials(..)
                    | Kernel::ConvCoop(..)
                    | Kernel::ConvCoopWgrad(_)
            ) && std::env::var("KILN_COOP_CHECKED").is_err())
    }

    /// Bytes of immediates.
    pub fn immediate_size(&self) -> u32 {
        match self {
            Kernel::Fill => 8,
            Kernel::Elementwise(_) => 112,
            Kernel::Reduce(_) => 96,
            Kernel::Transpose(_) | Kernel::TransposePairs | Kernel::TransposeWords => 32,
            Kernel::TransposeTwo(_) => 64,
            Kernel::Softmax(_) => 96,
            Kernel::Matmul(_) | Kernel::MatmulReg(_) => 48,
            Kernel::MatmulWide(_) => 64,
            Kernel::Matmul128(..) | Kernel::Matmul128Vec4(..) => 64,
            Kernel::MatmulNarrow(..) => 64,
            Kernel::MatmulHeadGrads(_) => 128,
            Kernel::Predicate(_) => 112,
            Kernel::Random(_) => 32,
            Kernel::ArgReduce(_) => 96,
            Kernel::Gather(_) => 128,
            Kernel::Conv2d(_) => 80,
            Kernel::Pool2d(_) | Kernel::Pool2dArgmax(_) | Kernel::Pool2dBackward(_) => 64,
            Kernel::ScatterAdd(_) => 128,
            Kernel::MatmulCoop(..) | Kernel::MatmulCoopPartials(..) => 48,
            Kernel::ConvCoop(..) | Kernel::ConvCoopWgrad(_) => 112,
            Kernel::Optim(..) => 64,
            Kernel::SgdMulti(_, n) => {
                (4 * optim::sgd_multi_immediates(*n) as u32).next_multiple_of(16)
            }
            Kernel::AmpUnscale(_) => 16,
            Kernel::AmpUnscaleMulti => 8 * AMP_MULTI as u32 + 8,
            Kernel::ColumnSum(..) => 32,
            Kernel::ConvGemm(_) => 128,
            Kernel::BatchNorm(b) => b.immediate_size(),
            Kernel::FlashAttn(_) => 128,
            Kernel::LayerNorm(_) => 48,
            Kernel::CastVec4(..) | Kernel::AddMixedVec4 => 16,
            Kernel::CopyRows(_) => 32,
            Kernel::Nll(..)
            | Kernel::CrossEntropy(..)
            | Kernel::CrossEntropyWords(..)
            | Kernel::NllRows(_) => 64,
            Kernel::SoftmaxBackward(..) => 32,
        }
    }

    /// The WGSL function the pipeline runs (`main`, except in multi-entry shaders).
    fn entry_point(&self) -> &'static str {
        match self {
            Kernel::Optim(k, _) => k.entry_point(),
            Kernel::BatchNorm(b) => b.entry_point(),
            Kernel::MatmulNarrow(_, kind) => kind.entry_point(),
            Kernel::MatmulHeadGrads(_) => "head_grads",
            Kernel::Nll(_, false) => "forward",
            Kernel::Nll(_, true) => "backward",
            Kernel::CrossEntropy(_, false) => "forward",
            Kernel::CrossEntropy(_, true) => "backward",
            Kernel::SoftmaxBackward(k) if k.layout == RowLayout::Words => "rows_words",
            Kernel::SoftmaxBackward(k) if !k.serial => "rows_tree",
            _ => "main",
        }
    }
}

/// The narrow products' immediates (`shaders/matmul_narrow_params.wgsl`).
const NARROW_PARAMS: &str = include_str!("../../shaders/matmul_narrow_params.wgsl");

/// `shaders/matmul_short4.wgsl` with its B, output and mask at bindings `first`.. (A at 0):
/// 1.. alone, 4.. in `Kernel::MatmulHeadGrads`, where `cols` declares A.
fn short4_source(first: u32) -> String {
    let a = match first {
        4 => "",
        _ => "@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;",
    };
    include_str!("../../shaders/matmul_short4.wgsl")
        .replace("{{SHORT4_A}}", a)
        .replace("{{SHORT4_B}}", &first.to_string())
        .replace("{{SHORT4_OUT}}", &(first + 1).to_string())
        .replace("{{SHORT4_MASK}}", &(first + 2).to_string())
}

/// What `shaders/nll.wgsl` and `shaders/cross_entropy.wgsl` share.
const NLL_PARAMS: &str = include_str!("../../shaders/nll_params.wgsl");
const NLL_COMMON: &str = concat!(
    include_str!("../../shaders/nll_params.wgsl"),
    include_str!("../../shaders/nll_common.wgsl")
);

/// A kernel specialised by dtype alone: `{{T}}` is the element type, f16 enabled where used.
pub(crate) fn per_dtype(src: &str, d: DType) -> Cow<'static, str> {
    let enables = if d == DType::F16 { "enable f16;" } else { "" };
    Cow::Owned(
        src.replace("{{ENABLES}}", enables)
            .replace("{{T}}", d.name()),
    )
}

/// A kernel over float storage of dtype `d` computed in f32: `{{E}}` is the stored element
/// (a vec4 of them with `vec4`), `{{W}}` its f32 form.
fn float_io(src: &str, d: DType, vec4: bool) -> Cow<'static, str> {
    let (e, w) = match vec4 {
        true => ("vec4<{{T}}>", "vec4<f32>"),
        false => ("{{T}}", "f32"),
    };
    per_dtype(&src.replace("{{E}}", e).replace("{{W}}", w), d)
}

/// A kernel that draws from the device generator: `{{RANDOM_BITS}}` replaced by the shared hash.
pub(crate) fn random_source(src: &str) -> String {
    src.replace(
        "{{RANDOM_BITS}}",
        include_str!("../../shaders/random_bits.wgsl"),
    )
}

/// Parses and validates a kernel's WGSL with naga, as wgpu will.
pub fn validate(kernel: &Kernel) -> std::result::Result<naga::valid::ModuleInfo, String> {
    let src = kernel.source();
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{}: {e:?}", kernel.name()))
}
