//! Products with a narrow side or a short K on `shaders/matmul_narrow.wgsl`, each measured
//! against the tiled path of `matmul.rs` per size class.

use super::matmul::{add_bias, matmul_with, Extras};
use super::u32_of;
use crate::kernels::{launch_groups, tune, Kernel, Narrow};
use crate::tensor::Tensor;
use crate::{DType, Result};
use std::sync::Arc;

/// A 2-D product (f32 or f16, on a GPU) with one narrow side, 16 or fewer columns (`rows`:
/// an MLP's classifier head `h @ W^T`, K = 4096) or rows (`cols`: its weight's gradient
/// `g^T @ h`), the other side 16 or more, K of 256 or more; or a K of 16 or less with both
/// sides 16 or more (`short`: the head's input gradient `g @ W`, K = 10):
/// `shaders/matmul_narrow.wgsl`, the bias added in the `rows` and `short` kernels where it is
/// a contiguous row of the dtype. Measured against the tiled path (split-K, or in f16 a
/// product in f32 between two casts) per size class. On the H100 (784-4096-4096-10, batch
/// 512, f16 under autocast) those took 98 us for the head and 72 us for its weight's
/// gradient, most of it a few workgroups each walking a long K or tiles of 64 rows holding
/// 10; the head's input gradient took 33 us (f32) and 18 us (f16) for a product whose 8 MiB
/// output is 3 us of HBM time.
///
/// With `ex.sums` (f32, contiguous, m elements), `cols` also writes the sums of A's rows there
/// and sets `ex.written` (`matmul_row_sums`: the head's bias gradient from its weight's
/// gradient's launch). With `ex.mask`, `short` and `short4` keep the product where the mask
/// is not <= 0 and set `ex.masked` (the head's input gradient with the ReLU's backward
/// before it: Note [Backward epilogues]).
pub(super) fn narrow_product(
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    bias: Option<&Tensor>,
    ex: &mut Extras,
) -> Result<Option<Tensor>> {
    const OP: &str = "matmul";
    // (`cols` takes one workgroup per 32 columns along x: at most 65535 of them; `short` one
    // per 64 columns along x and per 16 rows along y.)
    let cols = m <= 16 && n >= 16 && (256..=4096).contains(&k) && n.div_ceil(32) <= 65535;
    let rows = n <= 16 && m >= 16 && k >= 256;
    let short = (1..=16).contains(&k)
        && m >= 16
        && n >= 16
        && m.div_ceil(16) <= 65535
        && n.div_ceil(64) <= 65535;
    let kind = match (short, cols, rows) {
        (true, _, _) => Narrow::Short,
        (_, true, _) => Narrow::Cols,
        (_, _, true) => Narrow::Rows,
        _ => return Ok(None),
    };
    if a.device().is_cpu() || !matches!(a.dtype(), DType::F32 | DType::F16) || m == 0 || n == 0 {
        return Ok(None);
    }
    let fused = bias.filter(|t| {
        kind != Narrow::Cols
            && t.dtype() == a.dtype()
            && t.shape() == [n]
            && t.strides() == [1]
            && t.device() == a.device()
    });
    let sums = ex.sums.filter(|t| {
        kind == Narrow::Cols
            && a.dtype() == DType::F32
            && t.dtype() == DType::F32
            && t.shape() == [m]
            && t.strides() == [1]
            && t.device() == a.device()
    });
    let mask = ex.mask.filter(|t| {
        kind == Narrow::Short && fused.is_none() && super::matmul::mask_fits(t, a, m, n)
    });
    let out = Tensor::empty(&[m, n], a.dtype(), a.device())?;
    // Every element index the kernel computes must fit a u32 too.
    for t in [a, b] {
        u32_of(OP, super::end(t))?;
    }
    let groups_x = m.min(65535);
    // `rows4`'s workgroups take four rows each.
    let groups_x4 = m.div_ceil(4).min(65535);
    let imm = [
        m,
        n,
        k,
        a.layout().offset,
        a.strides()[0],
        a.strides()[1],
        b.layout().offset,
        b.strides()[0],
        b.strides()[1],
        out.layout().offset,
        fused.is_some() as usize | (sums.is_some() as usize) << 1,
        fused.or(sums).or(mask).map_or(0, |t| t.layout().offset),
        groups_x,
        0,
        0,
        0,
    ]
    .iter()
    .map(|&v| u32_of(OP, v))
    .collect::<Result<Vec<u32>>>()?;
    // A launch's immediates and grid. (The mask's flag, bit 2, is set only for the launch
    // that keeps its result.)
    let args = |kind: Narrow, mask: Option<&Tensor>| -> Result<(Vec<u32>, (u32, u32))> {
        let mut imm = imm.clone();
        imm[10] |= (mask.is_some() as u32) << 2;
        if kind == Narrow::Rows4 {
            imm[12] = groups_x4 as u32;
        }
        let groups = match kind {
            Narrow::Cols => (n.div_ceil(32), 1),
            Narrow::Rows => (groups_x, m.div_ceil(groups_x)),
            Narrow::Rows4 => (groups_x4, m.div_ceil(4).div_ceil(groups_x4)),
            Narrow::Short => (n.div_ceil(64), m.div_ceil(16)),
            Narrow::Short4 => (n.div_ceil(256), m.div_ceil(16)),
        };
        Ok((imm, (u32_of(OP, groups.0)?, u32_of(OP, groups.1)?)))
    };
    // With `sliver`, one workgroup: the tuner's preparation, which compiles the kernel.
    let launch = |kind: Narrow, mask: Option<&Tensor>, sliver: bool| -> Result<()> {
        let (imm, groups) = args(kind, mask)?;
        let fourth = fused.or(sums).or(mask).unwrap_or(a);
        dispatch(kind, a.dtype(), [a, b, &out, fourth], &imm, groups, sliver)
    };
    let key = || {
        format!(
            "{} {} {}x{}x{}",
            a.dtype(),
            kind.entry_point(),
            tune::class(m),
            tune::class(n),
            tune::class(k)
        )
    };
    let candidates = candidates(kind, a, b, k, fused.is_some(), &out);
    let work = (m * n * k) as u64;
    let tiled = || matmul_with(a, b, bias, false).map(drop);
    let pick = tune::pick_prepared(
        a.device(),
        "matmul narrow",
        key,
        work,
        &candidates,
        |v| match v {
            Some(kind) => launch(kind, None, true),
            None => tiled(),
        },
        |v| match v {
            Some(kind) => launch(kind, None, false),
            None => tiled(),
        },
    )?;
    let Some(kind) = pick else {
        return Ok(None);
    };
    // (The operands are cloned only for a launch `grouped` holds.)
    match holds(kind) {
        true => {
            let (imm, groups) = args(kind, mask)?;
            hold(Launch {
                kind,
                dtype: a.dtype(),
                operands: [a, b, &out, fused.or(sums).or(mask).unwrap_or(a)].map(Tensor::clone),
                imm,
                groups,
            });
        }
        false => launch(kind, mask, false)?,
    }
    ex.written = sums.is_some();
    ex.masked = mask.is_some();
    match fused {
        Some(_) => Ok(Some(out)),
        None => add_bias(out, bias).map(Some),
    }
}

