// The multi-tensor kernels' dealing of workgroups (`amp_multi.wgsl`, `optim_multi.wgsl`): the
// workgroups go to the tensors in order, ceil(n / 256) each (n in vec4s), so that a workgroup
// works on one tensor. Returns (slot, element) for invocation t of workgroup w, or a slot of
// {{N}} where there is nothing to do (past the last tensor or its count).
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
