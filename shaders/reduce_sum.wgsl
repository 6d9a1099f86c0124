// Row sums: output element w of `rows * chunks` sums elements [chunk * chunk_len, ...) of row
// `w / chunks` (a row is `inner` consecutive elements of x in row-major order, x any strided
// view with the reduced dims last). Accumulates in f32; multiplies by `scale` (1/n for mean).
// With chunks > 1 the outputs are f32 partials that a second launch (chunks = 1) reduces.
// The vec4 form counts `inner`, `off` and `chunk_len` in vec4s.
{{ENABLES}}
struct Params {
    rows: u32,
    inner: u32,
    chunks: u32,
    chunk_len: u32,
    rank: u32,
    off: u32,
    scale: f32,
    pad: u32,
    shape: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{TI}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{TO}}>;

var<workgroup> acc: array<f32, 256>;

fn offset(e: u32) -> u32 {
    {{OFFSET}}
}

// Element (or vec4) e of x, widened to the accumulator type.
fn load(e: u32) -> {{ACC}} {
    return {{LOAD}};
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = wid.x + wid.y * nw.x;
    if w >= p.rows * p.chunks {
        return;
    }
    let row = w / p.chunks;
    let start = (w % p.chunks) * p.chunk_len;
    let end = min(start + p.chunk_len, p.inner);
    // Four independent accumulators: four loads in flight per invocation.
    let base = row * p.inner;
    var s0 = {{ACC}}();
    var s1 = {{ACC}}();
    var s2 = {{ACC}}();
    var s3 = {{ACC}}();
    var j = start + t;
    for (; j + 768u < end; j += 1024u) {
        s0 += load(base + j);
        s1 += load(base + j + 256u);
        s2 += load(base + j + 512u);
        s3 += load(base + j + 768u);
    }
    for (; j < end; j += 256u) {
        s0 += load(base + j);
    }
    let s = (s0 + s1) + (s2 + s3);
    acc[t] = {{HSUM}};
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            acc[t] += acc[t + k];
        }
        workgroupBarrier();
    }
    if t == 0u {
        out[w] = {{TO}}(acc[0] * p.scale);
    }
}