/// The kernels the tuner times for a narrow product of `kind` (`out` its output, `fused`
/// whether the bias rides in the kernel): the narrow kernel, its vec4 form where the operands
/// allow, and the tiled path (`None`).
fn candidates(
    kind: Narrow,
    a: &Tensor,
    b: &Tensor,
    k: usize,
    fused: bool,
    out: &Tensor,
) -> Vec<(Option<Narrow>, &'static str)> {
    let n = out.shape()[1];
    // A row-major B on whole vec4s (the head's `g @ W`): four columns an invocation, 16-byte
    // loads of B and stores (`short4`), is a candidate too. (It adds no bias: a Linear's
    // `W^T` is never a row-major B.) On the H100, 512x4096 by K = 10: 9 us against `short`'s 16
    // (the tuner had judged it by a warm-up full of latency: `tune::Best`).
    let vec4 = kind == Narrow::Short
        && !fused
        && b.strides()[1] == 1
        && [n, b.layout().offset, b.strides()[0], out.layout().offset]
            .iter()
            .all(|v| v.is_multiple_of(4));
    // A row-major A by a transposed row-major W on whole vec4s along K (the head's `h @ W^T`),
    // on an adapter with subgroups: `rows4`. On the H100, 512x10 by K = 4096: `rows` 21 us,
    // `rows4` 10 us (f16: 19 and 10; one row a workgroup on the same loads, 12 us, was
    // dropped).
    let rows4 = kind == Narrow::Rows
        && a.device()
            .adapter_info()
            .is_some_and(|info| info.features.subgroups)
        && a.strides()[1] == 1
        && b.strides()[0] == 1
        && [
            k,
            a.layout().offset,
            a.strides()[0],
            b.layout().offset,
            b.strides()[1],
        ]
        .iter()
        .all(|v| v.is_multiple_of(4));
    let mut candidates = vec![(Some(kind), "narrow")];
    if vec4 {
        candidates.push((Some(Narrow::Short4), "narrow_vec4"));
    }
    if rows4 {
        candidates.push((Some(Narrow::Rows4), "narrow_vec4"));
    }
    candidates.push((None, "tiled"));
    // On a CPU adapter the general product is the default (first: what runs untuned, and the
    // first timed, with its own key's tuning inside its preparation while the budget is
    // whole). On lavapipe it won every narrow key measured: the head 512x4096x10 in 67 ms
    // against `rows`' 210 (a workgroup per row, its shares added over eight barriers), the
    // head's input gradient 64x128x10 in 0.20 ms against 0.41-0.56.
    if tune::on_cpu_adapter(a.device()) {
        candidates.rotate_right(1);
    }
    candidates
}

