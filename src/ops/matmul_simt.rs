//! The SIMT products (`matmul_plan`'s `Direct::Simt`): the vec4 128-tile kernel, the scalar
//! 128- and 64-tile kernels, the kernels without workgroup memory, the epilogues each may take,
//! and the tuner's choice among them; a product past one storage binding runs over windows
//! (`matmul_windows::simt_windows`).

use super::matmul::Extras;
use super::matmul_choice::{forced_tile, scalar_forced, vec4_eligible};
use super::matmul_plan::{Flat, Product};
use super::u32_of;
use crate::kernels::{
    launch_groups, tune, Epilogue, Kernel, MatmulWide, Operands, UboWindows, Vec4Layout,
};
use crate::tensor::Tensor;
use crate::{DType, Result};

const OP: &str = "matmul";

/// The SIMT products: the vec4 128-tile kernel, the scalar 128- and 64-tile kernels, and the
/// kernel without workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simt {
    Vec4,
    /// `Vec4` after a column-major copy of A (a row-major 2-D A by a row-major B).
    Vec4ColA,
    Tile128,
    Tile64,
    Reg,
    /// `Reg` over 64-bit words, 4x8 or 16x8 outputs an invocation (`kernels::MatmulWide`).
    Wide(MatmulWide),
}

impl Simt {
    fn is_vec4(self) -> bool {
        matches!(self, Simt::Vec4 | Simt::Vec4ColA)
    }

    fn name(self) -> &'static str {
        match self {
            Simt::Vec4 => "tile128_vec4",
            Simt::Vec4ColA => "tile128_vec4_col_a",
            Simt::Tile128 => "tile128",
            Simt::Tile64 => "tile64",
            Simt::Reg => "reg4x4",
            Simt::Wide(w) => w.candidate(),
        }
    }
}

thread_local! {
    /// Inside `with_padded_a`: A is already a copy made for this product.
    static PADDED_A: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a product whose A is a padded copy, `matmul::coop_split`) without the candidate
/// that copies A again column-major: two copies of A would be live at once. GPT-2's f32 tied
/// head pads the [8192, 50257] gradient to 50304 columns for `g @ W`, and the H200's tuner
/// chose that candidate there: 1.65 GB more, and the f32 step's peak 174 MiB above PyTorch's.
pub(super) fn with_padded_a<R>(f: impl FnOnce() -> R) -> R {
    let outer = PADDED_A.with(|p| p.replace(true));
    let r = f();
    PADDED_A.with(|p| p.set(outer));
    r
}

/// What the SIMT kernels may do for one product: the default kernel, and the epilogues each
/// may take.
struct SimtPlan<'a> {
    default: Simt,
    /// Padded shared rows (the device gives a workgroup 33 KiB).
    padded: bool,
    /// GL: the compatibility backend keeps to the scalar kernels.
    gl: bool,
    /// A contiguous f32 row of n, for the vec4 kernels' epilogue.
    fused_bias: Option<&'a Tensor>,
    /// A contiguous row of n in the product's dtype, for the word products' epilogue.
    wide_bias: Option<&'a Tensor>,
    /// A's row sums (`Extras::sums`), with the column-major A by row-major B vec4 kernel.
    sums: Option<&'a Tensor>,
    /// A backward ReLU mask (`Extras::mask`) in the vec4 kernels' epilogue.
    mask: Option<&'a Tensor>,
}

