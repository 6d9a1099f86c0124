//! The matmul planner: a checked product (`Product`: operands promoted to matrices, sizes, the
//! batch shape) goes in, one route comes out (`Route`: the narrow kernels, K split into
//! chunks, the f16 tensor-core kernel with padded operands, or one launch over the flattened
//! operands), and the launch over flattened operands is planned in turn (`Direct`: the CPU
//! reference, the tensor-core kernel, or the SIMT kernels among which the tuner picks, with
//! their epilogues). Each kernel family launches from its own function; `matmul.rs` keeps the
//! public ops, `matmul_choice.rs` the conditions each family sets.

use super::matmul::{add_bias, Extras};
use super::matmul_choice::{coop_tile, forced_tile, scalar_forced, split_k, vec4_eligible};
use super::{same_device, u32_of};
use crate::kernels::{
    launch_groups, tune, CoopLayout, CoopTile, Epilogue, Kernel, MatmulWide, Operands, UboWindows,
    Vec4Layout,
};
use crate::tensor::{broadcast_shapes, contiguous_strides, Layout, Tensor};
use crate::{DType, Error, Result};

const OP: &str = "matmul";

/// A product after PyTorch's checks: `a` and `b` as given, `a2` and `b2` promoted to at least
/// two dims (a 1-D operand gains a dim, removed from the result after), `[m, k] @ [k, n]`
/// per matrix and the broadcast batch shape.
pub(super) struct Product {
    pub a: Tensor,
    pub b: Tensor,
    pub a2: Tensor,
    pub b2: Tensor,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch_shape: Vec<usize>,
}

impl Product {
    /// Checks `a @ b` as PyTorch does (device, dtype, rank, contraction, batch broadcast).
    pub fn new(a: &Tensor, b: &Tensor) -> Result<Product> {
        same_device(OP, a, b)?;
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: a.dtype(),
                got: b.dtype(),
            });
        }
        if !a.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: a.dtype(),
                why: "(a float op, as on CUDA)".into(),
            });
        }
        if a.rank() == 0 || b.rank() == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "both arguments to matmul need to be at least 1D".into(),
            });
        }
        let a2 = if a.rank() == 1 {
            a.unsqueeze(0)?
        } else {
            a.clone()
        };
        let b2 = if b.rank() == 1 {
            b.unsqueeze(1)?
        } else {
            b.clone()
        };
        let (ra, rb) = (a2.rank(), b2.rank());
        let (m, k) = (a2.shape()[ra - 2], a2.shape()[ra - 1]);
        let (k2, n) = (b2.shape()[rb - 2], b2.shape()[rb - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: a.shape().to_vec(),
                rhs: b.shape().to_vec(),
            });
        }
        let batch_shape = broadcast_shapes(OP, &a2.shape()[..ra - 2], &b2.shape()[..rb - 2])?;
        Ok(Product {
            a: a.clone(),
            b: b.clone(),
            a2,
            b2,
            m,
            n,
            k,
            batch_shape,
        })
    }

    /// Both operands matrices.
    pub fn matrices(&self) -> bool {
        self.a.rank() == 2 && self.b.rank() == 2
    }

    /// The result's shape: the batch shape, then m and n, less the dims a 1-D operand gained.
    pub fn result_shape(&self) -> Vec<isize> {
        let mut shape: Vec<isize> = self.batch_shape.iter().map(|&d| d as isize).collect();
        if self.a.rank() > 1 {
            shape.push(self.m as isize);
        }
        if self.b.rank() > 1 {
            shape.push(self.n as isize);
        }
        shape
    }

    /// `batch_shape` followed by `tail`.
    fn full(&self, tail: [usize; 2]) -> Vec<usize> {
        self.batch_shape.iter().copied().chain(tail).collect()
    }
}

/// How a product runs, in the order they are tried (`Route::of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// A narrow side or a short K (`matmul_narrow.rs`), which may still decline.
    Narrow,
    /// Few output tiles over a long K, in f16: the product in f32 between two casts (each
    /// chunk's partial sums rounded to f16 lost 2e-3 at K = 4096; on the H100 the 512x4096x10
    /// head went from 528 us to 29 us).
    Widened,
    /// Few output tiles over a long K: `s` independent chunks of K as a batched product
    /// (views, no copies), then a sum over them.
    Chunks(usize),
    /// On a CPU adapter, K longer than llvmpipe's loop limit lets one invocation walk
    /// (`CPU_K_LIMIT`): products of K slices of `len` (narrowed views, the last shorter),
    /// summed in f32.
    KSlices(usize),
    /// The f16 tensor-core kernel, or for large f32 products on a GPU the vec4 128-tile
    /// kernel, with a ragged dim padded (`matmul::coop_split`), which may decline; then
    /// `Direct`.
    CoopPadded,
    /// One launch over the flattened operands (`Direct`).
    Direct,
}

