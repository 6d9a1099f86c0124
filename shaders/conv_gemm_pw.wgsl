// A pointwise convolution (1x1, stride 1, no padding; f32, one group) read straight from
// NCHW on vec4 loads, with no NHWC copy: per image it is the plain product W [o][c] @ x [c][hw],
// and four consecutive pixels of one channel are one vector (hw a multiple of 4, channels of 16).
//   A = the weight as [m][k] rows (the forward pass: [o][c]; the input's gradient: [c][o]),
//       four k values per vector, scattered into four tile rows;
//   B = the input (or the output's gradient) [img][k][pixel], four pixels per vector, one
//       tile store, the vector's image and pixel fixed per invocation.
// out = NCHW [img][m][pixel] (+ bias), through `conv_gemm_out4.wgsl`.
struct PreB4 {
    ok: bool,
    // b's element index of (img, channel 0, pixel), and the slice row this invocation loads.
    base: u32,
    row: u32,
}

fn pre_b4(n0: u32, v: u32) -> PreB4 {
    let n = n0 + 4u * (v % 32u);
    let hw = p.oh * p.ow;
    return PreB4(n < p.n, p.off_b + (n / hw) * p.c * hw + n % hw, v / 32u);
}

fn load_b4(pb: PreB4, k0: u32) -> vec4<f32> {
    if pb.ok {
        return b[(pb.base + (k0 + pb.row) * p.oh * p.ow) / 4u];
    }
    return vec4<f32>();
}

fn store_b4(buf: u32, v: u32, x: vec4<f32>) {
    tile_b[tile_at(buf, v / 32u, 4u * (v % 32u))] = x;
}
