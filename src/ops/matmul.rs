//! matmul with PyTorch's rules: 1-D operands are promoted (and the added dim removed after),
//! batch dims broadcast, inputs of any strides (a transpose is read in place, not copied).

use super::isize_shape;
use super::matmul_grad::matmul_backward;
use super::matmul_plan::{Product, Route};
use crate::kernels::{CoopLayout, CoopTile};
use crate::tensor::Tensor;
use crate::{DType, Result};

/// `a @ b`.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some(v) = super::autocast::lower("matmul", &[a, b])? {
        return super::autocast::suspended(|| matmul(&v[0], &v[1]));
    }
    crate::graph::record(
        "MmBackward0",
        &[a, b],
        || matmul_forward(a, b, None),
        |_| matmul_backward(a, b),
    )
}

/// A ReLU for the product's epilogue (`linear_relu`): `alloc` makes its output; `out` holds it
/// once a kernel has written it.
pub(super) struct FusedRelu<'a> {
    pub(super) alloc: &'a dyn Fn() -> Result<Tensor>,
    pub(super) out: Option<Tensor>,
}

/// What a product's kernel may do besides the product where it can, and what it did.
#[derive(Default)]
pub(super) struct Extras<'a> {
    /// Write the sums of `a`'s rows here (f32, contiguous); `written` where a kernel did
    /// (`matmul_row_sums`).
    pub(super) sums: Option<&'a Tensor>,
    pub(super) written: bool,
    /// The ReLU of the result (`linear_relu`).
    pub(super) relu: Option<FusedRelu<'a>>,
    /// `ReluBackward0`'s formula (Note [Backward epilogues]): the product kept where this
    /// tensor of the product's shape is not <= 0, zero elsewhere; `masked` where a kernel did.
    pub(super) mask: Option<&'a Tensor>,
    pub(super) masked: bool,
}

/// Whether `mask` can be read by a product's epilogue over an [m, n] output of `a`'s dtype:
/// contiguous, on `a`'s device, with an offset of whole 16-byte vectors.
pub(super) fn mask_fits(mask: &Tensor, a: &Tensor, m: usize, n: usize) -> bool {
    mask.shape() == [m, n]
        && mask.dtype() == a.dtype()
        && mask.is_contiguous()
        && mask.layout().offset.is_multiple_of(4)
        && mask.device() == a.device()
}

/// A 2-D f16 product that misses the tensor-core kernel only because M, K or N is not a whole
/// number of its tiles (an MLP's 784-wide input: `x @ W1^T` with K = 784, `g^T @ x` with
/// N = 784): the ragged dim padded with zeros to whole tiles (copies of the operands, each in
/// its own orientation) and, for N, the first n columns of the product kept (one copy).
/// Splitting K instead would round two partial sums to f16 and lose up to 6e-3 to
/// cancellation (measured on the H100); splitting N into the whole tiles on tensor cores and
/// the rest on the SIMT kernel cost `g^T @ x` 153 us on the H100 (the 16-column rest 80 us,
/// the concatenation 34) where the SIMT kernel alone had taken 346 us.
pub(super) fn coop_split(
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    bias: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let units = match a.dtype() {
        DType::F16 => coop_units(a, b, [m, n, k]),
        DType::F32 => vec4_units(a, b, [m, n, k]),
        _ => None,
    };
    match units {
        Some(units) => padded_product(a, b, [m, n, k], bias, units),
        None => Ok(None),
    }
}

/// The whole units of M, N and K a padded product's kernel takes.
#[derive(Clone, Copy)]
struct Units {
    m: usize,
    n: usize,
    k: usize,
}

