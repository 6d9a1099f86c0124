// Products with one narrow side (16 or fewer columns, or rows), which leave the tiled kernels'
// tiles mostly empty and their few workgroups each a long K: an MLP's classifier head,
// `h @ W^T` with 10 columns and K = 4096, and its weight's gradient `g^T @ h` with 10 rows.
// Any strides; f32 accumulation; `{{T}}` in and out. Each invocation keeps all 16 outputs of
// the narrow side in four vec4 accumulators (written out, not indexed: an indexed array went
// to memory) over its share of K, and the workgroup adds the shares in shared memory.
//
// `rows`: out[m, 0..n] for n <= 16, one workgroup per row m (x, then y past 65535 rows), the
// 256 invocations splitting K (+ bias[j] where flagged).
// `cols`: out[0..m, j] for m <= 16, one workgroup per 32 columns j: 32 columns by 8 lanes of K,
// so that B's rows are read 32 elements at a time and A's elements are the same across a
// subgroup (staged in shared memory 256 k at a time); with flag bit 1 also A's row sums.
// `short`: a K of 16 or less (the head's input gradient `g @ W`, K = 10), which the tiled
// kernels run as one slice with every step's loads and barriers for 10 FMAs per output:
// one invocation per column and four rows (64 columns by 16 rows per workgroup), K walked
// serially; the output's write, one coalesced store per row, is the cost.
{{ENABLES}}
{{PARAMS}}
@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> bias: array<{{T}}>;

var<workgroup> part0: array<vec4<f32>, 256>;
var<workgroup> part1: array<vec4<f32>, 256>;
var<workgroup> part2: array<vec4<f32>, 256>;
var<workgroup> part3: array<vec4<f32>, 256>;

// Columns 4q..4q+3 of B's row k, zero past the last column: loads without branches (the
// index clamped, the value masked), so that a step's loads all issue before its FMAs.
fn b_quad(k: u32, q: u32) -> vec4<f32> {
    let base = p.off_b + k * p.sbk;
    let j = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
    let c = min(j, vec4<u32>(p.n - 1u)) * p.sbn + vec4<u32>(base);
    let v = vec4<f32>(f32(b[c.x]), f32(b[c.y]), f32(b[c.z]), f32(b[c.w]));
    return select(vec4<f32>(), v, j < vec4<u32>(p.n));
}

// Rows 4q..4q+3 of A's column k, zero past the last row (as `b_quad`).
fn a_quad(k: u32, q: u32) -> vec4<f32> {
    let base = p.off_a + k * p.sak;
    let i = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
    let c = min(i, vec4<u32>(p.m - 1u)) * p.sam + vec4<u32>(base);
    let v = vec4<f32>(f32(a[c.x]), f32(a[c.y]), f32(a[c.z]), f32(a[c.w]));
    return select(vec4<f32>(), v, i < vec4<u32>(p.m));
}

// The workgroup's sum of the `lanes` shares `acc` that invocations t % stride, + stride, ...
// hold: each invocation's share into shared memory, then added pairwise into slot t % stride.
fn reduce(t: u32, stride: u32, lanes: u32, acc: array<vec4<f32>, 4>) -> array<vec4<f32>, 4> {
    part0[t] = acc[0];
    part1[t] = acc[1];
    part2[t] = acc[2];
    part3[t] = acc[3];
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s >>= 1u) {
        if t < s * stride {
            part0[t] += part0[t + s * stride];
            part1[t] += part1[t + s * stride];
            part2[t] += part2[t + s * stride];
            part3[t] += part3[t + s * stride];
        }
        workgroupBarrier();
    }
    let slot = t % stride;
    return array<vec4<f32>, 4>(part0[slot], part1[slot], part2[slot], part3[slot]);
}

@compute @workgroup_size(256)
fn rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * p.groups_x;
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    if row < p.m {
        let a_row = p.off_a + row * p.sam;
        // Two k steps at a time (their loads before their FMAs), then the last one.
        var k = t;
        for (; k + 256u < p.k; k += 512u) {
            let x0 = vec4<f32>(f32(a[a_row + k * p.sak]));
            let x1 = vec4<f32>(f32(a[a_row + (k + 256u) * p.sak]));
            let b00 = b_quad(k, 0u);
            let b01 = b_quad(k + 256u, 0u);
            let b10 = b_quad(k, 1u);
            let b11 = b_quad(k + 256u, 1u);
            acc0 = fma(x1, b01, fma(x0, b00, acc0));
            acc1 = fma(x1, b11, fma(x0, b10, acc1));
            if p.n > 8u {
                let b20 = b_quad(k, 2u);
                let b21 = b_quad(k + 256u, 2u);
                let b30 = b_quad(k, 3u);
                let b31 = b_quad(k + 256u, 3u);
                acc2 = fma(x1, b21, fma(x0, b20, acc2));
                acc3 = fma(x1, b31, fma(x0, b30, acc3));
            }
        }
        if k < p.k {
            let x = vec4<f32>(f32(a[a_row + k * p.sak]));
            acc0 = fma(x, b_quad(k, 0u), acc0);
            acc1 = fma(x, b_quad(k, 1u), acc1);
            acc2 = fma(x, b_quad(k, 2u), acc2);
            acc3 = fma(x, b_quad(k, 3u), acc3);
        }
    }
    let sums = reduce(t, 1u, 256u, array<vec4<f32>, 4>(acc0, acc1, acc2, acc3));
    if row < p.m && t < p.n {
        var v = sums[t / 4u][t % 4u];
        if (p.flags & 1u) != 0u {
            v += f32(bias[p.off_bias + t]);
        }
        out[p.off_out + row * p.n + t] = {{T}}(v);
    }
}

@compute @workgroup_size(256)
fn cols(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    cols_at(wg.x, t);
}

