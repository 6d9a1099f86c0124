// Direct 2-D convolution (NCHW input, [C_out, C_in / groups, KH, KW] weight, contiguous), one
// invocation per output element, f32 accumulation. Zero padding; stride, dilation and groups
// as in PyTorch. Without a bias the weight is bound in its place and `has_bias` is 0.
{{ENABLES}}
struct Params {
    n: u32,
    cin: u32,
    h: u32,
    w: u32,
    cout: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    groups: u32,
    has_bias: u32,
    x_off: u32,
    w_off: u32,
    b_off: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> wt: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> bias: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.n * p.cout * p.oh * p.ow {
        return;
    }
    let ox = e % p.ow;
    var t = e / p.ow;
    let oy = t % p.oh;
    t = t / p.oh;
    let co = t % p.cout;
    let n = t / p.cout;
    let cin_g = p.cin / p.groups;
    let g = co / (p.cout / p.groups);
    var acc = 0.0;
    for (var ci = 0u; ci < cin_g; ci++) {
        let c = g * cin_g + ci;
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
                let xv = f32(x[p.x_off + ((n * p.cin + c) * p.h + u32(iy)) * p.w + u32(ix)]);
                let wv = f32(wt[p.w_off + ((co * cin_g + ci) * p.kh + ky) * p.kw + kx]);
                acc += xv * wv;
            }
        }
    }
    if p.has_bias == 1u {
        acc += f32(bias[p.b_off + co]);
    }
    out[e] = {{T}}(acc);
}
