// The input gradient of max_pool2d / avg_pool2d over contiguous NCHW tensors, one invocation
// per input element, gathering from the (at most ceil(k/s) x ceil(k/s)) output windows that
// contain it, so no two invocations write one element and no atomics are needed:
// - max: a window's gradient goes to the element whose position its index names
//   (`pool2d.wgsl` as `Kernel::Pool2dArgmax`, PyTorch's rule);
// - average: every element of the window gets g / (kh * kw) (count_include_pad=True).
{{ENABLES}}
{{PARAMS}}

@group(0) @binding(0) var<storage, read_write> g: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> idx: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.nc * p.h * p.w {
        return;
    }
    let q = e % (p.h * p.w);
    let iy = q / p.w;
    let ix = q % p.w;
    let plane = e / (p.h * p.w);
    // The last immediate is the gradient's offset here.
    let g_off = p.extra;
    var acc = 0.0;
    // The output rows whose windows reach input row iy: oy * sh + tap * dh = iy + ph for a
    // tap in [0, kh), so oy runs from ceil((iy + ph - (kh - 1) * dh) / sh) to
    // floor((iy + ph) / sh); likewise the columns.
    let ry = iy + p.ph;
    let rx = ix + p.pw;
    let y_lo = u32(max(i32(ry) - i32((p.kh - 1u) * p.dh) + i32(p.sh) - 1, 0)) / p.sh;
    let x_lo = u32(max(i32(rx) - i32((p.kw - 1u) * p.dw) + i32(p.sw) - 1, 0)) / p.sw;
    let y_hi = min(ry / p.sh + 1u, p.oh);
    let x_hi = min(rx / p.sw + 1u, p.ow);
    for (var oy = y_lo; oy < y_hi; oy++) {
        let ty = ry - oy * p.sh;
        if ty % p.dh != 0u {
            continue;
        }
        for (var ox = x_lo; ox < x_hi; ox++) {
            let tx = rx - ox * p.sw;
            if tx % p.dw != 0u {
                continue;
            }
            let o = (plane * p.oh + oy) * p.ow + ox;
            if p.is_max == 0u {
                acc += f32(g[g_off + o]) / f32(p.kh * p.kw);
            } else if idx[o] == q {
                acc += f32(g[g_off + o]);
            }
        }
    }
    out[e] = {{T}}(acc);
}