// Workgroup `wx` of `cols` (its id along x), invocation t.
fn cols_at(wx: u32, t: u32) {
    let c = t % 32u;
    let lane = t / 32u;
    let j = wx * 32u + c;
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    // Columns past n read the last one (their sums are not stored): every invocation reaches
    // the barriers.
    let b_col = p.off_b + min(j, p.n - 1u) * p.sbn;
    // With flag bit 1, workgroup 0 also sums A's rows over K into `bias` (a Linear's bias
    // gradient beside its weight's, `matmul_row_sums`): each invocation its staged k's.
    let row_sums = wx == 0u && (p.flags & 2u) != 0u;
    var s0 = vec4<f32>();
    var s1 = vec4<f32>();
    var s2 = vec4<f32>();
    var s3 = vec4<f32>();
    // A's 16 rows over 256 k at a time, staged as quads in the reduction's shared arrays (free
    // until the end): each A element is loaded once per workgroup, not once per k step by
    // every subgroup, and a step's four quads are one broadcast shared read each.
    for (var k0 = 0u; k0 < p.k; k0 += 256u) {
        let ka = min(k0 + t, p.k - 1u);
        let q0 = a_quad(ka, 0u);
        let q1 = a_quad(ka, 1u);
        let q2 = a_quad(ka, 2u);
        let q3 = a_quad(ka, 3u);
        part0[t] = q0;
        part1[t] = q1;
        part2[t] = q2;
        part3[t] = q3;
        if row_sums && k0 + t < p.k {
            s0 += q0;
            s1 += q1;
            s2 += q2;
            s3 += q3;
        }
        workgroupBarrier();
        let len = min(256u, p.k - k0);
        // Four k steps at a time (their loads before their FMAs), then the rest one by one.
        var k = lane;
        for (; k + 24u < len; k += 32u) {
            let at = b_col + (k0 + k) * p.sbk;
            let x0 = vec4<f32>(f32(b[at]));
            let x1 = vec4<f32>(f32(b[at + 8u * p.sbk]));
            let x2 = vec4<f32>(f32(b[at + 16u * p.sbk]));
            let x3 = vec4<f32>(f32(b[at + 24u * p.sbk]));
            acc0 = fma(part0[k + 24u], x3, fma(part0[k + 16u], x2, fma(part0[k + 8u], x1, fma(part0[k], x0, acc0))));
            acc1 = fma(part1[k + 24u], x3, fma(part1[k + 16u], x2, fma(part1[k + 8u], x1, fma(part1[k], x0, acc1))));
            if p.m > 8u {
                acc2 = fma(part2[k + 24u], x3, fma(part2[k + 16u], x2, fma(part2[k + 8u], x1, fma(part2[k], x0, acc2))));
                acc3 = fma(part3[k + 24u], x3, fma(part3[k + 16u], x2, fma(part3[k + 8u], x1, fma(part3[k], x0, acc3))));
            }
        }
        for (; k < len; k += 8u) {
            let x = vec4<f32>(f32(b[b_col + (k0 + k) * p.sbk]));
            acc0 = fma(part0[k], x, acc0);
            acc1 = fma(part1[k], x, acc1);
            acc2 = fma(part2[k], x, acc2);
            acc3 = fma(part3[k], x, acc3);
        }
        workgroupBarrier();
    }
    let sums = reduce(t, 32u, 8u, array<vec4<f32>, 4>(acc0, acc1, acc2, acc3));
    if t < 32u && j < p.n {
        for (var q = 0u; q < 4u; q++) {
            for (var r = 0u; r < 4u; r++) {
                let i = 4u * q + r;
                if i < p.m {
                    out[p.off_out + i * p.n + j] = {{T}}(sums[q][r]);
                }
            }
        }
    }
    if row_sums {
        workgroupBarrier();
        let rs = reduce(t, 1u, 256u, array<vec4<f32>, 4>(s0, s1, s2, s3));
        if t < p.m {
            bias[p.off_bias + t] = {{T}}(rs[t / 4u][t % 4u]);
        }
    }
}

@compute @workgroup_size(64, 4)
fn short(@builtin(global_invocation_id) g: vec3<u32>) {
    let j = g.x;
    let r0 = 4u * g.y;
    if j >= p.n || r0 >= p.m {
        return;
    }
    // Rows r0..r0+3 of A (the last one repeated past m), whose elements are the same across a
    // subgroup; B's column j, consecutive across it, as are the stores.
    let rows = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u)) * p.sam
        + vec4<u32>(p.off_a);
    let b_col = p.off_b + j * p.sbn;
    var acc = vec4<f32>();
    for (var k = 0u; k < p.k; k++) {
        let at = rows + vec4<u32>(k * p.sak);
        let x = vec4<f32>(f32(a[at.x]), f32(a[at.y]), f32(a[at.z]), f32(a[at.w]));
        acc = fma(x, vec4<f32>(f32(b[b_col + k * p.sbk])), acc);
    }
    if (p.flags & 1u) != 0u {
        acc += vec4<f32>(f32(bias[p.off_bias + j]));
    }
    // Flag bit 2: ReluBackward0's formula, the product kept where the mask (the ReLU's saved
    // output, [m, n] contiguous in the fourth binding) is not <= 0 (NaN passes, as in
    // PyTorch's threshold_backward).
    let masked = (p.flags & 4u) != 0u;
    for (var r = 0u; r < 4u; r++) {
        if r0 + r < p.m {
            var v = {{T}}(acc[r]);
            if masked {
                v = select(v, {{T}}(0.0), bias[p.off_bias + (r0 + r) * p.n + j] <= {{T}}(0.0));
            }
            out[p.off_out + (r0 + r) * p.n + j] = v;
        }
    }
}
