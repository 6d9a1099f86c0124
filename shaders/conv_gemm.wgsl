// Convolution as implicit GEMM on the 128-tile matmul (`matmul128.wgsl` supplies the tiles,
// the K loop and the prefetch; `src/kernels/matmul128.rs` generates `main`). NCHW tensors,
// stride, zero padding, dilation and groups; nothing is unfolded in memory: the operand that
// a convolution reads through its window is gathered while the slice is loaded. Three
// modes share these immediates and bindings (`conv_gemm_{fwd,dgrad,wgrad}.wgsl`):
//   fwd:   y[img, co, q]    = sum over (tap, ci) of  wp[co, tap, ci] * x[img, ci, window]
//   dgrad: dx[img, ci, q]   = sum over (tap, co) of  wd[tap, co, ci] * dy[img, co, window^-1]
//   wgrad: dw[co, tap, ci]  = sum over pixels    of  dy[img, co, q]  * x[img, ci, window]
// (wp, wd: the weight permuted so that a tap's channels lie together, a one-off copy.) K runs
// over (tap, channel) with the channel inner: where the channels per group are a multiple of 16,
// a 16-deep slice lies in one tap, so a slice's window is worked out once per invocation
// (flags bit 1); else every element finds its own tap. The workgroup's z is the group (and in
// wgrad the K split: z = split * groups + group, each split writing its own f32 partial).
struct Params {
    m: u32,
    n: u32,
    // K of one split (of all of K outside wgrad).
    k: u32,
    k_total: u32,
    nimg: u32,
    c: u32,
    h: u32,
    w: u32,
    o: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    cg: u32,
    og: u32,
    groups: u32,
    off_a: u32,
    off_b: u32,
    off_out: u32,
    off_bias: u32,
    // Bit 0: add bias[off_bias + channel] (fwd); bit 1: 16-aligned channels per group.
    flags: u32,
    // fwd on vec4 only: the output's channel, row and column strides (an NCHW tensor's, or a
    // strided phase of one: the input gradient by phase writes every s-th row and column).
    out_plane: u32,
    out_rs: u32,
    out_cs: u32,
    pad0: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<{{V}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{V}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{O}}>;
@group(0) @binding(3) var<storage, read_write> bias: array<{{T}}>;

const BM: u32 = {{BM}}u;

fn aligned() -> bool {
    return (p.flags & 2u) != 0u;
}

// Whether input row `ih` and column `iw` lie inside the (unpadded) input.
fn inside(ih: i32, iw: i32) -> bool {
    return ih >= 0 && iw >= 0 && ih < i32(p.h) && iw < i32(p.w);
}