/// The tensor-core tile's units for an f16 product on an adapter with cooperative
/// matrices, with each operand of one unit stride.
fn coop_units(a: &Tensor, b: &Tensor, [m, n, _k]: [usize; 3]) -> Option<Units> {
    let info = crate::kernels::coop_f16(a.device())?;
    if a.rank() != 2 || b.rank() != 2 || !unit_stride(a) || !unit_stride(b) {
        return None;
    }
    let layout = CoopLayout {
        a_t: a.strides()[1] != 1,
        b_t: b.strides()[1] != 1,
    };
    let shared = info.limits.max_compute_workgroup_storage_size;
    let tiles = CoopTile::for_layout(layout, m.div_ceil(128) * n.div_ceil(128));
    let t = tiles
        .iter()
        .find(|t| m.is_multiple_of(t.block_m() as usize) && t.valid(shared))
        .or_else(|| tiles.iter().find(|t| t.valid(shared)))?;
    Some(Units {
        m: t.block_m() as usize,
        n: t.block_n() as usize,
        k: t.k_step() as usize,
    })
}

/// An f32 product that misses the vec4 128-tile kernel (`matmul_choice::vec4_eligible`) only
/// because M is not a whole number of 128-row tiles, N of 4 or K of 16, with each operand of
/// one unit stride and the one not copied 16-byte aligned: GPT-2's tied head in f32, whose
/// three 8192 x 50257 x 768 products ran the scalar kernel at 31-33 TFLOP/s on the H200
/// (59.5 ms of a 257 ms step) where the vec4 kernel runs the model's other products at
/// 42-45. Large products on GPUs only (a CPU adapter's products take other kernels, and GL
/// keeps to the scalar one); `force_variant("matmul pad", Some("vec4" | "off"))` forces it
/// on or off (tests on lavapipe, comparisons on a GPU).
fn vec4_units(a: &Tensor, b: &Tensor, [m, n, k]: [usize; 3]) -> Option<Units> {
    let forced = crate::kernels::tune::forced_name("matmul pad");
    let info = a.device().adapter_info()?;
    let gpu =
        !crate::kernels::tune::on_cpu_adapter(a.device()) && info.backend != wgpu::Backend::Gl;
    let on = match forced.as_deref() {
        Some("vec4") => true,
        Some(_) => false,
        None => gpu && m * n * k >= 1 << 30,
    };
    if !on || a.rank() != 2 || b.rank() != 2 || !unit_stride(a) || !unit_stride(b) {
        return None;
    }
    let whole = m.is_multiple_of(128) && n.is_multiple_of(4) && k.is_multiple_of(16);
    let (mp, np) = (m.next_multiple_of(128), n.next_multiple_of(4));
    // What is not copied must already be whole 16-byte vectors: A is copied where M or K
    // is padded, B where N or K is.
    let aligned = |t: &Tensor| {
        [t.layout().offset, t.strides()[0].max(t.strides()[1])]
            .iter()
            .all(|v| v.is_multiple_of(4))
    };
    let a_ok = mp > m || !k.is_multiple_of(16) || aligned(a);
    let b_ok = np > n || !k.is_multiple_of(16) || aligned(b);
    // (The vec4 kernel's own condition for 128-row tiles, which forcing skips.)
    let tiles = (mp / 128) * np.div_ceil(128);
    let big = forced.is_some() || (np >= 128 && tiles >= 64);
    (!whole && a_ok && b_ok && big).then_some(Units {
        m: 128,
        n: 4,
        k: 16,
    })
}

/// Whether a matrix has one unit stride (row-major, or a transposed row-major).
fn unit_stride(t: &Tensor) -> bool {
    t.strides()[0] == 1 || t.strides()[1] == 1
}

