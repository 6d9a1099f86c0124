// The immediates of `nll.wgsl`, `cross_entropy.wgsl` and `cross_entropy_backward_words.wgsl`
// (`ops/loss.rs`, `immediates`).
struct Params {
    n: u32,
    c: u32,
    // The input (strides s0, s1) in a forward; the upstream gradient (0-d) in a backward.
    x_off: u32,
    s0: u32,
    s1: u32,
    t_off: u32,
    st: u32,
    // forward: the loss; backward: the contiguous [N, C] gradient.
    out_off: u32,
    // total_weight (f32).
    tw_off: u32,
    ignore: i32,
    // cross_entropy: log_softmax's output, contiguous [N, C].
    y_off: u32,
    // cross_entropy_backward_words: each row's factor and target come from records (f32 bits,
    // i32) that `nll_rows.wgsl` wrote at word t_off of `labels`'s buffer.
    records: u32,
}

var<immediate> p: Params;
