//! The word products' launches (`MatmulWide`: CPU adapters with 64-bit integers), out of
//! `matmul.rs`'s launch closure.

use super::u32_of;
use crate::device::DeviceBlock;
use crate::kernels::{launch_groups, launch_groups_uniform, Kernel, MatmulWide, UboWindows};
use crate::Result;

const OP: &str = "matmul";

/// Launches word product `w` (its `kernel`) over `groups`, `blocks` being A's, B's, the
/// output's and the epilogue's. With `w.ubo_a`, A (`a`: its offset and strides, in elements)
/// is copied window by window into the device's uniform scratch before each dispatch
/// (`UboWindows`; each window's first row and row count in immediates 14 and 15); otherwise
/// one dispatch reads every row from A's storage. With `sliver`, one workgroup of the first
/// window: the tuner's preparation, which compiles the kernel.
pub(super) fn launch(
    (w, kernel): (MatmulWide, Kernel),
    (a_off, sam, sak): (usize, usize, usize),
    [m, k]: [usize; 2],
    blocks: &[&DeviceBlock],
    mut imm: Vec<u32>,
    groups: (u32, u32, u32),
    sliver: bool,
) -> Result<()> {
    if !w.ubo_a {
        imm[15] = u32_of(OP, m)?;
        return launch_groups(kernel, blocks, &imm, groups);
    }
    let plan = UboWindows::new(w.dtype, [m, k], sam, sak, w.tile_m());
    let esz = w.dtype.size_bytes();
    for (m0, rows, elems) in plan.windows(m) {
        imm[14] = u32_of(OP, m0)?;
        imm[15] = u32_of(OP, rows)?;
        let start = (a_off + m0 * sam) * esz;
        let bytes = (elems * esz).next_multiple_of(4);
        let groups = match sliver {
            true => (1, 1, 1),
            false => (groups.0, u32_of(OP, rows.div_ceil(w.tile_m()))?, 1),
        };
        launch_groups_uniform(
            kernel,
            (blocks[0], start as u64, bytes as u64),
            &blocks[1..],
            &imm,
            groups,
        )?;
        if sliver {
            break;
        }
    }
    Ok(())
}
