// layer_norm's weight and bias gradients, as per-chunk partial sums over rows:
// dw = sum over rows of dy * (x - mean) * rstd, db = sum of dy. A workgroup is 64 units of
// columns by 4 row lanes (a warp reads contiguous units, as `colsum.wgsl`) over `chunk_len`
// rows; the dw partials go to row `chunk` of `part` and the db partials to row
// `chunks + chunk`, f32, summed over chunks by the caller.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> x: array<{{E}}>;
// Unread (the weight's binding in the shared snippet); the caller binds x's block here.
@group(0) @binding(1) var<storage, read_write> w: array<{{E}}>;
@group(0) @binding(2) var<storage, read_write> dy: array<{{E}}>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<{{W}}>;

var<workgroup> col_part: array<{{W}}, 512>;

@compute @workgroup_size(64, 4)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_id) l: vec3<u32>,
) {
    let col = wid.x * 64u + l.x;
    let chunk = wid.y;
    let start = chunk * p.chunk_len;
    let end = min(start + p.chunk_len, p.rows);
    var dw = {{W}}(0.0);
    var db = {{W}}(0.0);
    if col < p.units {
        for (var r = start + l.y; r < end; r += 4u) {
            let g = {{W}}(dy[r * p.units + col]);
            let xh = ({{W}}(x[p.x_off + r * p.units + col]) - {{W}}(stats[r])) * stats[p.rows + r];
            dw += g * xh;
            db += g;
        }
    }
    col_part[l.y * 64u + l.x] = dw;
    col_part[256u + l.y * 64u + l.x] = db;
    workgroupBarrier();
    if l.y == 0u && col < p.units {
        let sw = col_part[l.x] + col_part[64u + l.x] + col_part[128u + l.x] + col_part[192u + l.x];
        let sb = col_part[256u + l.x] + col_part[320u + l.x] + col_part[384u + l.x]
            + col_part[448u + l.x];
        part[chunk * p.units + col] = sw;
        part[(nw.y + chunk) * p.units + col] = sb;
    }
}
