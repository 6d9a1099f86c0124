// Copy of a transposed matrix into a contiguous one through a 32x32 shared-memory tile, so that
// both the reads and the writes are coalesced. out[b, r, c] = x[off + b * sb + c * lda + r] for
// `batch` (the workgroup's z) outputs of rows x cols: NCHW <-> NHWC is a batch of transposes.
// The tile has 33 columns so that the column reads hit distinct banks.
{{ENABLES}}
// Immediates: `transpose_params.wgsl`, appended by `Kernel::source`.

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{T}}>;

var<workgroup> tile: array<array<{{T}}, 33>, 32>;

@compute @workgroup_size(32, 8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let r0 = wg.x * 32u;
    let c0 = wg.y * 32u;
    let src = p.off + wg.z * p.sb;
    let dst = wg.z * p.rows * p.cols;
    for (var k = 0u; k < 32u; k += 8u) {
        let c = c0 + l.y + k;
        let r = r0 + l.x;
        if c < p.cols && r < p.rows {
            tile[l.y + k][l.x] = x[src + c * p.lda + r];
        }
    }
    workgroupBarrier();
    for (var k = 0u; k < 32u; k += 8u) {
        let r = r0 + l.y + k;
        let c = c0 + l.x;
        if r < p.rows && c < p.cols {
            out[dst + r * p.cols + c] = tile[l.x][l.y + k];
        }
    }
}