impl<'a> SimtPlan<'a> {
    /// `bias`, and `sums` and `mask` as `Extras` asks, where the kernels can take them.
    fn new(
        p: &Product,
        f: &Flat,
        bias: Option<&'a Tensor>,
        [sums, mask]: [Option<&'a Tensor>; 2],
    ) -> SimtPlan<'a> {
        let (m, n, k) = (p.m, p.n, p.k);
        // 128x128 tiles where the product fills them (KILN_MATMUL_TILE=64 forces 64).
        // 128-tiles once there are enough of them to spread (measured on the H100: the
        // 128-tile kernel wins from 64 tiles on); else 64.
        let tiles = m.div_ceil(128) * n.div_ceil(128) * f.batch;
        let big = match forced_tile() {
            0 => m >= 128 && n >= 128 && tiles >= 64,
            t => t == 128,
        };
        let info = p.a.device().adapter_info();
        let padded = info.is_some_and(|i| i.limits.max_compute_workgroup_storage_size >= 33 * 1024);
        // Not on GL: Mesa's llvmpipe takes ~90 s to compile each 128-tile variant's GLSL
        // from a cold cache (holding wgpu's GL context lock all along); GL is kiln's
        // compatibility backend and keeps to one variant, the scalar kernel.
        let gl = info.is_some_and(|i| i.backend == wgpu::Backend::Gl);
        let vec4 = big
            && !gl
            && !scalar_forced()
            && p.a.dtype() == DType::F32
            && vec4_eligible(
                [m, n, k],
                [f.a.layout().offset, f.sab, f.sam, f.sak],
                [f.b.layout().offset, f.sbb, f.sbk, f.sbn],
            );
        let fused_bias = bias.filter(|t| {
            vec4 && t.dtype() == DType::F32
                && t.shape() == [n]
                && t.strides() == [1]
                && t.layout().offset.is_multiple_of(4)
        });
        let wide_bias =
            bias.filter(|t| t.dtype() == p.a.dtype() && t.shape() == [n] && t.strides() == [1]);
        let default = match (vec4, big) {
            (true, _) => Simt::Vec4,
            (false, true) => Simt::Tile128,
            (false, false) => Simt::Tile64,
        };
        let sums = sums.filter(|t| {
            Vec4Layout::of(f.sak, f.sbn).operands == Operands::ColRow
                && f.batch == 1
                && fused_bias.is_none()
                && t.shape() == [m]
                && t.layout().offset.is_multiple_of(4)
        });
        // (The product has no bias or sums then: the mask takes the fourth binding.)
        let mask = mask.filter(|t| {
            vec4 && fused_bias.is_none()
                && sums.is_none()
                && f.batch == 1
                && super::matmul::mask_fits(t, &p.a, m, n)
        });
        SimtPlan {
            default,
            padded,
            gl,
            fused_bias,
            wide_bias,
            sums,
            mask,
        }
    }

    /// The kernels to time, the default first (a forced tile is not second-guessed).
    fn candidates(&self, p: &Product, f: &Flat) -> Vec<(Simt, &'static str)> {
        let mut candidates = vec![(self.default, self.default.name())];
        // A row-major A by a row-major B scatters A's slices into shared memory; copied
        // column-major first (one 2-D A), the product runs 10% faster on the H100 for the
        // price of the copy: measured against the plain kernel.
        if self.default == Simt::Vec4
            && f.sak == 1
            && f.sbn == 1
            && f.a.rank() == 2
            && !PADDED_A.with(|p| p.get())
        {
            candidates.push((Simt::Vec4ColA, Simt::Vec4ColA.name()));
        }
        if forced_tile() != 0 {
            return candidates;
        }
        // Operands read as 64-bit words: a CPU adapter's candidates (with 64-bit integers). On
        // the H100 they won none of the 20 keys the ops and train suites tune, so GPUs are not
        // made to time them. On lavapipe they win every product key but the smallest, so
        // there the uniform form is the default where it fits (first: what runs untuned and
        // what another candidate must beat by `tune::MARGIN`; timed second, behind the 16-row
        // storage form, it lost the MLP's layer-1 forward in three tunings of three, 4.5-4.7
        // ms against 3.9, though forced it runs the `train` example as fast as when it wins),
        // then the 16-row and 4-row forms, reg4x4, and the workgroup-memory tiles last
        // (100-400 ms a run there, and a compilation each, which the key's budget then rarely
        // affords).
        let info = p.a.device().adapter_info();
        let words =
            tune::on_cpu_adapter(p.a.device()) && info.is_some_and(|i| i.features.shader_int64);
        let mut wide = Vec::new();
        if words && !self.gl {
            let fitting = MatmulWide::fitting(
                p.a.dtype(),
                [p.m, p.n, p.k],
                (f.a.layout().offset, f.sab, f.sam, f.sak),
                (f.b.layout().offset, f.sbb, f.sbk, f.sbn),
            );
            // A through the uniform scratch, where one tile's window fits it (a single batch:
            // the window is one matrix's rows).
            let ubo = fitting.first().map(|w| w.with_ubo_a()).filter(|w| {
                f.batch == 1
                    && UboWindows::new(p.a.dtype(), [p.m, p.k], f.sam, f.sak, w.tile_m()).rows > 0
                    && (f.a.layout().offset * p.a.dtype().size_bytes()).is_multiple_of(4)
            });
            wide.extend(ubo);
            wide.extend(fitting.into_iter().rev());
        }
        let tiles = candidates.len();
        candidates.extend(wide.iter().map(|&w| (Simt::Wide(w), w.candidate())));
        candidates.push((Simt::Reg, Simt::Reg.name()));
        if !wide.is_empty() {
            // The tiles after the others.
            candidates.rotate_left(tiles);
        }
        candidates
    }