impl Route {
    /// The first route for `p`; `narrow` offers the narrow kernels.
    pub fn of(p: &Product, narrow: bool) -> Route {
        if p.matrices() && p.k > CPU_K_LIMIT && tune::on_cpu_adapter(p.a.device()) {
            return match p.a.dtype() {
                DType::F16 => Route::Widened,
                _ => Route::KSlices(CPU_K_LIMIT / 2),
            };
        }
        if narrow && p.matrices() {
            return Route::Narrow;
        }
        Route::after_narrow(p)
    }

    /// The route once the narrow kernels declined.
    pub fn after_narrow(p: &Product) -> Route {
        match split_k(&p.a, p.m, p.n, p.k, &p.batch_shape) {
            Some(_) if p.a.dtype() == DType::F16 => Route::Widened,
            Some(s) => Route::Chunks(s),
            None => Route::CoopPadded,
        }
    }
}

/// The operands of a direct launch with one batch dim (coalesced where the layout allows,
/// else copied), and their strides.
pub(super) struct Flat {
    pub a: Tensor,
    pub b: Tensor,
    pub batch: usize,
    pub sab: usize,
    pub sbb: usize,
    pub sam: usize,
    pub sak: usize,
    pub sbk: usize,
    pub sbn: usize,
}

impl Flat {
    /// `a` [.., m, k] and `b` [.., k, n], broadcast to one batch shape, brought to a single
    /// batch dim.
    fn new(a: Tensor, b: Tensor, batch_shape: &[usize]) -> Result<Flat> {
        let nb = batch_shape.len();
        let batch: usize = batch_shape.iter().product();
        let mut strides = vec![
            a.strides()[..nb].to_vec(),
            b.strides()[..nb].to_vec(),
            contiguous_strides(batch_shape),
        ];
        let shape = Layout::coalesce(batch_shape, &mut strides);
        let (a, b, sab, sbb) = if shape.len() <= 1 {
            let first = |s: &Vec<usize>| s.first().copied().unwrap_or(0);
            let (sab, sbb) = (first(&strides[0]), first(&strides[1]));
            (a, b, sab, sbb)
        } else {
            let (m, k, n) = (a.shape()[nb], a.shape()[nb + 1], b.shape()[nb + 1]);
            let a = a.reshape(&[batch as isize, m as isize, k as isize])?;
            let b = b.reshape(&[batch as isize, k as isize, n as isize])?;
            let (sab, sbb) = (a.strides()[0], b.strides()[0]);
            (a, b, sab, sbb)
        };
        let (ra, rb) = (a.rank(), b.rank());
        let (sam, sak) = (a.strides()[ra - 2], a.strides()[ra - 1]);
        let (sbk, sbn) = (b.strides()[rb - 2], b.strides()[rb - 1]);
        Ok(Flat {
            a,
            b,
            batch,
            sab,
            sbb,
            sam,
            sak,
            sbk,
            sbn,
        })
    }
}

/// Which kernel family a direct launch takes.
enum Direct {
    /// The CPU device's reference.
    Cpu,
    /// Tensor cores: the tile, the layout and the two leading dims (`coop_tile`).
    Coop(CoopTile, CoopLayout, usize, usize),
    /// The SIMT kernels (`SimtPlan`).
    Simt,
}

impl Direct {
    fn of(p: &Product, f: &Flat) -> Direct {
        if p.a.device().is_cpu() {
            return Direct::Cpu;
        }
        let dims = [p.m, p.n, p.k, f.batch];
        let strides = [f.sam, f.sak, f.sbk, f.sbn, f.sab, f.sbb];
        match coop_tile(&p.a, dims, &f.a, &f.b, strides) {
            Some((tile, layout, lda, ldb)) => Direct::Coop(tile, layout, lda, ldb),
            None => Direct::Simt,
        }
    }
}

