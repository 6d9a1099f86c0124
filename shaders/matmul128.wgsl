// Large batched matmul out[b] = a[b] @ b[b] (f32 accumulation), for m and n of 128 or more:
// each workgroup of 16x16 invocations computes a 128x128 tile through 16-deep slices staged in
// shared memory as vec4s (tile_a[k][m/4], tile_b[k][n/4]), so one invocation's 8x8 outputs (rows
// 4*ty..+3 and 64+4*ty..+3, columns 4*tx..+3 and 64+4*tx..+3) cost four vec4 shared reads per
// k step for 64 FMAs (explicit `fma`, the k loop unrolled). Global loads walk the operand's unit-stride dim with consecutive
// invocations (coalesced for transposed inputs too) and the next slice is loaded into
// registers while the current one is multiplied, then stored into the other shared buffer. Trusted module: every index is guarded.
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

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let bt = wg.z;
    let m0 = wg.y * 128u;
    let n0 = wg.x * 128u;
    let a_base = p.off_a + bt * p.sab;
    let b_base = p.off_b + bt * p.sbb;
    var acc0l = vec4<f32>();
    var acc0h = vec4<f32>();
    var acc1l = vec4<f32>();
    var acc1h = vec4<f32>();
    var acc2l = vec4<f32>();
    var acc2h = vec4<f32>();
    var acc3l = vec4<f32>();
    var acc3h = vec4<f32>();
    var acc4l = vec4<f32>();
    var acc4h = vec4<f32>();
    var acc5l = vec4<f32>();
    var acc5h = vec4<f32>();
    var acc6l = vec4<f32>();
    var acc6h = vec4<f32>();
    var acc7l = vec4<f32>();
    var acc7h = vec4<f32>();
    var ra: array<f32, 8>;
    var rb: array<f32, 8>;
    ra[0] = load_a(a_base, m0, 0u, li + 0u);
    rb[0] = load_b(b_base, n0, 0u, li + 0u);
    ra[1] = load_a(a_base, m0, 0u, li + 256u);
    rb[1] = load_b(b_base, n0, 0u, li + 256u);
    ra[2] = load_a(a_base, m0, 0u, li + 512u);
    rb[2] = load_b(b_base, n0, 0u, li + 512u);
    ra[3] = load_a(a_base, m0, 0u, li + 768u);
    rb[3] = load_b(b_base, n0, 0u, li + 768u);
    ra[4] = load_a(a_base, m0, 0u, li + 1024u);
    rb[4] = load_b(b_base, n0, 0u, li + 1024u);
    ra[5] = load_a(a_base, m0, 0u, li + 1280u);
    rb[5] = load_b(b_base, n0, 0u, li + 1280u);
    ra[6] = load_a(a_base, m0, 0u, li + 1536u);
    rb[6] = load_b(b_base, n0, 0u, li + 1536u);
    ra[7] = load_a(a_base, m0, 0u, li + 1792u);
    rb[7] = load_b(b_base, n0, 0u, li + 1792u);
    {
        let c = a_coord(li + 0u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[0];
        let d = b_coord(li + 0u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[0];
    }
    {
        let c = a_coord(li + 256u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[1];
        let d = b_coord(li + 256u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[1];
    }
    {
        let c = a_coord(li + 512u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[2];
        let d = b_coord(li + 512u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[2];
    }
    {
        let c = a_coord(li + 768u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[3];
        let d = b_coord(li + 768u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[3];
    }
    {
        let c = a_coord(li + 1024u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[4];
        let d = b_coord(li + 1024u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[4];
    }
    {
        let c = a_coord(li + 1280u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[5];
        let d = b_coord(li + 1280u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[5];
    }
    {
        let c = a_coord(li + 1536u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[6];
        let d = b_coord(li + 1536u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[6];
    }
    {
        let c = a_coord(li + 1792u);
        tile_a[0u + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[7];
        let d = b_coord(li + 1792u);
        tile_b[0u + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[7];
    }
    workgroupBarrier();
    // The swizzled columns this invocation reads, one per row class k % 8.
    let ys0 = l.y ^ (0u * {{SWZ}}u);
    let xs0 = l.x ^ (0u * {{SWZ}}u);
    let ys1 = l.y ^ (1u * {{SWZ}}u);
    let xs1 = l.x ^ (1u * {{SWZ}}u);
    let ys2 = l.y ^ (2u * {{SWZ}}u);
    let xs2 = l.x ^ (2u * {{SWZ}}u);
    let ys3 = l.y ^ (3u * {{SWZ}}u);
    let xs3 = l.x ^ (3u * {{SWZ}}u);
    let ys4 = l.y ^ (4u * {{SWZ}}u);
    let xs4 = l.x ^ (4u * {{SWZ}}u);
    let ys5 = l.y ^ (5u * {{SWZ}}u);
    let xs5 = l.x ^ (5u * {{SWZ}}u);
    let ys6 = l.y ^ (6u * {{SWZ}}u);
    let xs6 = l.x ^ (6u * {{SWZ}}u);
    let ys7 = l.y ^ (7u * {{SWZ}}u);
    let xs7 = l.x ^ (7u * {{SWZ}}u);
    var cur = 0u;
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        let k1 = k0 + 16u;
        let more = k1 < p.k;
        if more {
            ra[0] = load_a(a_base, m0, k1, li + 0u);
            rb[0] = load_b(b_base, n0, k1, li + 0u);
            ra[1] = load_a(a_base, m0, k1, li + 256u);
            rb[1] = load_b(b_base, n0, k1, li + 256u);
            ra[2] = load_a(a_base, m0, k1, li + 512u);
            rb[2] = load_b(b_base, n0, k1, li + 512u);
            ra[3] = load_a(a_base, m0, k1, li + 768u);
            rb[3] = load_b(b_base, n0, k1, li + 768u);
            ra[4] = load_a(a_base, m0, k1, li + 1024u);
            rb[4] = load_b(b_base, n0, k1, li + 1024u);
            ra[5] = load_a(a_base, m0, k1, li + 1280u);
            rb[5] = load_b(b_base, n0, k1, li + 1280u);
            ra[6] = load_a(a_base, m0, k1, li + 1536u);
            rb[6] = load_b(b_base, n0, k1, li + 1536u);
            ra[7] = load_a(a_base, m0, k1, li + 1792u);
            rb[7] = load_b(b_base, n0, k1, li + 1792u);
        }
        {
            let a_lo = tile_a[cur + 0u * {{ROW}}u + ys0];
            let a_hi = tile_a[cur + 0u * {{ROW}}u + 16u + ys0];
            let b_lo = tile_b[cur + 0u * {{ROW}}u + xs0];
            let b_hi = tile_b[cur + 0u * {{ROW}}u + 16u + xs0];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 1u * {{ROW}}u + ys1];
            let a_hi = tile_a[cur + 1u * {{ROW}}u + 16u + ys1];
            let b_lo = tile_b[cur + 1u * {{ROW}}u + xs1];
            let b_hi = tile_b[cur + 1u * {{ROW}}u + 16u + xs1];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 2u * {{ROW}}u + ys2];
            let a_hi = tile_a[cur + 2u * {{ROW}}u + 16u + ys2];
            let b_lo = tile_b[cur + 2u * {{ROW}}u + xs2];
            let b_hi = tile_b[cur + 2u * {{ROW}}u + 16u + xs2];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 3u * {{ROW}}u + ys3];
            let a_hi = tile_a[cur + 3u * {{ROW}}u + 16u + ys3];
            let b_lo = tile_b[cur + 3u * {{ROW}}u + xs3];
            let b_hi = tile_b[cur + 3u * {{ROW}}u + 16u + xs3];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 4u * {{ROW}}u + ys4];
            let a_hi = tile_a[cur + 4u * {{ROW}}u + 16u + ys4];
            let b_lo = tile_b[cur + 4u * {{ROW}}u + xs4];
            let b_hi = tile_b[cur + 4u * {{ROW}}u + 16u + xs4];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 5u * {{ROW}}u + ys5];
            let a_hi = tile_a[cur + 5u * {{ROW}}u + 16u + ys5];
            let b_lo = tile_b[cur + 5u * {{ROW}}u + xs5];
            let b_hi = tile_b[cur + 5u * {{ROW}}u + 16u + xs5];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 6u * {{ROW}}u + ys6];
            let a_hi = tile_a[cur + 6u * {{ROW}}u + 16u + ys6];
            let b_lo = tile_b[cur + 6u * {{ROW}}u + xs6];
            let b_hi = tile_b[cur + 6u * {{ROW}}u + 16u + xs6];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 7u * {{ROW}}u + ys7];
            let a_hi = tile_a[cur + 7u * {{ROW}}u + 16u + ys7];
            let b_lo = tile_b[cur + 7u * {{ROW}}u + xs7];
            let b_hi = tile_b[cur + 7u * {{ROW}}u + 16u + xs7];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 8u * {{ROW}}u + ys0];
            let a_hi = tile_a[cur + 8u * {{ROW}}u + 16u + ys0];
            let b_lo = tile_b[cur + 8u * {{ROW}}u + xs0];
            let b_hi = tile_b[cur + 8u * {{ROW}}u + 16u + xs0];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 9u * {{ROW}}u + ys1];
            let a_hi = tile_a[cur + 9u * {{ROW}}u + 16u + ys1];
            let b_lo = tile_b[cur + 9u * {{ROW}}u + xs1];
            let b_hi = tile_b[cur + 9u * {{ROW}}u + 16u + xs1];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 10u * {{ROW}}u + ys2];
            let a_hi = tile_a[cur + 10u * {{ROW}}u + 16u + ys2];
            let b_lo = tile_b[cur + 10u * {{ROW}}u + xs2];
            let b_hi = tile_b[cur + 10u * {{ROW}}u + 16u + xs2];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 11u * {{ROW}}u + ys3];
            let a_hi = tile_a[cur + 11u * {{ROW}}u + 16u + ys3];
            let b_lo = tile_b[cur + 11u * {{ROW}}u + xs3];
            let b_hi = tile_b[cur + 11u * {{ROW}}u + 16u + xs3];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 12u * {{ROW}}u + ys4];
            let a_hi = tile_a[cur + 12u * {{ROW}}u + 16u + ys4];
            let b_lo = tile_b[cur + 12u * {{ROW}}u + xs4];
            let b_hi = tile_b[cur + 12u * {{ROW}}u + 16u + xs4];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 13u * {{ROW}}u + ys5];
            let a_hi = tile_a[cur + 13u * {{ROW}}u + 16u + ys5];
            let b_lo = tile_b[cur + 13u * {{ROW}}u + xs5];
            let b_hi = tile_b[cur + 13u * {{ROW}}u + 16u + xs5];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 14u * {{ROW}}u + ys6];
            let a_hi = tile_a[cur + 14u * {{ROW}}u + 16u + ys6];
            let b_lo = tile_b[cur + 14u * {{ROW}}u + xs6];
            let b_hi = tile_b[cur + 14u * {{ROW}}u + 16u + xs6];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        {
            let a_lo = tile_a[cur + 15u * {{ROW}}u + ys7];
            let a_hi = tile_a[cur + 15u * {{ROW}}u + 16u + ys7];
            let b_lo = tile_b[cur + 15u * {{ROW}}u + xs7];
            let b_hi = tile_b[cur + 15u * {{ROW}}u + 16u + xs7];
            acc0l = fma(vec4<f32>(a_lo.x), b_lo, acc0l);
            acc0h = fma(vec4<f32>(a_lo.x), b_hi, acc0h);
            acc4l = fma(vec4<f32>(a_hi.x), b_lo, acc4l);
            acc4h = fma(vec4<f32>(a_hi.x), b_hi, acc4h);
            acc1l = fma(vec4<f32>(a_lo.y), b_lo, acc1l);
            acc1h = fma(vec4<f32>(a_lo.y), b_hi, acc1h);
            acc5l = fma(vec4<f32>(a_hi.y), b_lo, acc5l);
            acc5h = fma(vec4<f32>(a_hi.y), b_hi, acc5h);
            acc2l = fma(vec4<f32>(a_lo.z), b_lo, acc2l);
            acc2h = fma(vec4<f32>(a_lo.z), b_hi, acc2h);
            acc6l = fma(vec4<f32>(a_hi.z), b_lo, acc6l);
            acc6h = fma(vec4<f32>(a_hi.z), b_hi, acc6h);
            acc3l = fma(vec4<f32>(a_lo.w), b_lo, acc3l);
            acc3h = fma(vec4<f32>(a_lo.w), b_hi, acc3h);
            acc7l = fma(vec4<f32>(a_hi.w), b_lo, acc7l);
            acc7h = fma(vec4<f32>(a_hi.w), b_hi, acc7h);
        }
        let next = {{HALF}}u - cur;
        if more {
            {
                let c = a_coord(li + 0u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[0];
                let d = b_coord(li + 0u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[0];
            }
            {
                let c = a_coord(li + 256u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[1];
                let d = b_coord(li + 256u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[1];
            }
            {
                let c = a_coord(li + 512u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[2];
                let d = b_coord(li + 512u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[2];
            }
            {
                let c = a_coord(li + 768u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[3];
                let d = b_coord(li + 768u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[3];
            }
            {
                let c = a_coord(li + 1024u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[4];
                let d = b_coord(li + 1024u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[4];
            }
            {
                let c = a_coord(li + 1280u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[5];
                let d = b_coord(li + 1280u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[5];
            }
            {
                let c = a_coord(li + 1536u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[6];
                let d = b_coord(li + 1536u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[6];
            }
            {
                let c = a_coord(li + 1792u);
                tile_a[next + c.y * {{ROW}}u + ((c.x / 4u) ^ ((c.y % 8u) * {{SWZ}}u))][c.x % 4u] = ra[7];
                let d = b_coord(li + 1792u);
                tile_b[next + d.x * {{ROW}}u + ((d.y / 4u) ^ ((d.x % 8u) * {{SWZ}}u))][d.y % 4u] = rb[7];
            }
        }
        workgroupBarrier();
        cur = next;
    }
    let r_lo = m0 + 4u * l.y;
    let r_hi = m0 + 64u + 4u * l.y;
    let c_lo = n0 + 4u * l.x;
    let c_hi = n0 + 64u + 4u * l.x;
    store4(bt, r_lo + 0u, c_lo, acc0l);
    store4(bt, r_lo + 0u, c_hi, acc0h);
    store4(bt, r_hi + 0u, c_lo, acc4l);
    store4(bt, r_hi + 0u, c_hi, acc4h);
    store4(bt, r_lo + 1u, c_lo, acc1l);
    store4(bt, r_lo + 1u, c_hi, acc1h);
    store4(bt, r_hi + 1u, c_lo, acc5l);
    store4(bt, r_hi + 1u, c_hi, acc5h);
    store4(bt, r_lo + 2u, c_lo, acc2l);
    store4(bt, r_lo + 2u, c_hi, acc2h);
    store4(bt, r_hi + 2u, c_lo, acc6l);
    store4(bt, r_hi + 2u, c_hi, acc6h);
    store4(bt, r_lo + 3u, c_lo, acc3l);
    store4(bt, r_lo + 3u, c_hi, acc3h);
    store4(bt, r_hi + 3u, c_lo, acc7l);
    store4(bt, r_hi + 3u, c_hi, acc7h);
}
