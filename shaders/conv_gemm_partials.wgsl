// Shared by the weight-gradient modes: this split's f32 partial of dw [split][group][m][n]
// (rows m, columns n..n+3), summed over the splits after.
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if n + j < p.n {
            out[p.off_out + (bt * p.m + m) * p.n + n + j] = {{O}}(v[j]);
        }
    }
}
