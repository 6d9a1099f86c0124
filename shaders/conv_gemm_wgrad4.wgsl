// wgrad on whole vectors (f32, one group, input and output channels multiples of 4): both
// operands come from NHWC copies and are read as vec4s along the tile's shared-memory row, the
// GEMM's m and n, so a vector is one tile store:
//   A = dy as [pixel][co]: four output channels of one pixel;
//   B = x gathered: four input channels of one pixel at one tap (n = tap * c + ci), the
//       window worked out once per invocation (its n is fixed) and per slice for its pixel.
// K runs over the pixels (img, q); the split is `kb` (the generated main passes k + split * k),
// so every k here is global and checked against k_total. Vector v of a slice: k row v / (BM/4)
// (A) or v / 32 (B), columns 4 * (v % ...). out = this split's f32 partial of dw
// [split][co][tap][ci], summed after as the scalar wgrad's.
fn load_a4(m0: u32, k0: u32, v: u32) -> vec4<f32> {
    let m = m0 + 4u * (v % (BM / 4u));
    let k = k0 + v / (BM / 4u);
    if m < p.m && k < p.k_total {
        return a[(p.off_a + k * p.o + m) / 4u];
    }
    return vec4<f32>();
}

struct PreB4 {
    ok: bool,
    // The slice row this invocation loads, and its channel.
    row: u32,
    ci: u32,
    // The tap's offset from the output pixel's window origin.
    dh: i32,
    dw: i32,
}

fn pre_b4(n0: u32, v: u32) -> PreB4 {
    let n = n0 + 4u * (v % 32u);
    let tap = n / p.c;
    return PreB4(
        n < p.n,
        v / 32u,
        n % p.c,
        i32((tap / p.kw) * p.dh) - i32(p.ph),
        i32((tap % p.kw) * p.dw) - i32(p.pw),
    );
}

fn load_b4(pb: PreB4, k0: u32) -> vec4<f32> {
    let k = k0 + pb.row;
    let ohw = p.oh * p.ow;
    let img = k / ohw;
    let q = k % ohw;
    let ih = i32((q / p.ow) * p.sh) + pb.dh;
    let iw = i32((q % p.ow) * p.sw) + pb.dw;
    if pb.ok && k < p.k_total && inside(ih, iw) {
        return b[(p.off_b + ((img * p.h + u32(ih)) * p.w + u32(iw)) * p.c + pb.ci) / 4u];
    }
    return vec4<f32>();
}

fn store_a4(buf: u32, v: u32, x: vec4<f32>) {
    tile_a[tile_at_a(buf, v / (BM / 4u), 4u * (v % (BM / 4u)))] = x;
}

fn store_b4(buf: u32, v: u32, x: vec4<f32>) {
    tile_b[tile_at(buf, v / 32u, 4u * (v % 32u))] = x;
}