/// `a @ b` by one launch over the flattened operands, with the bias where the kernel adds it;
/// returns the product [batch.., m, n] and whether the bias was added.
pub(super) fn direct(
    p: &Product,
    bias: Option<&Tensor>,
    ex: &mut Extras,
) -> Result<(Tensor, bool)> {
    let a3 = p.a2.expand(&p.full([p.m, p.k]))?;
    let b3 = p.b2.expand(&p.full([p.k, p.n]))?;
    let out = Tensor::empty(&p.full([p.m, p.n]), p.a.dtype(), p.a.device())?;
    if out.numel() == 0 {
        return Ok((out, false));
    }
    if p.k == 0 {
        // An empty contraction sums nothing: zeros, as in PyTorch.
        out.storage.block.fill_u32(0)?;
        return Ok((out, false));
    }
    let f = Flat::new(a3, b3, &p.batch_shape)?;
    let fused = match Direct::of(p, &f) {
        Direct::Cpu => {
            crate::ops::ready_on_host(&[&f.a, &f.b])?;
            crate::cpu::matmul(
                &f.a,
                &f.b,
                &out,
                [p.m, p.n, p.k, f.batch],
                [f.sab, f.sam, f.sak],
                [f.sbb, f.sbk, f.sbn],
            );
            false
        }
        Direct::Coop(tile, layout, lda, ldb) => coop(p, &f, &out, bias, (tile, layout, lda, ldb))?,
        Direct::Simt => simt(p, &f, &out, bias, ex)?,
    };
    Ok((out, fused))
}

/// The tensor-core kernel: f32 accumulators, rounded to f16 in the kernel, the bias added
/// before the rounding where it is a row of n f16 values on whole 16-byte vectors. Returns
/// whether it added the bias.
fn coop(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    bias: Option<&Tensor>,
    (tile, layout, lda, ldb): (CoopTile, CoopLayout, usize, usize),
) -> Result<bool> {
    let (m, n) = (p.m, p.n);
    if bias.is_none() && super::matmul_partials::coop_partials(p, f, out, (tile, layout, lda, ldb))?
    {
        return Ok(false);
    }
    let fused = bias.filter(|t| {
        t.dtype() == DType::F16
            && t.shape() == [n]
            && t.strides() == [1]
            && t.layout().offset.is_multiple_of(8)
            && t.device() == p.a.device()
    });
    let imm = [
        m,
        n,
        p.k,
        f.batch,
        f.a.layout().offset,
        f.sab,
        lda,
        f.b.layout().offset,
        f.sbb,
        ldb,
        fused.is_some() as usize,
        fused.map_or(0, |t| t.layout().offset),
    ]
    .iter()
    .map(|&v| u32_of(OP, v))
    .collect::<Result<Vec<u32>>>()?;
    let big = |t: &Tensor| crate::kernels::past_one_binding(&t.storage.block);
    if f.batch == 1 && (big(out) || (big(&f.a) && !layout.a_t)) {
        super::matmul_windows::coop_rows(p, f, out, (tile, layout), imm, fused)?;
        return Ok(fused.is_some());
    }
    if f.batch == 1 && fused.is_none() && ((big(&f.a) && layout.a_t) || (big(&f.b) && !layout.b_t))
    {
        super::matmul_windows::coop_k_windows(p, f, out, (tile, layout), imm)?;
        return Ok(false);
    }
    let groups = (
        n as u32 / tile.block_n(),
        m as u32 / tile.block_m(),
        u32_of(OP, f.batch)?,
    );
    launch_groups(
        Kernel::MatmulCoop(tile, layout),
        &[
            &f.a.storage.block,
            &f.b.storage.block,
            &out.storage.block,
            fused.map_or(&f.a.storage.block, |t| &t.storage.block),
        ],
        &imm,
        groups,
    )?;
    Ok(fused.is_some())
}

