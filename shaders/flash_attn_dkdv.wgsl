// Flash attention's backward, second pass: the key and value gradients, one key row per
// invocation (FlashAttention-2's dK/dV loop). A workgroup takes 64 keys of one (b, h) and walks
// the query tiles (scaled queries, output gradients, log-sum-exps and deltas staged in workgroup
// memory; under causality from the first tile that can see its keys):
//   P = exp(s - lse), dV = sum P * keep * dO_i, dS = P * ((dO_i . v) * keep - delta),
//   dK = sum dS * scale * q_i.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> k: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> dout: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk: array<{{T}}>;
@group(0) @binding(7) var<storage, read_write> dv: array<{{T}}>;

var<workgroup> qt: array<f32, BT * DP>;
var<workgroup> go: array<f32, BT * DP>;
var<workgroup> lt: array<f32, BT>;
var<workgroup> dt: array<f32, BT>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wid.y;
    let col0 = wid.x * WG;
    let j = col0 + li;
    var kr: array<f32, DP>;
    var vr: array<f32, DP>;
    var dka: array<f32, DP>;
    var dva: array<f32, DP>;
    let kb = row_k(n, j);
    let vb = row_v(n, j);
    for (var d = 0u; d < DP; d++) {
        kr[d] = select(0.0, f32(k[kb + min(d, p.d - 1u)]), d < p.d);
        vr[d] = select(0.0, f32(v[vb + min(d, p.dv - 1u)]), d < p.dv);
        dka[d] = 0.0;
        dva[d] = 0.0;
    }
    var i_start = 0u;
    if (p.flags & 1u) != 0u {
        i_start = col0 / BT * BT;
    }
    for (var i0 = i_start; i0 < p.lq; i0 += BT) {
        workgroupBarrier();
        for (var e = li; e < BT * DP; e += WG) {
            let r = e / DP;
            let c = e % DP;
            let i = i0 + r;
            let ic = min(i, p.lq - 1u);
            qt[e] = select(0.0, f32(q[row_q(n, i) + min(c, p.d - 1u)]) * p.scale, i < p.lq && c < p.d);
            go[e] = select(0.0, f32(dout[(n * p.lq + ic) * p.dv + min(c, p.dv - 1u)]), i < p.lq && c < p.dv);
        }
        for (var r = li; r < BT; r += WG) {
            let ic = min(i0 + r, p.lq - 1u);
            lt[r] = select(MASKED, stats[n * p.lq + ic], i0 + r < p.lq);
            dt[r] = stats[p.n * p.lq + n * p.lq + ic];
        }
        workgroupBarrier();
        for (var r = 0u; r < BT; r++) {
            let i = i0 + r;
            if visible(i, j) && lt[r] > DEAD {
                var x = 0.0;
                var dp = 0.0;
                for (var d = 0u; d < DP; d++) {
                    x = fma(qt[r * DP + d], kr[d], x);
                    dp = fma(go[r * DP + d], vr[d], dp);
                }
                let pr = exp(x + mask_at(n, i, j) - lt[r]);
                let z = keep(n, i, j);
                let pz = pr * z;
                let ds = pr * (dp * z - dt[r]);
                for (var d = 0u; d < DP; d++) {
                    dva[d] = fma(pz, go[r * DP + d], dva[d]);
                    dka[d] = fma(ds, qt[r * DP + d], dka[d]);
                }
            }
        }
    }
    if j < p.lk {
        for (var d = 0u; d < DP; d++) {
            if d < p.d {
                dk[(n * p.lk + j) * p.d + d] = {{T}}(dka[d]);
            }
            if d < p.dv {
                dv[(n * p.lk + j) * p.dv + d] = {{T}}(dva[d]);
            }
        }
    }
}
