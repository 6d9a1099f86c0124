// The transpose copy (`transpose.wgsl`'s contract: out[b, r, c] = x[off + b * sb + c * lda + r])
// for 4-byte elements with no workgroup memory and no barrier: each invocation moves a 4x4
// block as four 16-byte reads down its columns (two 64-bit words each) and four 16-byte writes
// along its rows. For CPU adapters: Mesa's llvmpipe loads and stores a storage buffer component
// by component, two branches each, and switches between all of a workgroup's SIMD slices at
// every barrier, so 64-bit components halve the first cost and no barrier avoids the second.
// Needs rows, cols, off, lda and sb multiples of 4 (the caller checks) and 64-bit integers.
// Immediates: `transpose_params.wgsl`, appended by `Kernel::source`.

@group(0) @binding(0) var<storage, read_write> x: array<vec2<u64>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec2<u64>>;

// The two 32-bit halves of a word, low (the lower address) first.
fn halves(w: u64) -> vec2<u32> {
    return vec2<u32>(u32(w & 0xfffffffflu), u32(w >> 32u));
}

fn word(lo: u32, hi: u32) -> u64 {
    return u64(lo) | (u64(hi) << 32u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r0 = g.x * 4u;
    let c0 = g.y * 4u;
    if r0 >= p.rows || c0 >= p.cols {
        return;
    }
    let src = p.off + g.z * p.sb + r0;
    // e[q] = rows r0..r0+3 of column c0 + q.
    var e: array<vec4<u32>, 4>;
    for (var q = 0u; q < 4u; q++) {
        let w = x[(src + (c0 + q) * p.lda) / 4u];
        e[q] = vec4<u32>(halves(w.x), halves(w.y));
    }
    let dst = g.z * p.rows * p.cols + c0;
    for (var k = 0u; k < 4u; k++) {
        out[(dst + (r0 + k) * p.cols) / 4u] =
            vec2<u64>(word(e[0][k], e[1][k]), word(e[2][k], e[3][k]));
    }
}
