// The immediates of the narrow product kernels (`matmul_narrow.wgsl`, `matmul_short4.wgsl`;
// `matmul_head_grads.wgsl` takes two).
struct Params {
    m: u32,
    n: u32,
    k: u32,
    off_a: u32,
    sam: u32,
    sak: u32,
    off_b: u32,
    sbk: u32,
    sbn: u32,
    off_out: u32,
    // Bit 0: add bias[j] (rows, short).
    flags: u32,
    off_bias: u32,
    // Workgroups along x (rows: the row is x + y * groups_x).
    groups_x: u32,
    // `matmul_head_grads.wgsl`: `cols`'s workgroups, which come first (its own immediates),
    // and `short4`'s along x (short4's).
    split: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;
