// Two batched transposed copies in one launch (`transpose.wgsl`'s 32x32 tile, its contract per
// job): job 0 on workgroup layers z < p0.layers, job 1 on the layers after them, its tiles
// numbered across each layer's (x, y) grid. A convolution's permuted weight (a few tiles) rides
// along with its input's NHWC copy instead of costing a launch and a barrier of its own.
{{ENABLES}}
struct Job {
    rows: u32,
    cols: u32,
    off: u32,
    lda: u32,
    sb: u32,
    // Job 0: its batch (the layers it takes). Job 1: its tiles along rows and along columns.
    layers: u32,
    tiles_r: u32,
    tiles_c: u32,
}

struct Params {
    j0: Job,
    j1: Job,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x0: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out0: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> x1: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> out1: array<{{T}}>;

var<workgroup> tile: array<array<{{T}}, 33>, 32>;

@compute @workgroup_size(32, 8)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) l: vec3<u32>,
) {
    var job = p.j0;
    var tile_r = wg.x;
    var tile_c = wg.y;
    var b = wg.z;
    let second = wg.z >= p.j0.layers;
    if second {
        job = p.j1;
        let t = (wg.z - p.j0.layers) * nwg.x * nwg.y + wg.y * nwg.x + wg.x;
        let per_image = job.tiles_r * job.tiles_c;
        b = t / per_image;
        tile_r = t % per_image % job.tiles_r;
        tile_c = t % per_image / job.tiles_r;
        // Past job 1's last tile (the last layer's rest): nothing to copy. Uniform per
        // workgroup, so the barrier below stays in uniform control flow for those that go on.
        if b >= job.layers {
            return;
        }
    }
    let r0 = tile_r * 32u;
    let c0 = tile_c * 32u;
    let src = job.off + b * job.sb;
    let dst = b * job.rows * job.cols;
    for (var k = 0u; k < 32u; k += 8u) {
        let c = c0 + l.y + k;
        let r = r0 + l.x;
        if c < job.cols && r < job.rows {
            if second {
                tile[l.y + k][l.x] = x1[src + c * job.lda + r];
            } else {
                tile[l.y + k][l.x] = x0[src + c * job.lda + r];
            }
        }
    }
    workgroupBarrier();
    for (var k = 0u; k < 32u; k += 8u) {
        let r = r0 + l.y + k;
        let c = c0 + l.x;
        if r < job.rows && c < job.cols {
            if second {
                out1[dst + r * job.cols + c] = tile[l.x][l.y + k];
            } else {
                out0[dst + r * job.cols + c] = tile[l.x][l.y + k];
            }
        }
    }
}
