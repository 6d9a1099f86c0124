// The immediates of `pool2d.wgsl` and `pool2d_backward.wgsl` (`ops::conv::Pool2dWindow`).
struct Params {
    nc: u32,
    h: u32,
    w: u32,
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
    is_max: u32,
    x_off: u32,
    // The forward: bits OR'd into the initial -inf (zero; a run-time value, as naga refuses
    // infinite constants). The backward: the gradient's offset.
    extra: u32,
}

var<immediate> p: Params;
