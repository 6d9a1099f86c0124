// Shared by the vec4 modes that produce the output (`conv_gemm_{fwd4,fwd_nchw4,pw}.wgsl`): the
// swizzled tile, A's four k values of one row scattered into four tile rows, and the NCHW store
// (+ bias) through the output's strides (`out_plane`, `out_rs`, `out_cs`: a whole tensor, or
// every s-th row and column of one for a phase of a strided convolution's input gradient).
fn tile_at(buf: u32, k: u32, c: u32) -> u32 {
    return buf + k * {{ROW}}u + ((c / 4u) ^ ((k % 8u) * {{SWZ}}u));
}

// Vector v of A's slice: row v / 4, k quad v % 4.
fn store_a4(buf: u32, v: u32, x: vec4<f32>) {
    let m = v / 4u;
    let k = 4u * (v % 4u);
    for (var j = 0u; j < 4u; j++) {
        tile_a[tile_at(buf, k + j, m)][m % 4u] = x[j];
    }
}

// Output channel m, pixels n..n+3.
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    var add = 0.0;
    if (p.flags & 1u) != 0u {
        add = bias[p.off_bias + m];
    }
    let ohw = p.oh * p.ow;
    for (var j = 0u; j < 4u; j++) {
        let nn = n + j;
        if nn < p.n {
            let q = nn % ohw;
            let at = ((nn / ohw) * p.o + m) * p.out_plane + (q / p.ow) * p.out_rs
                + (q % p.ow) * p.out_cs;
            out[p.off_out + at] = v[j] + add;
        }
    }
}
