// cross_entropy's backward (`cross_entropy.wgsl`'s `backward`: nll_loss's backward with
// log_softmax's applied, dx[i, j] = s_i * ([j == t_i] - exp(y[i, j])), s_i = -g / total_weight
// on a counted row, 0 on an ignored one) over the contiguous [N, C] gradient as one flat run of
// 16-byte chunks (CHUNK elements), an invocation a chunk: y's chunk read and dx's written as
// vec4<u32> through second bindings of the two buffers, the row and class found by one
// division a chunk and carried across its elements. The last chunk, if the tensor ends inside
// it, goes one element at a time. `g` (the upstream 0-d gradient) is of dtype {{G}}. Under
// autocast (nll_loss on the f32 copy of f16 log-probabilities, Note [Backward epilogues]) the
// rows' factors and targets come instead from the records `nll_rows.wgsl` wrote into
// nll_loss's otherwise unwritten f32 gradient, and the copy's backward is applied too. y and
// dx start at whole chunks (`ops/loss.rs` sends no other tensors here). The element-wise
// kernel wrote GPT-2's f32 [8192, 50257] gradient at about 1.4 TB/s on the H200.
{{ENABLES}}
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> g: array<{{G}}>;
@group(0) @binding(1) var<storage, read_write> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> total: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> yw: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> ow: array<vec4<u32>>;

const CHUNK: u32 = {{CHUNK}}u;
// The vec4<f32>s of a chunk.
const CV: u32 = CHUNK / 4u;

fn chunk_of(w: vec4<u32>) -> array<vec4<f32>, CV> {
    {{GET}}
}

fn word_of(v: array<vec4<f32>, CV>) -> vec4<u32> {
    {{PUT}}
}

// A row's factor s_i and target (-1 where it counts for nothing).
struct Row {
    s: f32,
    t: i32,
}

fn row_of(i: u32) -> Row {
    if p.records != 0u {
        let at = p.t_off + 2u * i;
        return Row(bitcast<f32>(labels[at]), labels[at + 1u]);
    }
    let ti = labels[p.t_off + i * p.st];
    if ti != p.ignore && ti >= 0 && u32(ti) < p.c {
        return Row(-f32(g[p.x_off]) / total[p.tw_off], ti);
    }
    return Row(0.0, -1);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let q = gid.x + gid.y * nw.x * 256u;
    let nc = p.n * p.c;
    let e0 = q * CHUNK;
    if e0 >= nc {
        return;
    }
    var i = e0 / p.c;
    var j = e0 - i * p.c;
    var row = row_of(i);
    if e0 + CHUNK <= nc {
        let yv = chunk_of(yw[p.y_off / CHUNK + q]);
        var o: array<vec4<f32>, CV>;
        for (var k = 0u; k < CHUNK; k++) {
            if j == p.c {
                i += 1u;
                j = 0u;
                row = row_of(i);
            }
            let hit = select(0.0, 1.0, i32(j) == row.t);
            o[k / 4u][k % 4u] = row.s * (hit - exp(yv[k / 4u][k % 4u]));
            j += 1u;
        }
        ow[p.out_off / CHUNK + q] = word_of(o);
        return;
    }
    for (var e = e0; e < nc; e++) {
        if j == p.c {
            i += 1u;
            j = 0u;
            row = row_of(i);
        }
        let hit = select(0.0, 1.0, i32(j) == row.t);
        out[p.out_off + e] = {{T}}(row.s * (hit - exp(f32(y[p.y_off + e]))));
        j += 1u;
    }
}
