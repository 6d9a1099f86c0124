// Shared by the vec4 modes that produce the output (`conv_gemm_{fwd4,pw}.wgsl`): A, the weight
// as rows of K, scattered into four tile rows per vector, and the NCHW store (+ bias) through
// the output's strides (`out_plane`, `out_rs`, `out_cs`: a whole tensor, or
// every s-th row and column of one for a phase of a strided convolution's input gradient).
// A = the weight as rows of K, read as vec4s along k: `[o][tap][c]` (forward; `[m][k]` for a
// pointwise convolution, one tap). With flags bit 2 (the input gradient), tap t of the slice is
// read from row tap taps - 1 - t.
fn load_a4(m0: u32, k0: u32, v: u32) -> vec4<f32> {
    let m = m0 + v / 4u;
    var k = k0;
    if (p.flags & 4u) != 0u {
        k = (p.kh * p.kw - 1u - k0 / p.c) * p.c + k0 % p.c;
    }
    if m < p.m {
        return a[(p.off_a + m * p.k + k) / 4u + v % 4u];
    }
    return vec4<f32>();
}

fn store_a4(buf: u32, v: u32, x: vec4<f32>) {
    scatter_a4(buf, v, x);
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
