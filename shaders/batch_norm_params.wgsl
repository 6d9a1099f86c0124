// The immediates of batch normalisation's per-channel pass (`batch_norm_finalize.wgsl`) and of
// the elementwise passes with that pass folded in (`batch_norm_apply_folded.wgsl`).
struct Params {
    c: u32,
    chunks: u32,
    // Elements per channel (N * H * W) as f32.
    m: f32,
    eps: f32,
    momentum: f32,
    training: u32,
    // Offsets in f32s of the operands b1 .. b5.
    o0: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    o4: u32,
    // The folded passes only: units (of `{{V}}`) in all, per plane, and x's and g's offsets in
    // them.
    n: u32,
    s: u32,
    x_off: u32,
    g_off: u32,
    pad0: u32,
}

var<immediate> p: Params;
