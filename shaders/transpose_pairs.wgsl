// The tiled transpose (`transpose.wgsl`) for 16-bit elements, two to a 32-bit word, so that
// every read and every write moves a whole word: out[b, r, c] = x[off + b * sb + c * lda + r].
// A 64x64 tile is read as pairs along r and written as pairs along c. Needs even rows, cols,
// lda, sb and off (the caller checks); a 16-bit transpose element by element ran at half the
// bytes per second of the f32 one on the H100.
// Immediates: `transpose_params.wgsl`, appended by `Kernel::source`.

@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

// tile[c * 33 + r / 2]: 64 rows (c) of 32 words (pairs along r), padded by one word.
var<workgroup> tile: array<u32, 2112>;

@compute @workgroup_size(32, 8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let r0 = wg.x * 64u;
    let c0 = wg.y * 64u;
    let src = p.off + wg.z * p.sb;
    let dst = wg.z * p.rows * p.cols;
    for (var k = 0u; k < 64u; k += 8u) {
        let c = c0 + l.y + k;
        let r = r0 + 2u * l.x;
        if c < p.cols && r < p.rows {
            tile[(l.y + k) * 33u + l.x] = x[(src + c * p.lda + r) / 2u];
        }
    }
    workgroupBarrier();
    for (var k = 0u; k < 64u; k += 8u) {
        let rr = l.y + k;
        let r = r0 + rr;
        let c = c0 + 2u * l.x;
        if r < p.rows && c < p.cols {
            let w0 = tile[(2u * l.x) * 33u + rr / 2u];
            let w1 = tile[(2u * l.x + 1u) * 33u + rr / 2u];
            let sh = (rr % 2u) * 16u;
            out[(dst + r * p.cols + c) / 2u] = ((w0 >> sh) & 0xffffu) | (((w1 >> sh) & 0xffffu) << 16u);
        }
    }
}
