//! The f16 tensor-core product with K split across workgroup layers into f32 partials
//! (`Kernel::MatmulCoopPartials`), for products with too few output tiles to fill the GPU over a
//! long K, and the estimate that decides how many layers (`matmul_plan::coop` asks first).

use super::matmul_plan::{Flat, Product};
use super::u32_of;
use crate::kernels::{launch_groups, CoopLayout, CoopTile, Kernel};
use crate::tensor::Tensor;
use crate::{DType, Result};

const OP: &str = "matmul";

/// Workgroups of the 128 x 128 tensor-core tile that run at once on a 132-SM GPU (H100,
/// H200): two to an SM. Vulkan does not say how many SMs an adapter has.
const COOP_SLOTS: usize = 264;

/// Layers for a split of K (`coop_partials`) of an [m, n] product of `tiles` output tiles over
/// `k`: the power of two up to 8 (each layer's slice a whole number of `step`s, at least 512
/// deep) with the least estimated time, `None` where that is one layer. The
/// estimate, from the H200: a wave of `COOP_SLOTS` workgroups takes 29.8 ns per K value of a
/// slice (300 TFLOP/s over the slots), and the partials cost `(8 layers + 10)` bytes per
/// output element at 2.5 TB/s (written and read, the f32 sum written and read, the f16
/// written) and two launches of 5 us. GPT-2 at b8 T1024, H200, unsplit -> split: its weight
/// gradients' 36 tiles (K 8192) 201 -> 93 us in 4 layers, 108 tiles 204 -> 149 us in 2, the
/// head's `g @ W` (384 tiles, K 50304) 3.42 -> 2.76 ms in 2; and where the estimate says one
/// layer, the split measured slower: 144 tiles (K 8192) 208 -> 223 us in 4, 384 tiles of K
/// 2304 144 -> 197 us in 2.
fn partial_layers([m, n]: [usize; 2], tiles: usize, k: usize, step: usize) -> Option<usize> {
    let estimate = |layers: usize| {
        let waves = (tiles * layers).div_ceil(COOP_SLOTS) as f64;
        let products = waves * (k / layers) as f64 * 29.8e-9;
        let partials = match layers {
            1 => 0.0,
            _ => (m * n * (8 * layers + 10)) as f64 / 2.5e12 + 10e-6,
        };
        products + partials
    };
    // A split must beat one layer by a tenth: with fewer tiles than slots an SM runs one
    // workgroup alone, faster than the estimate's share (144 tiles: 208-229 us measured, 244
    // estimated).
    let mut best = (1, 0.9 * estimate(1));
    for layers in [2, 4, 8] {
        if !k.is_multiple_of(layers * step) || k / layers < 512 {
            continue;
        }
        let time = estimate(layers);
        if time < best.1 {
            best = (layers, time);
        }
    }
    (best.0 > 1).then_some(best.0)
}

/// The tensor-core product with K split across workgroup layers, where it has too few output
/// tiles to fill the GPU over a long K (a weight gradient `g^T @ x`: GPT-2's [768, 8192] @
/// [8192, 768] is 36 tiles of 128 x 128, 0.2 ms on the H200 unsplit, 48 TFLOP/s). Layer z
/// multiplies K slice z (the batch strides step through K) into an f32 partial [layers, m,
/// n]; the partials are summed in f32 and rounded once to f16 into `out`, as the unsplit
/// kernel rounds its sums (f16 partials would each be rounded, and lose up to 6e-3 to
/// cancellation). Returns whether it ran (2-D products without a bias only).
pub(super) fn coop_partials(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    (tile, layout, lda, ldb): (CoopTile, CoopLayout, usize, usize),
) -> Result<bool> {
    let (m, n, k) = (p.m, p.n, p.k);
    let tiles = (m / tile.block_m() as usize) * (n / tile.block_n() as usize);
    let split = tile == CoopTile::DEFAULT && f.batch == 1;
    let Some(layers) = split
        .then(|| partial_layers([m, n], tiles, k, tile.k_step() as usize))
        .flatten()
    else {
        return Ok(false);
    };
    let slice = k / layers;
    // A slice's first element: `slice` rows down a k-major operand, `slice` along a row of a
    // k-contiguous one.
    let sab = if layout.a_t { slice * lda } else { slice };
    let sbb = if layout.b_t { slice } else { slice * ldb };
    let partial = Tensor::empty(&[layers, m, n], DType::F32, out.device())?;
    let imm = [
        m,
        n,
        slice,
        layers,
        f.a.layout().offset,
        sab,
        lda,
        f.b.layout().offset,
        sbb,
        ldb,
        0,
        0,
    ]
    .iter()
    .map(|&v| u32_of(OP, v))
    .collect::<Result<Vec<u32>>>()?;
    u32_of(OP, partial.numel())?;
    let groups = (
        n as u32 / tile.block_n(),
        m as u32 / tile.block_m(),
        layers as u32,
    );
    launch_groups(
        Kernel::MatmulCoopPartials(tile, layout),
        &[
            &f.a.storage.block,
            &f.b.storage.block,
            &partial.storage.block,
            &f.a.storage.block,
        ],
        &imm,
        groups,
    )?;
    let summed = partial.sum(&[0], false)?;
    drop(partial);
    super::predicate::cast_into(&summed, out)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::partial_layers;

    /// GPT-2's weight gradients (K = 8192), its head's `g @ W` (384 tiles, K = 50304) and
    /// its layers' `g @ W` (384 tiles, K = 2304).
    #[test]
    fn k_splits_where_the_estimate_gains() {
        assert_eq!(partial_layers([768, 768], 36, 8192, 32), Some(4));
        assert_eq!(partial_layers([2304, 768], 108, 8192, 32), Some(2));
        assert_eq!(partial_layers([3072, 768], 144, 8192, 32), None);
        assert_eq!(partial_layers([8192, 768], 384, 50304, 32), Some(2));
        assert_eq!(partial_layers([8192, 768], 384, 2304, 32), None);
        // Too shallow to split, or not in whole steps.
        assert_eq!(partial_layers([128, 128], 1, 512, 32), None);
        assert_eq!(partial_layers([768, 768], 36, 50272, 32), None);
    }
}