/// One launch of a narrow kernel, its operands held (A, B, the output, and the fourth binding:
/// bias, row sums, mask, or A again).
struct Launch {
    kind: Narrow,
    dtype: DType,
    operands: [Tensor; 4],
    imm: Vec<u32>,
    groups: (u32, u32),
}

impl Launch {
    fn run(&self) -> Result<()> {
        let operands = self.operands.each_ref();
        dispatch(
            self.kind,
            self.dtype,
            operands,
            &self.imm,
            self.groups,
            false,
        )
    }
}

/// A narrow kernel's dispatch over A, B, the output and the fourth binding; with `sliver`, one
/// workgroup (a tuner's preparation, which compiles the kernel).
fn dispatch(
    kind: Narrow,
    dtype: DType,
    operands: [&Tensor; 4],
    imm: &[u32],
    groups: (u32, u32),
    sliver: bool,
) -> Result<()> {
    let groups = if sliver { (1, 1) } else { groups };
    launch_groups(
        Kernel::MatmulNarrow(dtype, kind),
        &operands.map(|t| &t.storage.block),
        imm,
        (groups.0, groups.1, 1),
    )
}

thread_local! {
    /// The `short4` and `cols` launches held back inside `grouped` on this thread.
    static HELD: std::cell::RefCell<Option<Vec<Launch>>> = const { std::cell::RefCell::new(None) };
}

/// Whether a `grouped` call around this one holds a launch of `kind` (`short4` and `cols`).
fn holds(kind: Narrow) -> bool {
    matches!(kind, Narrow::Short4 | Narrow::Cols) && HELD.with(|h| h.borrow().is_some())
}

/// Holds `launch` for the `grouped` call around this one (`holds`).
fn hold(launch: Launch) {
    HELD.with(|h| {
        if let Some(held) = h.borrow_mut().as_mut() {
            held.push(launch);
        }
    });
}

