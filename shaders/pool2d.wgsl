// max_pool2d / avg_pool2d over a contiguous NCHW input, one invocation per output element.
// Max ignores padding (NaN propagates); average divides by the whole window (PyTorch's
// count_include_pad=True default). The max's position in the input plane (iy * w + ix: the
// first strict maximum in row-major order, a NaN replacing it, PyTorch's index rule) is
// tracked too: `Kernel::Pool2dArgmax` stores it instead of the value, for the input gradient
// (`pool2d_backward.wgsl`).
{{ENABLES}}
{{PARAMS}}

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{O}}>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.nc * p.oh * p.ow {
        return;
    }
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let plane = e / (p.ow * p.oh);
    var best = bitcast<f32>(0xff800000u | p.extra);
    var at = 0xffffffffu;
    var sum = 0.0;
    for (var ky = 0u; ky < p.kh; ky++) {
        let iy = i32(oy * p.sh + ky * p.dh) - i32(p.ph);
        if iy < 0 || iy >= i32(p.h) {
            continue;
        }
        for (var kx = 0u; kx < p.kw; kx++) {
            let ix = i32(ox * p.sw + kx * p.dw) - i32(p.pw);
            if ix < 0 || ix >= i32(p.w) {
                continue;
            }
            let q = u32(iy) * p.w + u32(ix);
            let v = f32(x[p.x_off + plane * p.h * p.w + q]);
            sum += v;
            if at == 0xffffffffu || is_nan(v) || (!is_nan(best) && v > best) {
                best = v;
                at = q;
            }
        }
    }
    {{STORE}}
}
