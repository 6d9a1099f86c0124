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
    // nll_loss's forward over windows of rows (`ops/loss.rs`, Note [Windows]): 0 all rows in
    // one launch; 1 the first window, 2 a middle one, 3 the last. Every window but the first
    // adds the sums before it, kept in `out` (unscaled) and `total`.
    part: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;
