//! The matmul planner: a checked product (`Product`: operands promoted to matrices, sizes, the
//! batch shape) goes in, one route comes out (`Route`: the narrow kernels, K split into
//! chunks, the f16 tensor-core kernel with padded operands, or one launch over the flattened
//! operands), and the launch over flattened operands is planned in turn (`Direct`: the CPU
//! reference, the tensor-core kernel, or the SIMT kernels among which the tuner picks, with
//! their epilogues, in `matmul_simt.rs`). Each kernel family launches from its own function;
//! `matmul.rs` keeps the public ops, `matmul_choice.rs` the conditions each family sets,
//! `matmul_windows.rs` the launches over windows of operands past one binding.

use super::matmul::{add_bias, Extras};
use super::matmul_choice::{coop_tile, split_k};
use super::{same_device, u32_of};
use crate::kernels::{launch_groups, tune, CoopLayout, CoopTile, Kernel};
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
        // Chunks are one batched launch binding the operands whole: past one binding, the
        // direct routes take windows of K instead (`matmul_windows`).
        let big = |t: &Tensor| crate::kernels::past_one_binding(&t.storage.block);
        match split_k(&p.a, p.m, p.n, p.k, &p.batch_shape) {
            Some(_) if big(&p.a) || big(&p.b) => Route::CoopPadded,
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
        Direct::Simt => super::matmul_simt::simt(p, &f, &out, bias, ex)?,
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
