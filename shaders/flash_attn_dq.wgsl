// Flash attention's backward, first pass: the query gradient, one query row per invocation
// (FlashAttention-2's dQ loop). Each row first computes delta = dO . O (written after the
// log-sum-exps, for the second pass), then walks the key tiles as the forward pass did,
// recomputing each probability from the saved log-sum-exp:
//   P = exp(s - lse), dP = (dO . v_j) * keep, dS = P * (dP - delta), dQ = scale * sum dS k_j.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> k: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
// The forward's output and the output's gradient, contiguous [n, lq, dv].
@group(0) @binding(4) var<storage, read_write> o: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> dout: array<{{T}}>;
// Log-sum-exps at n * lq + i; this pass writes the deltas at n_all * lq + n * lq + i.
@group(0) @binding(6) var<storage, read_write> stats: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<{{T}}>;

var<workgroup> kt: array<f32, BT * DP>;
var<workgroup> vt: array<f32, BT * DP>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wid.y;
    let row0 = wid.x * WG;
    let i = row0 + li;
    let ic = min(i, p.lq - 1u);
    var qr: array<f32, DP>;
    var dor: array<f32, DP>;
    var dqa: array<f32, DP>;
    let qb = row_q(n, i);
    let ob = (n * p.lq + ic) * p.dv;
    var delta = 0.0;
    for (var d = 0u; d < DP; d++) {
        qr[d] = select(0.0, f32(q[qb + min(d, p.d - 1u)]) * p.scale, d < p.d);
        let dd = min(d, p.dv - 1u);
        dor[d] = select(0.0, f32(dout[ob + dd]), d < p.dv);
        delta = fma(dor[d], select(0.0, f32(o[ob + dd]), d < p.dv), delta);
        dqa[d] = 0.0;
    }
    let lse = stats[n * p.lq + ic];
    if i < p.lq {
        stats[p.n * p.lq + n * p.lq + i] = delta;
    }
    var kend = p.lk;
    if (p.flags & 1u) != 0u {
        kend = min(p.lk, row0 + WG);
    }
    for (var j0 = 0u; j0 < kend; j0 += BT) {
        workgroupBarrier();
        for (var e = li; e < BT * DP; e += WG) {
            let r = e / DP;
            let c = e % DP;
            let j = j0 + r;
            kt[e] = select(0.0, f32(k[row_k(n, j) + min(c, p.d - 1u)]), j < p.lk && c < p.d);
            vt[e] = select(0.0, f32(v[row_v(n, j) + min(c, p.dv - 1u)]), j < p.lk && c < p.dv);
        }
        workgroupBarrier();
        for (var r = 0u; r < BT; r++) {
            let j = j0 + r;
            if visible(i, j) && lse > DEAD {
                var x = 0.0;
                var dp = 0.0;
                for (var d = 0u; d < DP; d++) {
                    x = fma(qr[d], kt[r * DP + d], x);
                    dp = fma(dor[d], vt[r * DP + d], dp);
                }
                let pr = exp(x + mask_at(n, i, j) - lse);
                let ds = pr * (dp * keep(n, i, j) - delta);
                for (var d = 0u; d < DP; d++) {
                    dqa[d] = fma(ds, kt[r * DP + d], dqa[d]);
                }
            }
        }
    }
    if i < p.lq {
        let gb = (n * p.lq + i) * p.d;
        for (var d = 0u; d < DP; d++) {
            if d < p.d {
                dq[gb + d] = {{T}}(dqa[d] * p.scale);
            }
        }
    }
}
