// The multi-tensor kernels' entry point and dealing of workgroups (`amp_multi.wgsl`,
// `optim_multi.wgsl`, which each define `run(j, i)`: element i of slot j): the workgroups go
// to the tensors in order, ceil(n / 256) each (n in vec4s), so that a workgroup works on one
// tensor. `deal` returns (slot, element) for invocation t of workgroup w, or a slot of {{N}}
// where there is nothing to do (past the last tensor or its count).
fn deal(counts: array<u32, {{N}}>, w_in: u32, t: u32) -> vec2<u32> {
    var w = w_in;
    var j = 0u;
    for (; j < {{N}}u; j++) {
        let groups = (counts[j] + 255u) / 256u;
        if w < groups {
            break;
        }
        w -= groups;
    }
    if j == {{N}}u {
        return vec2<u32>({{N}}u, 0u);
    }
    let i = w * 256u + t;
    if i >= counts[j] {
        return vec2<u32>({{N}}u, 0u);
    }
    return vec2<u32>(j, i);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let slot = deal(array<u32, {{N}}>({{COUNTS}}), wg.x + wg.y * nw.x, t);
    if slot.x == {{N}}u {
        return;
    }
    run(slot.x, slot.y);
}