/// Runs `f` (a product's backward) with its narrow `short4` and `cols` launches held back,
/// then launches them: where they are a classifier head's two gradients, its input's `g @ W`
/// (`short4`) then its weight's `g^T @ h` (`cols`) over the same `g`, in one dispatch
/// (`Kernel::MatmulHeadGrads`) where the tuner measured that faster than the two; otherwise
/// each in order. Their allocations stay where the ops make them. Nothing may read their
/// outputs inside `f`: in `matmul_grads` nothing does, since narrow kernels take only 2-D
/// products and `sum_to` of a 2-D gradient to its own shape launches nothing.
///
/// Why: on the H100's f32 MLP step (784-4096-4096-10, batch 512), an oracle that skipped the
/// `cols` launch saved 20 us of the step and `short4` 9 us, against 13 and 9 us timed alone:
/// each is 128-512 workgroups that leave most of the machine waiting on memory latency, and
/// the second starts only when the first has drained.
pub(super) fn grouped<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let outer = HELD.with(|h| h.replace(Some(Vec::new())));
    let out = f();
    let held = HELD.with(|h| h.replace(outer)).unwrap_or_default();
    // (Launched even where `f` failed after holding them: the outputs were handed out.)
    let launched = launch_held(held);
    let out = out?;
    launched?;
    Ok(out)
}

fn launch_held(held: Vec<Launch>) -> Result<()> {
    let separate = || held.iter().try_for_each(Launch::run);
    let [short, cols] = held.as_slice() else {
        return separate();
    };
    let device = short.operands[0].device();
    let fits = short.kind == Narrow::Short4
        && cols.kind == Narrow::Cols
        && short.dtype == cols.dtype
        && Arc::ptr_eq(&short.operands[0].storage, &cols.operands[0].storage)
        && cols.groups.1 == 1
        && device.adapter_info().is_some_and(|info| {
            info.limits.max_storage_buffers_per_shader_stage >= 7
                && info.limits.max_immediate_size >= 128
                && cols.groups.0 as u64 + short.groups.0 as u64 * short.groups.1 as u64
                    <= info.limits.max_compute_workgroups_per_dimension as u64
        });
    if !fits {
        return separate();
    }
    // `cols`'s workgroups first, `short4`'s after them (each kernel's `split`).
    let mut imm = cols.imm.clone();
    imm[13] = cols.groups.0;
    imm.extend(&short.imm);
    imm[16 + 13] = short.groups.0;
    let x = cols.groups.0 + short.groups.0 * short.groups.1;
    let one = |sliver: bool| {
        let [a, b, out, sums] = &cols.operands;
        let [_, b4, out4, mask4] = &short.operands;
        launch_groups(
            Kernel::MatmulHeadGrads(short.dtype),
            &[a, b, out, sums, b4, out4, mask4].map(|t| &t.storage.block),
            &imm,
            (if sliver { 1 } else { x }, 1, 1),
        )
    };
    let key = || {
        let s = |l: &Launch| {
            let (m, n, k) = (l.imm[0] as usize, l.imm[1] as usize, l.imm[2] as usize);
            format!("{}x{}x{}", tune::class(m), tune::class(n), tune::class(k))
        };
        format!("{} short4 {} cols {}", short.dtype, s(short), s(cols))
    };
    let work = [short, cols]
        .iter()
        .map(|l| l.imm[..3].iter().map(|&v| v as u64).product::<u64>())
        .sum();
    let candidates = [(false, "separate"), (true, "grouped")];
    let grouped = tune::pick_prepared(
        device,
        "matmul narrow grads",
        key,
        work,
        &candidates,
        |g| if g { one(true) } else { Ok(()) },
        |g| if g { one(false) } else { separate() },
    )?;
    if grouped {
        one(false)
    } else {
        separate()
    }
}
