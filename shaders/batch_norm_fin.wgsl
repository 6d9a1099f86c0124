// The per-channel finalize's parameters (`batch_norm_finalize_fns.wgsl`): the finalize pass's
// immediates, and the last twelve words of the partial sums' pass's, which may run it.
struct Fin {
    c: u32,
    chunks: u32,
    // Elements per channel (N * H * W) as f32.
    m: f32,
    eps: f32,
    momentum: f32,
    training: u32,
    // Offsets in f32s of b1..b5.
    o0: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    o4: u32,
}