/// The longest K one product takes on a CPU adapter: llvmpipe breaks out of an invocation's
/// loops after 65535 loop headers (`tune::CPU_ADAPTER_LOOP_HEADERS`), and its kernels pass
/// about one per K value (dev box, 2026-11-29: 16x65535x16, 16x65535x1 and 512x65535x10 came
/// back wrong, by up to 3.0, where K was odd and no route split it; K of 32767 was right).
const CPU_K_LIMIT: usize = 32768;

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
    let (m, n, k) = (p.m, p.n, p.k);
    let fused = match choice {
        Simt::Wide(_) => plan.wide_bias,
        _ => plan.fused_bias.filter(|_| choice.is_vec4()),
    };
    let sums = plan.sums.filter(|_| choice == Simt::Vec4);
    // Vec4ColA: A copied column-major first, so that the product runs the kernel with that
    // layout compiled in (a transposed copy of A, then `Operands::ColRow`).
    let col_a = match choice {
        Simt::Vec4ColA => Some(crate::no_grad(|| f.a.t()?.contiguous())?),
        _ => None,
    };
    let (a_op, a_off, sam, sak) = match &col_a {
        Some(t) => (t, t.layout().offset, 1, m),
        None => (&f.a, f.a.layout().offset, f.sam, f.sak),
    };
    let mut imm = vec![
        m,
        n,
        k,
        f.batch,
        a_off,
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
        Simt::Vec4 if relu_out.is_some() => (
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
    let imm = imm
        .into_iter()
        .map(|v| u32_of(OP, v))
        .collect::<Result<Vec<u32>>>()?;
    let tile_n = match choice {
        Simt::Wide(_) => MatmulWide::TILE_N,
        _ => tile,
    };
    let groups = (
        // (The row sums' column of workgroups after the product's.)
        (n.div_ceil(tile_n) + sums.is_some() as usize) as u32,
        m.div_ceil(tile) as u32,
        u32_of(OP, f.batch)?,
    );
    let groups = if sliver { (1, 1, 1) } else { groups };
    let dest = relu_out.unwrap_or(out);
    let mut blocks = vec![&a_op.storage.block, &f.b.storage.block, &dest.storage.block];
    if choice.is_vec4() || matches!(choice, Simt::Wide(_)) {
        // Without a bias, sums or a mask the fourth binding is a dummy (the flags are clear).
        blocks.push(
            fused
                .or(sums)
                .or(mask)
                .map_or(&f.a.storage.block, |t| &t.storage.block),
        );
    }
    match choice {
        Simt::Wide(w) => super::matmul_words::launch(
            (w, kernel),
            (a_off, sam, sak),
            [m, k],
            &blocks,
            imm,
            groups,
            sliver,
        ),
        _ => launch_groups(kernel, &blocks, &imm, groups),
    }
}

/// The SIMT product: the tuner picks among the plan's candidates (measured per adapter), then
/// the choice runs with the epilogues it takes, and `ex` learns what it did. Returns whether
/// the kernel added the bias.
fn simt(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    bias: Option<&Tensor>,
    ex: &mut Extras,
) -> Result<bool> {
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

/// `a @ b` as `route` says, then (where the route declines) the next route; plus the bias.
pub(super) fn run(
    p: &Product,
    route: Route,
    bias: Option<&Tensor>,
    ex: &mut Extras,
) -> Result<Tensor> {
    let (m, n, k) = (p.m, p.n, p.k);
    match route {
        Route::Narrow => {
            match super::matmul_narrow::narrow_product(&p.a, &p.b, [m, n, k], bias, ex)? {
                Some(out) => Ok(out),
                None => run(p, Route::after_narrow(p), bias, ex),
            }
        }
        Route::Widened => {
            let wide = |t: &Tensor| super::predicate::to_dtype(t, DType::F32);
            let out = super::matmul::matmul_forward(&wide(&p.a)?, &wide(&p.b)?, None)?;
            add_bias(super::predicate::to_dtype(&out, DType::F16)?, bias)
        }
        Route::KSlices(len) => {
            let slice = |k0: usize| {
                let kl = len.min(k - k0);
                let (a, b) = (p.a2.narrow(1, k0, kl)?, p.b2.narrow(0, k0, kl)?);
                super::matmul::matmul_forward(&a, &b, None)
            };
            // (K is over CPU_K_LIMIT here: the first slice is never empty.)
            let mut sum = slice(0)?;
            for k0 in (len..k).step_by(len) {
                sum = sum.add(&slice(k0)?)?;
            }
            add_bias(sum.reshape(&p.result_shape())?, bias)
        }
        Route::Chunks(s) => {
            let ks = (k / s) as isize;
            let chunks =
                p.a2.view(&[m as isize, s as isize, ks])
                    .ok()
                    .and_then(|parts| {
                        let bparts = p.b2.view(&[s as isize, ks, n as isize]).ok()?;
                        Some((parts.permute(&[1, 0, 2]).ok()?, bparts))
                    });
            let Some((parts, bparts)) = chunks else {
                return run(p, Route::CoopPadded, bias, ex);
            };
            let sum = super::matmul::matmul_forward(&parts, &bparts, None)?.sum(&[0], false)?;
            add_bias(sum.reshape(&p.result_shape())?, bias)
        }
        Route::CoopPadded => {
            // The bias goes with the product (into a tensor-core kernel's epilogue where it
            // can); a vector operand's product is reshaped first.
            let with = bias.filter(|_| p.matrices());
            let Some(out) = super::matmul::coop_split(&p.a2, &p.b2, [m, n, k], with)? else {
                return run(p, Route::Direct, bias, ex);
            };
            match (p.a.rank(), p.b.rank()) {
                (1, _) => add_bias(out.reshape(&[n as isize])?, bias),
                (_, 1) => add_bias(out.reshape(&[m as isize])?, bias),
                _ => Ok(out),
            }
        }
        Route::Direct => {
            let (out, fused) = direct(p, bias, ex)?;
            add_bias(out.reshape(&p.result_shape())?, bias.filter(|_| !fused))
        }
    }
}
