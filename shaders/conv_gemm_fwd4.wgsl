// fwd on whole vectors (f32, one group, channels a multiple of 16 so that a 16-deep slice lies
// in one tap): A = wp [o][tap][ci] (`conv_gemm_out4.wgsl`); B = the input in NHWC, gathered four
// channels of one pixel at one tap per vec4, which the NCHW gather (`conv_gemm_fwd.wgsl`) reads
// as scalars a plane apart. Vector v of a slice: row (A) or pixel (B) v / 4, k quad v % 4.
// out = y, NCHW (+ bias), or every s-th row and column of it (`out_plane`, `out_rs`, `out_cs`).
// The input's gradient runs here too, as the forward pass of the output's gradient with the
// kernel rotated (flags bit 2): at stride 1 whole, at stride s one phase (a residue of the row
// and column mod s) at a time, each phase a stride-1 convolution with a sub-kernel.
struct PreB4 {
    ok: bool,
    // b's vector index of (img, 0, 0, quad).
    base: u32,
    ih0: i32,
    iw0: i32,
}

fn pre_b4(n0: u32, v: u32) -> PreB4 {
    let n = n0 + v / 4u;
    let ohw = p.oh * p.ow;
    let img = n / ohw;
    let q = n % ohw;
    return PreB4(
        n < p.n,
        (p.off_b + img * p.h * p.w * p.c) / 4u + v % 4u,
        i32((q / p.ow) * p.sh) - i32(p.ph),
        i32((q % p.ow) * p.sw) - i32(p.pw),
    );
}

fn load_b4(pb: PreB4, k0: u32) -> vec4<f32> {
    let tap = k0 / p.c;
    let ih = pb.ih0 + i32((tap / p.kw) * p.dh);
    let iw = pb.iw0 + i32((tap % p.kw) * p.dw);
    if pb.ok && inside(ih, iw) {
        return b[pb.base + ((u32(ih) * p.w + u32(iw)) * p.c + k0 % p.c) / 4u];
    }
    return vec4<f32>();
}

fn store_b4(buf: u32, v: u32, x: vec4<f32>) {
    scatter_b4(buf, v, x);
}