    /// The tuner's key: dtype, size classes and the operands' majors.
    fn key(p: &Product, f: &Flat) -> String {
        // Row-major where the last dim has unit stride.
        let major = |last: usize| if last == 1 { "row" } else { "col" };
        format!(
            "{} {}x{}x{} batch {} a {} b {}",
            p.a.dtype(),
            tune::class(p.m),
            tune::class(p.n),
            tune::class(p.k),
            tune::class(f.batch),
            major(f.sak),
            major(f.sbn)
        )
    }
}

/// What one SIMT launch runs: the kernel, its tile's rows and columns, its immediates (as
/// `usize`, before their conversion to words), whether it binds a fourth block, and the tensor
/// bound there (the bias, A's row sums or the mask; else a dummy).
pub(super) struct SimtLaunch<'t> {
    pub kernel: Kernel,
    pub tile: (usize, usize),
    pub imm: Vec<usize>,
    pub four_bindings: bool,
    pub fourth: Option<&'t Tensor>,
}

impl<'t> SimtLaunch<'t> {
    /// `choice` with the plan's epilogues where it takes them (the ReLU's with `relu`, `mask`
    /// given only with a vec4 choice), A read as `a` (`f.a`, or its column-major copy).
    fn new(
        p: &Product,
        f: &Flat,
        plan: &SimtPlan<'t>,
        choice: Simt,
        a: &Tensor,
        (relu, mask): (bool, Option<&'t Tensor>),
    ) -> SimtLaunch<'t> {
        let (m, n, k) = (p.m, p.n, p.k);
        let fused = match choice {
            Simt::Wide(_) => plan.wide_bias,
            _ => plan.fused_bias.filter(|_| choice.is_vec4()),
        };
        let sums = plan.sums.filter(|_| choice == Simt::Vec4);
        let (sam, sak) = match choice {
            Simt::Vec4ColA => (1, m),
            _ => (f.sam, f.sak),
        };
        let mut imm = vec![
            m,
            n,
            k,
            f.batch,
            a.layout().offset,
            f.sab,
            sam,
            sak,
            f.b.layout().offset,
            f.sbb,
            f.sbk,
            f.sbn,
            fused.is_some() as usize | (sums.is_some() as usize) << 1,
            fused.or(sums).or(mask).map_or(0, |t| t.layout().offset),
        ];
        let padded = plan.padded;
        let (tile, kernel) = match choice {
            Simt::Vec4 if sums.is_some() => (
                128,
                Kernel::Matmul128Vec4(padded, Vec4Layout::of(f.sak, f.sbn).with(Epilogue::RowSums)),
            ),
            Simt::Vec4 if relu => (
                128,
                Kernel::Matmul128Vec4(padded, Vec4Layout::of(f.sak, f.sbn).with(Epilogue::Relu)),
            ),
            // (A tile of 4 or 16 rows by 64 columns: the groups' x below.)
            Simt::Wide(w) => (w.tile_m(), Kernel::MatmulWide(w)),
            Simt::Vec4 | Simt::Vec4ColA => {
                let layout = Vec4Layout::of(sak, f.sbn);
                let layout = match mask {
                    Some(_) => layout.with(Epilogue::Mask),
                    None => layout,
                };
                (128, Kernel::Matmul128Vec4(padded, layout))
            }
            Simt::Tile128 => (128, Kernel::Matmul128(p.a.dtype(), padded)),
            Simt::Tile64 => (64, Kernel::Matmul(p.a.dtype())),
            Simt::Reg => (32, Kernel::MatmulReg(p.a.dtype())),
        };
        imm.resize(kernel.immediate_size() as usize / 4, 0);
        let tile_n = match choice {
            Simt::Wide(_) => MatmulWide::TILE_N,
            _ => tile,
        };
        let four_bindings = choice.is_vec4() || matches!(choice, Simt::Wide(_));
        SimtLaunch {
            kernel,
            tile: (tile, tile_n),
            imm,
            four_bindings,
            fourth: fused.or(sums).or(mask).filter(|_| four_bindings),
        }
    }

    /// The immediates as words.
    pub fn words(&self) -> Result<Vec<u32>> {
        self.imm.iter().map(|&v| u32_of(OP, v)).collect()
    }
}

