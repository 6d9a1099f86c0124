// A workgroup of 256 per row: invocation t reads units t, t + 256, ...; a tree in workgroup
// memory merges the (max, sum) pairs. The default.
var<workgroup> red_m: array<f32, 256>;
var<workgroup> red_s: array<f32, 256>;
var<workgroup> red_bad: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = wid.x + wid.y * nw.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.units;
    var m = neg_inf();
    var s = 0.0;
    var bad = 0u;
    for (var j = t; j < p.units; j += 256u) {
        let v = load(base + j);
        bad |= bad_lanes(v);
        accumulate(&m, &s, v);
    }
    red_m[t] = m;
    red_s[t] = s;
    red_bad[t] = bad;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            let m1 = red_m[t];
            let m2 = red_m[t + k];
            let nm = max(m1, m2);
            red_s[t] = rescale(red_s[t], m1, nm) + rescale(red_s[t + k], m2, nm);
            red_m[t] = nm;
            red_bad[t] |= red_bad[t + k];
        }
        workgroupBarrier();
    }
    write_row(base, t, 256u, red_m[0], red_s[0], red_bad[0]);
}
