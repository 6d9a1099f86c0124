// The weight's gradient of a pointwise convolution (1x1, stride 1, no padding; f32, one group)
// from NCHW on vec4 loads: dw [o][c] = sum over pixels of dy [img][o][q] * x [img][c][q]. Both
// operands are read along K (the pixel, split as the other wgrads: every k here is global and
// checked against k_total), four pixels of one image per vector (hw a multiple of 4), and
// scattered into four tile rows. out = this split's f32 partial of dw [split][o][c]
// (`conv_gemm_partials.wgsl`).

// Channel `row` of `channels` at pixels k..k+3 of a [img][channel][pixel] tensor from `off`.
fn plane_at(off: u32, channels: u32, row: u32, k: u32) -> u32 {
    let hw = p.oh * p.ow;
    return (off + ((k / hw) * channels + row) * hw + k % hw) / 4u;
}

fn load_a4(m0: u32, k0: u32, v: u32) -> vec4<f32> {
    let m = m0 + v / 4u;
    let k = k0 + 4u * (v % 4u);
    if m < p.m && k < p.k_total {
        return a[plane_at(p.off_a, p.o, m, k)];
    }
    return vec4<f32>();
}

struct PreB4 {
    n: u32,
    kq: u32,
}

fn pre_b4(n0: u32, v: u32) -> PreB4 {
    return PreB4(n0 + v / 4u, 4u * (v % 4u));
}

fn load_b4(pb: PreB4, k0: u32) -> vec4<f32> {
    let k = k0 + pb.kq;
    if pb.n < p.n && k < p.k_total {
        return b[plane_at(p.off_b, p.c, pb.n, k)];
    }
    return vec4<f32>();
}

// Vector v holds four k values of one row (A) or column (B): four tile rows.
fn store_a4(buf: u32, v: u32, x: vec4<f32>) {
    scatter_a4(buf, v, x);
}

fn store_b4(buf: u32, v: u32, x: vec4<f32>) {
    scatter_b4(buf, v, x);
}