/// `a @ b` (+ `bias`) with its ragged dims padded to `units` (`coop_split`); `None` where
/// nothing is ragged or a dim has no whole unit.
fn padded_product(
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    bias: Option<&Tensor>,
    units: Units,
) -> Result<Option<Tensor>> {
    let layout = CoopLayout {
        a_t: a.strides()[1] != 1,
        b_t: b.strides()[1] != 1,
    };
    let (kc, nc) = (k - k % units.k, n - n % units.n);
    let mp = m.next_multiple_of(units.m);
    if kc == 0 || nc == 0 || (kc == k && nc == n && mp == m) {
        return Ok(None);
    }
    // `x` (or its transpose, as stored) copied into zeros with dim `d` of the product's
    // orientation grown to `size`.
    // In one pass where the rows are whole 4-byte words (`super::copy_rows`), else a fill and
    // a copy. Growing dim 0 is growing one long row of the flattened operand.
    let pad = |x: &Tensor, d: usize, transposed: bool, size: usize| -> Result<Tensor> {
        let stored = if transposed { x.t()? } else { x.clone() };
        let d = if transposed { 1 - d } else { d };
        let p = shared_pad(&stored, d, size, || {
            let mut shape = stored.shape().to_vec();
            let len = shape[d];
            shape[d] = size;
            let fast = match d {
                1 => super::copy_rows(&stored, size)?,
                _ if stored.is_contiguous() => {
                    let flat = stored.reshape(&[1, stored.numel() as isize])?;
                    super::copy_rows(&flat, size * shape[1])?
                }
                _ => None,
            };
            match fast {
                Some(p) => p.reshape(&isize_shape(&shape)),
                None => {
                    let p = Tensor::zeros(&shape, x.dtype(), x.device())?;
                    p.narrow(d as isize, 0, len)?.copy_(&stored)?;
                    Ok(p)
                }
            }
        })?;
        if transposed {
            p.t()
        } else {
            Ok(p)
        }
    };
    if mp > m {
        // A ragged M (GPT-2's tied head: `g^T @ h`, M = 50257 logits): A padded with zero rows,
        // the product's padded [mp, n] cut to its first m rows (a contiguous view) and the bias
        // added after. The SIMT kernel took this product 49.5 ms on the H200.
        let ap = pad(a, 0, layout.a_t, mp)?;
        let out =
            super::matmul_simt::with_padded_a(|| match coop_split(&ap, b, [mp, n, k], None)? {
                Some(out) => Ok(out),
                None => matmul_forward(&ap, b, None),
            })?;
        return add_bias(out.narrow(0, 0, m)?, bias).map(Some);
    }
    if nc < n {
        let bp = pad(b, 1, layout.b_t, nc + units.n)?;
        let out = matmul_forward(a, &bp, None)?;
        // (`contiguous` copies the kept rows word by word, `super::copy_rows`.)
        return add_bias(out.narrow(1, 0, n)?.contiguous()?, bias).map(Some);
    }
    // A long K padded to four k steps where that adds at most 1/256 of it, so that a product
    // with few output tiles can split K in halves or quarters (`matmul_partials::coop_partials`:
    // GPT-2's head gradient `g @ W`, K = 50257 -> 50304 rather than 50272); else to the next.
    let step = units.k;
    let four = k.next_multiple_of(4 * step);
    let kp = if four - k <= k / 256 { four } else { kc + step };
    let (ap, bp) = (pad(a, 1, layout.a_t, kp)?, pad(b, 0, layout.b_t, kp)?);
    // The padded product has the same [m, n]: its kernel can add the bias.
    super::matmul_simt::with_padded_a(|| matmul_forward(&ap, &bp, bias)).map(Some)
}

/// A zero-padded copy (`coop_split`'s) of `sharing_pads`'s operand, and the view of it that
/// was padded.
struct Pad {
    source: Tensor,
    dim: usize,
    size: usize,
    version: u64,
    padded: Tensor,
}

