// A workgroup of 256 per row: invocation t reads units t, t + 256, ...; a tree in workgroup
// memory merges the (max, sum) pairs. The default.
{{MERGE}}

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
    let r = merge_row(t, m, s, bad);
    write_row(base, t, 256u, r.m, r.s, r.bad);
}