/// One SIMT kernel's launch: `choice` with the plan's epilogues where it takes them; with
/// `relu_out`, `Simt::Vec4` writes the ReLU of the result there instead of `out`; with `mask`
/// (given only with a vec4 choice) the kernel applies it; with `sliver`, one workgroup of the
/// grid (the tuner's `prepare`: it compiles the candidate's pipeline; the op's own launch
/// writes every tile afterwards).
#[allow(clippy::too_many_arguments)]
fn launch_simt(
    p: &Product,
    f: &Flat,
    plan: &SimtPlan,
    out: &Tensor,
    choice: Simt,
    relu_out: Option<&Tensor>,
    mask: Option<&Tensor>,
    sliver: bool,
) -> Result<()> {
    // Vec4ColA: A copied column-major first, so that the product runs the kernel with that
    // layout compiled in (a transposed copy of A, then `Operands::ColRow`).
    let col_a = match choice {
        Simt::Vec4ColA => Some(crate::no_grad(|| f.a.t()?.contiguous())?),
        _ => None,
    };
    let a_op = col_a.as_ref().unwrap_or(&f.a);
    let l = SimtLaunch::new(p, f, plan, choice, a_op, (relu_out.is_some(), mask));
    let imm = l.words()?;
    let (tile, tile_n) = l.tile;
    let sums = plan.sums.filter(|_| choice == Simt::Vec4);
    let groups = (
        // (The row sums' column of workgroups after the product's.)
        (p.n.div_ceil(tile_n) + sums.is_some() as usize) as u32,
        p.m.div_ceil(tile) as u32,
        u32_of(OP, f.batch)?,
    );
    let groups = if sliver { (1, 1, 1) } else { groups };
    let dest = relu_out.unwrap_or(out);
    let mut blocks = vec![&a_op.storage.block, &f.b.storage.block, &dest.storage.block];
    if l.four_bindings {
        // Without a bias, sums or a mask the fourth binding is a dummy (the flags are clear).
        blocks.push(l.fourth.map_or(&f.a.storage.block, |t| &t.storage.block));
    }
    match choice {
        Simt::Wide(w) => super::matmul_words::launch(
            (w, l.kernel),
            (l.imm[4], l.imm[6], l.imm[7]),
            [p.m, p.k],
            &blocks,
            imm,
            groups,
            sliver,
        ),
        _ => launch_groups(l.kernel, &blocks, &imm, groups),
    }
}

/// The SIMT product: the tuner picks among the plan's candidates (measured per adapter), then
/// the choice runs with the epilogues it takes, and `ex` learns what it did. Returns whether
/// the kernel added the bias.
pub(super) fn simt(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    bias: Option<&Tensor>,
    ex: &mut Extras,
) -> Result<bool> {
    let big = |t: &Tensor| crate::kernels::past_one_binding(&t.storage.block);
    if f.batch == 1 && (big(out) || big(&f.a) || big(&f.b)) {
        // Past one binding: the default kernel, untuned and without extras, over windows of M
        // (which take the bias) or of K (which do not).
        let by_rows = big(out) || (big(&f.a) && f.sak == 1);
        let plan = SimtPlan::new(p, f, bias.filter(|_| by_rows), [None, None]);
        let l = SimtLaunch::new(p, f, &plan, plan.default, &f.a, (false, None));
        let fused = l.fourth.is_some();
        ex.written = false;
        ex.masked = false;
        super::matmul_windows::simt_windows(p, f, l, out)?;
        return Ok(fused);
    }
    let plan = SimtPlan::new(p, f, bias, [ex.sums, ex.mask]);
    let candidates = plan.candidates(p, f);
    // A forced tile runs the kernel it names untuned (no work to tune: the bench's 128-tile
    // check spent 2.3 s on lavapipe timing the one candidate it compiled);
    // `tune::force_variant` still picks among the candidates.
    let work = match forced_tile() {
        0 => (p.m * p.n * p.k * f.batch) as u64,
        _ => 0,
    };
    let run = |choice: Simt, relu_out: Option<&Tensor>, mask: Option<&Tensor>| {
        launch_simt(p, f, &plan, out, choice, relu_out, mask, false)
    };
    let choice = tune::pick_prepared(
        p.a.device(),
        "matmul",
        || SimtPlan::key(p, f),
        work,
        &candidates,
        |c| launch_simt(p, f, &plan, out, c, None, None, true),
        |c| run(c, None, None),
    )?;
    // The ReLU rides in the epilogue after the bias: only where the bias did too, on the plain
    // vec4 kernel.
    let relu = ex
        .relu
        .as_mut()
        .filter(|_| choice == Simt::Vec4 && plan.fused_bias.is_some() && p.matrices());
    let mask = plan.mask.filter(|_| choice.is_vec4());
    match relu {
        Some(relu) => {
            let r = (relu.alloc)()?;
            run(choice, Some(&r), None)?;
            relu.out = Some(r);
        }
        None => run(choice, None, mask)?,
    }
    ex.written = choice == Simt::Vec4 && plan.sums.is_some();
    ex.masked = mask.is_some();
    Ok(match choice {
        Simt::Wide(_) => plan.wide_bias.is_some(),
        _ => choice.is_vec4() && plan.fused_bias.is_some(),
    })
}
