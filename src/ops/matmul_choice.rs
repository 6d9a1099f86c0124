//! Which kernel a product takes: the tensor-core tile and layout, the split of a long K, the
//! vec4 128-tile kernel's conditions, and the switches that force a choice for benchmarks.

use crate::kernels::{CoopLayout, CoopTile};
use crate::tensor::Tensor;
use crate::DType;

/// The tensor-core path for this product, where it applies: f16 on an adapter with
/// cooperative matrices, whole tiles, whole K slices, each operand with one unit stride
/// (row-major or transposed, as `W^T` in `x @ W^T`) and 16-byte aligned rows and offsets.
/// Returns the tile shape, the layout and the two leading dimensions.
pub(super) fn coop_tile(
    a: &Tensor,
    [m, n, k, batch]: [usize; 4],
    fa: &Tensor,
    fb: &Tensor,
    s: [usize; 6],
) -> Option<(CoopTile, CoopLayout, usize, usize)> {
    let [sam, sak, sbk, sbn, sab, sbb] = s;
    let info = crate::kernels::coop_f16(a.device())?;
    // Row-major where the inner stride is 1, else transposed where the outer one is.
    let (a_t, lda) = match (sak, sam) {
        (1, ld) => (false, ld),
        (ld, 1) => (true, ld),
        _ => return None,
    };
    let (b_t, ldb) = match (sbn, sbk) {
        (1, ld) => (false, ld),
        (ld, 1) => (true, ld),
        _ => return None,
    };
    let aligned = a.dtype() == crate::tensor::DType::F16
        && k > 0
        && [lda, ldb, sab, sbb, fa.layout().offset, fb.layout().offset]
            .iter()
            .all(|v| v % 8 == 0);
    if !aligned {
        return None;
    }
    let layout = CoopLayout { a_t, b_t };
    let shared = info.limits.max_compute_workgroup_storage_size;
    let tiles = m.div_ceil(128) * n.div_ceil(128) * batch;
    let tile = *CoopTile::for_layout(layout, tiles).iter().find(|t| {
        m % t.block_m() as usize == 0
            && n % t.block_n() as usize == 0
            && k % t.k_step() as usize == 0
            && t.valid(shared)
    })?;
    Some((tile, layout, lda, ldb))
}

static FORCED_TILE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// The f32/f16 SIMT matmul's tile: 0 picks by size; `KILN_MATMUL_TILE=64|128` or
/// `force_matmul_tile` force one.
pub(super) fn forced_tile() -> u32 {
    use std::sync::atomic::Ordering;
    let t = FORCED_TILE.load(Ordering::Relaxed);
    if t != u32::MAX {
        return t;
    }
    let env = std::env::var("KILN_MATMUL_TILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|t| *t == 64 || *t == 128)
        .unwrap_or(0);
    FORCED_TILE.store(env, Ordering::Relaxed);
    env
}

/// Forces the SIMT matmul's tile (64 or 128; `None` picks by size), for tests and benchmarks.
#[doc(hidden)]
pub fn force_matmul_tile(tile: Option<u32>) {
    FORCED_TILE.store(tile.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

/// Chunks to split K into, for 2-D products on a GPU with too few 64x64 tiles to fill it: a
/// long K under 32 tiles (about 128 workgroups in all), or, in f32, a K of 512 or more under
/// 128 tiles where the product is large enough for the extra sum to pay (about 256
/// workgroups: the MLP's 10x4096 head gradient, K = 512, went from 64 workgroups); each chunk
/// at least 128 deep. And chunks where 128x128 tiles would leave SMs idle (`fill_split`).
pub(super) fn split_k(a: &Tensor, m: usize, n: usize, k: usize, batch: &[usize]) -> Option<usize> {
    if a.device().is_cpu() || a.dtype() == DType::F64 || !batch.is_empty() {
        return None;
    }
    let tiles = m.div_ceil(64) * n.div_ceil(64);
    let long = k >= 1024 && tiles < 32;
    let wide = a.dtype() == DType::F32 && k >= 512 && tiles < 128 && m * n * k >= 1 << 24;
    if let Some(s) = fill_split(a, m, n, k) {
        return Some(s);
    }
    if !long && !wide {
        return None;
    }
    let workgroups = if long { 128 } else { 256 };
    let mut s = (k / 128).min(workgroups / tiles).max(1);
    s = 1 << s.ilog2();
    while s > 1 && !k.is_multiple_of(s) {
        s /= 2;
    }
    (s >= 2).then_some(s)
}

/// Chunks of K for an f32 product of whole 128x128 tiles that leave SMs of a large GPU idle
/// (the H100 and H200 have 132): fewer tiles than SMs (16 to 127), or more than one wave's
/// 132 but fewer than two waves' 264, where the second wave runs nearly empty. K must be 1024
/// or more. K is split into chunks of at least 1024, two to eight of them. On the H200:
/// - a 1024^3 product (64 tiles) ran 20.0 TFLOP/s whole, 30.5 in two chunks (the sum
///   included), 28.8 in four and 25.6 in eight;
/// - GPT-2's f32 step spends most of its time in weight gradients of 144 tiles (3072 x 768
///   and 768 x 3072 over K = 8192), of 108 tiles and of 36. It took 212.7 ms with those whole
///   or in two chunks, 200.0 with the 144-tile ones in four chunks, 197.7 in eight, and 195.7
///   with the others in eight chunks too;
/// - the big MLP's 128-tile forward (K = 4096), one wave already, went from 1.57 to 1.72 ms a
///   step when split in eight, so whole waves stay whole.
fn fill_split(a: &Tensor, m: usize, n: usize, k: usize) -> Option<usize> {
    let tiles = (m / 128) * (n / 128);
    let idle = (16..128).contains(&tiles) || (133..264).contains(&tiles);
    let s = (k / 1024).clamp(2, 8);
    let s = 1 << s.ilog2();
    (a.dtype() == DType::F32
        && m.is_multiple_of(128)
        && n.is_multiple_of(128)
        && idle
        && k >= 1024
        && k.is_multiple_of(32 * s))
    .then_some(s)
}

/// `KILN_MATMUL_SCALAR=1`: the scalar 128-tile kernel even where the vec4 one applies (for
/// comparisons in benchmarks).
pub(super) fn scalar_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var("KILN_MATMUL_SCALAR").is_ok_and(|v| v == "1"))
}

/// Whether the vec4 128-tile kernel takes this f32 product: whole tiles of rows (N a multiple
/// of 4: the last tile of columns may be partial), and every operand read as 16-byte vectors
/// along its unit-stride dim.
pub(super) fn vec4_eligible(
    [m, n, k]: [usize; 3],
    [off_a, sab, sam, sak]: [usize; 4],
    [off_b, sbb, sbk, sbn]: [usize; 4],
) -> bool {
    let aligned = |v: usize| v.is_multiple_of(4);
    m.is_multiple_of(128)
        && n.is_multiple_of(4)
        && k.is_multiple_of(16)
        && [off_a, sab, off_b, sbb].into_iter().all(aligned)
        && ((sak == 1 && aligned(sam)) || (sam == 1 && aligned(sak)))
        && ((sbn == 1 && aligned(sbk)) || (sbk == 1 && aligned(sbn)))
}
