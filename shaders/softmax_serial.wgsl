// One invocation per row: no workgroup memory and no barrier (CPU adapters, short rows).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = gid.x + gid.y * nw.x * 64u;
    if row >= p.rows {
        return;
    }
    let base = row * p.units;
    var m = neg_inf();
    var s = 0.0;
    var bad = 0u;
    for (var j = 0u; j < p.units; j++) {
        let v = load(base + j);
        bad |= bad_lanes(v);
        accumulate(&m, &s, v);
    }
    write_row(base, 0u, 1u, m, s, bad);
}
