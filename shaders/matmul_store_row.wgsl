// Columns n..n+3 of row m of batch bt's `out` (rows past M and columns past N are not written),
// for the products without workgroup memory (`matmul_reg.wgsl` and the word products of
// `src/kernels/matmul_wide.rs`) and the scalar 128-tile kernel's `store4`
// (`matmul128_io.wgsl`). Needs the immediates `p.m`, `p.n` and the binding `out`.
fn store_row(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    let base = (bt * p.m + m) * p.n;
    for (var j = 0u; j < 4u; j++) {
        if n + j < p.n {
            out[base + n + j] = {{T}}(v[j]);
        }
    }
}
