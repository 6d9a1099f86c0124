// Large batched matmul out[b] = a[b] @ b[b] (f32 accumulation), for m and n of 128 or more:
// each workgroup of 16x16 invocations computes a 128x128 tile through 16-deep slices staged in
// shared memory as vec4s (tile_a[k][m/4], tile_b[k][n/4]), so one invocation's 8x8 outputs (rows
// 4*ty..+3 and 64+4*ty..+3, columns 4*tx..+3 and 64+4*tx..+3) cost four vec4 shared reads per
// k step for 64 FMAs (explicit `fma`, the k loop unrolled). Global loads walk the operand's unit-stride dim with consecutive
// invocations (coalesced for transposed inputs too) and the next slice is loaded into
// registers while the current one is multiplied, then stored into the other shared buffer.
// `main` is generated, unrolled, by `src/kernels/matmul128.rs`. Trusted module: every index is guarded.
{{ENABLES}}
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    off_a: u32,
    sab: u32,
    sam: u32,
    sak: u32,
    off_b: u32,
    sbb: u32,
    sbk: u32,
    sbn: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;

// Two buffers (the next slice is stored while the current one is read: one barrier per slice)
// of 16 rows of {{ROW}} vec4s. So that stores of one column by consecutive invocations spread over
// the banks, rows are either padded to 33 vec4s (where the device allows 33 KiB of shared
// memory) or, at 32 KiB (lavapipe's limit), row k keeps vec4 column c at c ^ (k % 8).
var<workgroup> tile_a: array<vec4<f32>, {{TILE}}>;
var<workgroup> tile_b: array<vec4<f32>, {{TILE}}>;

// Element e (0..2047) of the 128x16 slice of a at (m0, k0): which (m, k) it is. Consecutive
// e walk a's unit-stride dim.
fn a_coord(e: u32) -> vec2<u32> {
    if p.sak == 1u {
        return vec2<u32>(e / 16u, e % 16u);
    }
    return vec2<u32>(e % 128u, e / 128u);
}

fn b_coord(e: u32) -> vec2<u32> {
    if p.sbn == 1u {
        return vec2<u32>(e / 128u, e % 128u);
    }
    return vec2<u32>(e % 16u, e / 16u);
}

fn load_a(base: u32, m0: u32, k0: u32, e: u32) -> f32 {
    let c = a_coord(e);
    if m0 + c.x < p.m && k0 + c.y < p.k {
        return f32(a[base + (m0 + c.x) * p.sam + (k0 + c.y) * p.sak]);
    }
    return 0.0;
}

fn load_b(base: u32, n0: u32, k0: u32, e: u32) -> f32 {
    let c = b_coord(e);
    if k0 + c.x < p.k && n0 + c.y < p.n {
        return f32(b[base + (k0 + c.x) * p.sbk + (n0 + c.y) * p.sbn]);
    }
    return 0.0;
}

// Columns n..n+3 of row m.
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
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

{{MAIN}}