// Sums over the leading dims of a contiguous f32 or f16 tensor viewed as [rows, cols] (f32
// accumulation; `{{I}}` in, `{{O}}` out): the reduction
// PyTorch users meet as a bias gradient (`grad.sum(0)`). The row-reduce kernel would walk each
// column with stride `cols` (one cache line per element); here an invocation owns four adjacent
// columns (vec4 loads) and a quarter of a chunk of rows, so a warp reads 512 contiguous bytes.
// Output [chunks, cols]: per-chunk partial sums (chunks > 1), then a second launch over those
// (chunks = 1) that also multiplies by `scale` (1/n for mean). Counts are in vec4s.

{{ENABLES}}

struct Params {
    rows: u32,
    cols4: u32,
    chunk_len: u32,
    off4: u32,
    scale: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<vec4<{{I}}>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<{{O}}>>;

var<workgroup> part: array<vec4<f32>, 256>;

const UNROLL: u32 = 4u;

// Workgroup (64 vec4 columns) x (4 row lanes); workgroup_id.x: column block, .y: row chunk.
@compute @workgroup_size(64, 4)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let col = wg.x * 64u + l.x;
    let start = wg.y * p.chunk_len;
    let end = min(start + p.chunk_len, p.rows);
    // UNROLL loads in flight an invocation (two took GPT-2's f16 bias gradients at 1.3 TB/s on
    // the H200).
    var s: array<vec4<f32>, UNROLL>;
    if col < p.cols4 {
        var r = start + l.y;
        for (; r + 4u * (UNROLL - 1u) < end; r += 4u * UNROLL) {
            for (var u = 0u; u < UNROLL; u++) {
                s[u] += vec4<f32>(x[p.off4 + (r + 4u * u) * p.cols4 + col]);
            }
        }
        for (; r < end; r += 4u) {
            s[0] += vec4<f32>(x[p.off4 + r * p.cols4 + col]);
        }
    }
    part[l.y * 64u + l.x] = (s[0] + s[1]) + (s[2] + s[3]);
    workgroupBarrier();
    if l.y == 0u && col < p.cols4 {
        let total = part[l.x] + part[64u + l.x] + part[128u + l.x] + part[192u + l.x];
        out[wg.y * p.cols4 + col] = vec4<{{O}}>(total * p.scale);
    }
}