thread_local! {
    /// Inside `sharing_pads`: the operand whose pads are shared, and its pads kept.
    static PADS: std::cell::RefCell<Option<(Tensor, Vec<Pad>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a product's two gradients) with `coop_split`'s pads of `g` shared: where both
/// products pad `g` alike (GPT-2's tied head at 8192 tokens: `g @ W` pads the [8192, 50257]
/// gradient's K and `g^T @ h` its M, both to 50304 columns), the second takes the first's
/// copy (0.55 ms and 824 MB written a step, H200). A pad of `g` is kept only until a pad of
/// `g` that does not match it is made (at 6408 tokens `g @ W` pads g's rows and `g^T @ h` its
/// columns: nothing is shared, and the first is dropped before the second is made), and what
/// is kept is dropped when `f` returns; pads of other operands are not kept.
pub(super) fn sharing_pads<R>(g: &Tensor, f: impl FnOnce() -> R) -> R {
    let outer = PADS.with(|p| p.borrow().is_some());
    if outer {
        return f();
    }
    PADS.with(|p| *p.borrow_mut() = Some((g.clone(), Vec::new())));
    let r = f();
    let pads = PADS.with(|p| p.borrow_mut().take());
    drop(pads);
    r
}

/// `x` with dim `dim` padded with zeros to `size`, made by `make`, or the copy an earlier
/// product made of the same tensor alike inside `sharing_pads`.
fn shared_pad(
    x: &Tensor,
    dim: usize,
    size: usize,
    make: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let same = |p: &Pad| {
        p.source.layout == x.layout
            && p.source.dtype() == x.dtype()
            && p.version == x.version()
            && (p.dim, p.size) == (dim, size)
    };
    // (Outside `sharing_pads`, or not its operand: nothing kept.)
    let (hit, shared) = PADS.with(|p| match p.borrow().as_ref() {
        Some((g, pads)) if g.shares_storage(x) => (
            pads.iter().find(|p| same(p)).map(|p| p.padded.clone()),
            true,
        ),
        _ => (None, false),
    });
    if let Some(padded) = hit {
        return Ok(padded);
    }
    if !shared {
        return make();
    }
    let stale = PADS.with(|p| {
        p.borrow_mut()
            .as_mut()
            .map(|(_, pads)| std::mem::take(pads))
    });
    drop(stale);
    let padded = make()?;
    PADS.with(|p| {
        if let Some((_, pads)) = p.borrow_mut().as_mut() {
            pads.push(Pad {
                source: x.clone(),
                dim,
                size,
                version: x.version(),
                padded: padded.clone(),
            });
        }
    });
    Ok(padded)
}

/// `a @ b`, plus `bias` (broadcast against the result) where given: in the kernel's epilogue
/// where the vec4 kernel runs and the bias is a contiguous f32 row of n, else by an add.
pub(super) fn matmul_forward(a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    matmul_with(a, b, bias, true)
}

/// `matmul_forward`, with the narrow kernel (`narrow_product`) among the choices or not.
pub(super) fn matmul_with(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    narrow: bool,
) -> Result<Tensor> {
    matmul_impl(a, b, bias, narrow, &mut Extras::default())
}

/// `a @ b` for two f32 matrices on a GPU, and the sums of `a`'s rows where the product's
/// kernel gives them in passing (`Epilogue::RowSums`: a column-major `a`, a row-major
/// `b`), else `None`. A Linear's backward asks it for `g^T @ x` and gets its bias gradient.
/// Outside autograd and autocast only (the backward's products are neither).
pub(super) fn matmul_row_sums(a: &Tensor, b: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
    let eligible = a.rank() == 2
        && b.rank() == 2
        && a.dtype() == DType::F32
        && !a.device().is_cpu()
        && !crate::graph::needs_grad(&[a, b])
        && [
            super::autocast::DeviceType::Gpu,
            super::autocast::DeviceType::Cpu,
        ]
        .iter()
        .all(|&d| !super::autocast::is_autocast_enabled(d));
    if !eligible {
        return Ok((matmul(a, b)?, None));
    }
    let sums = Tensor::empty(&[a.shape()[0]], DType::F32, a.device())?;
    let mut ex = Extras {
        sums: Some(&sums),
        ..Extras::default()
    };
    let out = matmul_impl(a, b, None, true, &mut ex)?;
    let written = ex.written;
    Ok((out, written.then_some(sums)))
}

/// `matmul_with`, and what `ex` asks where the kernel that runs can (see `Extras`): the sums
/// of `a`'s rows (`matmul_row_sums`), the ReLU of the result into `relu.out` (`linear_relu`;
/// the returned product is then left unwritten), or a backward ReLU mask on the result.
pub(super) fn matmul_impl(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    narrow: bool,
    ex: &mut Extras,
) -> Result<Tensor> {
    let p = Product::new(a, b)?;
    let route = Route::of(&p, narrow);
    super::matmul_plan::run(&p, route, bias, ex)
}

/// `out + bias` (broadcast), or `out` without one.
pub(super) fn add_bias(out: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    match bias {
        Some(bias) => out.add(bias),
        None => Ok(out),
    }
}

impl Tensor {
    /// `self @ other` with PyTorch's broadcasting rules.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(self, other)
    }
}
