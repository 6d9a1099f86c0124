//! Specialises the three passes of the fused batch normalisation (`shaders/batch_norm_*.wgsl`):
//! per-channel partial sums, the per-channel finalize, and the elementwise apply, each for the
//! forward or the backward, the sweeping passes over f32 scalars or vec4s, and with `relu` a
//! ReLU fused after the normalisation (`ops::batch_norm_relu`): the forward apply clamps, and
//! the backward passes mask the gradient where the output was not positive, the output
//! recomputed from the input and the saved statistics with the forward's own `fma`.

/// One pass of the fused batch normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchNormPass {
    /// Partial sums per (channel, chunk); `relu` only backward.
    Reduce {
        /// The backward pass's sums (of the gradient and the gradient times the normalised input).
        backward: bool,
        /// Whole vec4s per invocation.
        vec4: bool,
        /// The gradient masked by the forward's ReLU first.
        relu: bool,
        /// x and g in f16 (the statistics f32): batch norm on autocast's f16 activations.
        half: bool,
        /// Forward only: also adds 1 to an i32 counter (a module's `num_batches_tracked`).
        count: bool,
        /// The finalize folded in: the last workgroup of each channel to finish runs it
        /// (Note [Folded finalize]).
        finalize: bool,
    },
    /// One invocation per channel: statistics (forward) or coefficients (backward).
    Finalize {
        /// The backward pass's coefficients.
        backward: bool,
    },
    /// The elementwise output (forward) or input gradient (backward).
    Apply {
        /// The backward pass (the input gradient).
        backward: bool,
        /// Whole vec4s per invocation.
        vec4: bool,
        /// A ReLU fused in (forward), or its mask applied (backward).
        relu: bool,
        /// x, g and the output in f16 (the coefficients f32).
        half: bool,
    },
}

/// `y = x * scale + shift` as the ReLU-fused passes compute it, in `{{V}}` units: one `fma`,
/// so that the backward's recomputation of the output's sign is the forward's bit for bit.
const NORMALISED: &str = "fn normalised(x: {{V}}, scale: f32, shift: f32) -> {{V}} {\n    \
     return fma(x, {{V}}(scale), {{V}}(shift));\n}\n";

impl BatchNormPass {
    /// Every pass, for validation.
    pub fn all() -> Vec<BatchNormPass> {
        let mut v = Vec::new();
        for backward in [false, true] {
            v.push(BatchNormPass::Finalize { backward });
            for vec4 in [false, true] {
                for relu in [false, true] {
                    for half in [false, true] {
                        for (count, finalize) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            if (backward || !relu) && !(backward && count) {
                                v.push(BatchNormPass::Reduce {
                                    backward,
                                    vec4,
                                    relu,
                                    half,
                                    count,
                                    finalize,
                                });
                            }
                        }
                        v.push(BatchNormPass::Apply {
                            backward,
                            vec4,
                            relu,
                            half,
                        });
                    }
                }
            }
        }
        v
    }

    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let (pass, backward, vec4, relu, half) = match *self {
            BatchNormPass::Reduce {
                backward,
                vec4,
                relu,
                half,
                count,
                finalize,
            } => (
                match (count, finalize) {
                    (false, false) => "reduce",
                    (true, false) => "reduce_count",
                    (false, true) => "reduce_finalize",
                    (true, true) => "reduce_count_finalize",
                },
                backward,
                vec4,
                relu,
                half,
            ),
            BatchNormPass::Finalize { backward } => ("finalize", backward, false, false, false),
            BatchNormPass::Apply {
                backward,
                vec4,
                relu,
                half,
            } => ("apply", backward, vec4, relu, half),
        };
        format!(
            "batch_norm_{}{pass}_{}_{}{}",
            if relu { "relu_" } else { "" },
            if backward { "bwd" } else { "fwd" },
            if half { "f16" } else { "f32" },
            if vec4 { "_vec4" } else { "" }
        )
    }

    /// Storage buffers the pass binds.
    pub fn bindings(&self) -> u32 {
        match *self {
            BatchNormPass::Reduce {
                backward,
                count,
                finalize,
                ..
            } => 2 + 2 * backward as u32 + count as u32 + 6 * finalize as u32,
            BatchNormPass::Finalize { .. } => 6,
            BatchNormPass::Apply { backward, relu, .. } => {
                3 + backward as u32 + (backward && relu) as u32
            }
        }
    }

    /// Bytes of the pass's immediates: the partial sums' pass carries the folded finalize's
    /// too.
    pub fn immediate_size(&self) -> u32 {
        match self {
            BatchNormPass::Reduce { .. } => 96,
            _ => 48,
        }
    }

    /// Whether the pass binds the device's arrival counters after its blocks (Note [Folded
    /// finalize]).
    pub fn counts_arrivals(&self) -> bool {
        matches!(self, BatchNormPass::Reduce { finalize: true, .. })
    }

    /// The WGSL entry point of the pass.
    pub fn entry_point(&self) -> &'static str {
        match *self {
            BatchNormPass::Finalize { backward: false } => "forward",
            BatchNormPass::Finalize { backward: true } => "backward",
            _ => "main",
        }
    }

    /// The pass's WGSL.
    pub fn source(&self) -> String {
        match *self {
            BatchNormPass::Finalize { .. } => {
                include_str!("../../shaders/batch_norm_finalize.wgsl")
                    .replace("{{FIN}}", FIN)
                    .replace("{{FNS}}", FINALIZE_FNS)
            }
            BatchNormPass::Reduce {
                backward,
                vec4,
                relu,
                half,
                count,
                finalize,
            } => {
                let (bindings, shift, acc, extra) = if backward && relu {
                    (
                        "@group(0) @binding(1) var<storage, read_write> g: array<{{V}}>;\n\
                         @group(0) @binding(2) var<storage, read_write> stats: array<f32>;\n\
                         @group(0) @binding(3) var<storage, read_write> part: array<vec2<f32>>;",
                        "let k = stats[p.mean_off + c];\n    \
                         let scale = stats[p.mean_off + 2u * p.c + c];\n    \
                         let shift = stats[p.mean_off + 3u * p.c + c];",
                        "let xv = x[p.x_off + i];\n        \
                         let gv = select(g[p.g_off + i], {{V}}(0.0), normalised(xv, scale, shift) <= {{V}}(0.0));\n        \
                         acc += vec2<f32>(total(gv), mul_sum(gv, xv - k));",
                        "",
                    )
                } else if backward {
                    (
                        "@group(0) @binding(1) var<storage, read_write> g: array<{{V}}>;\n\
                         @group(0) @binding(2) var<storage, read_write> stats: array<f32>;\n\
                         @group(0) @binding(3) var<storage, read_write> part: array<vec2<f32>>;",
                        "let k = stats[p.mean_off + c];",
                        "let gv = g[p.g_off + i];\n        \
                         acc += vec2<f32>(total(gv), mul_sum(gv, x[p.x_off + i] - k));",
                        "",
                    )
                } else {
                    (
                        "@group(0) @binding(1) var<storage, read_write> part: array<vec2<f32>>;",
                        if vec4 {
                            "let k = x[p.x_off + c * p.s].x;"
                        } else {
                            "let k = x[p.x_off + c * p.s];"
                        },
                        "let d = x[p.x_off + i] - k;\n        \
                         acc += vec2<f32>(total(d), mul_sum(d, d));",
                        "if wg.y == 0u {\n            \
                         part[p.k_off + c] = vec2<f32>(k, 0.0);\n        }",
                    )
                };
                // The module's counter, once a launch: by the first workgroup's first
                // invocation (`pad1` holds its offset).
                let (bindings, extra) = match count {
                    true => (
                        format!(
                            "{bindings}\n@group(0) @binding(2) var<storage, read_write> counter: array<i32>;"
                        ),
                        format!(
                            "{extra}\n        if wg.x == 0u && wg.y == 0u {{\n            \
                             counter[p.pad1] += 1;\n        }}"
                        ),
                    ),
                    false => (bindings.to_string(), extra.to_string()),
                };
                let (bindings, helpers, finish) = match finalize {
                    true => {
                        folded_finalize(bindings, 2 + 2 * backward as u32 + count as u32, backward)
                    }
                    false => (bindings, String::new(), String::new()),
                };
                let tpl = include_str!("../../shaders/batch_norm_reduce.wgsl")
                    .replace("{{FIN}}", FIN)
                    .replace("{{BINDINGS}}", &bindings)
                    .replace("{{SHIFT}}", shift)
                    .replace("{{ACC}}", acc)
                    .replace("{{EXTRA}}", &extra)
                    .replace("{{FINISH}}", &finish)
                    .replace(
                        "{{HELPERS}}",
                        &format!(
                            "{helpers}{}{}",
                            if vec4 {
                                "fn total(v: vec4<f32>) -> f32 {\n    return dot(v, vec4<f32>(1.0));\n}\n\n\
                                 fn mul_sum(a: vec4<f32>, b: vec4<f32>) -> f32 {\n    return dot(a, b);\n}\n"
                            } else {
                                "fn total(v: f32) -> f32 {\n    return v;\n}\n\n\
                                 fn mul_sum(a: f32, b: f32) -> f32 {\n    return a * b;\n}\n"
                            },
                            if relu { NORMALISED } else { "" }
                        ),
                    );
                specialise(tpl, vec4, half)
            }
            BatchNormPass::Apply {
                backward,
                vec4,
                relu,
                half,
            } => {
                let (bindings, body) = match (backward, relu) {
                    (true, false) => (
                        "@group(0) @binding(3) var<storage, read_write> g: array<{{V}}>;".into(),
                        "let o = p.co_off + c;\n    \
                         out[i] = g[p.g_off + i] * co[o] + x[p.x_off + i] * co[o + p.c] + co[o + 2u * p.c];",
                    ),
                    (true, true) => (
                        format!(
                            "@group(0) @binding(3) var<storage, read_write> g: array<{{{{V}}}}>;\n\
                             @group(0) @binding(4) var<storage, read_write> stats: array<f32>;\n{NORMALISED}"
                        ),
                        "let o = p.co_off + c;\n    \
                         let s = p.stats_off + c;\n    \
                         let xv = x[p.x_off + i];\n    \
                         let y = normalised(xv, stats[s + 2u * p.c], stats[s + 3u * p.c]);\n    \
                         let gv = select(g[p.g_off + i], {{V}}(0.0), y <= {{V}}(0.0));\n    \
                         out[i] = gv * co[o] + xv * co[o + p.c] + co[o + 2u * p.c];",
                    ),
                    (false, false) => (
                        String::new(),
                        "let o = p.co_off + c;\n    out[i] = x[p.x_off + i] * co[o] + co[o + p.c];",
                    ),
                    (false, true) => (
                        NORMALISED.to_string(),
                        "let o = p.co_off + c;\n    \
                         out[i] = max(normalised(x[p.x_off + i], co[o], co[o + p.c]), {{V}}(0.0));",
                    ),
                };
                let tpl = include_str!("../../shaders/batch_norm_apply.wgsl")
                    .replace("{{BINDINGS}}", &bindings)
                    .replace("{{BODY}}", body);
                specialise(tpl, vec4, half)
            }
        }
    }
}

/// The finalize's parameters (`Fin`), which both passes that may run it take as immediates.
const FIN: &str = include_str!("../../shaders/batch_norm_fin.wgsl");

/// The finalize's functions (`finalize_forward`, `finalize_backward`).
const FINALIZE_FNS: &str = include_str!("../../shaders/batch_norm_finalize_fns.wgsl");

// Note [Folded finalize]
// The per-channel finalize used to be a launch of its own after the partial sums: 106 launches
// of 8-9 us in a ResNet-50 step (two per batch norm), about 0.6 ms of its 46. With the finalize
// folded in, each workgroup of the partial sums, once its partial is written, passes a
// `storageBarrier` (naga's: a workgroup control barrier with device-scope acquire-release
// semantics on storage memory) and adds 1 to its channel's arrival counter; the workgroup
// that brings the count to the channel's chunks passes a second barrier and runs the
// channel's finalize, reading every chunk's partial, and sets the counter back to 0. The
// counters are the device's own (`kernels::launch`: 4096 u32s, zeroed at creation, bound
// after the blocks), not a tensor, like the assert flag: every launch leaves them at 0, so no
// fill precedes it. Dispatches that bind them are ordered by wgpu's barriers between
// read-write uses. A channel count above the counters, or a device with too few storage
// bindings a stage, takes the two launches.

/// The folded finalize's bindings (after the pass's `first` ones: b1..b5, then the arrival
/// counters), helpers and closing lines, for the `backward` direction or the forward.
fn folded_finalize(bindings: String, first: u32, backward: bool) -> (String, String, String) {
    let mut b = bindings;
    for (i, name) in ["b1", "b2", "b3", "b4", "b5"].iter().enumerate() {
        b += &format!(
            "\n@group(0) @binding({}) var<storage, read_write> {name}: array<f32>;",
            first + i as u32
        );
    }
    b += &format!(
        "\n@group(0) @binding({}) var<storage, read_write> arrivals: array<atomic<u32>>;",
        first + 5
    );
    let helpers = format!("{FINALIZE_FNS}\nvar<workgroup> arrived_last: u32;\n\n");
    let finish = format!(
        "// The partial is written (device scope) before the channel's arrival is counted; the\n    \
         // last workgroup to arrive reads every chunk's after its own barrier.\n    \
         storageBarrier();\n    \
         if l.x == 0u {{\n        \
         var last = 0u;\n        \
         if atomicAdd(&arrivals[c], 1u) + 1u == p.fin.chunks {{\n            \
         atomicStore(&arrivals[c], 0u);\n            \
         last = 1u;\n        \
         }}\n        \
         arrived_last = last;\n    \
         }}\n    \
         if workgroupUniformLoad(&arrived_last) == 1u {{\n        \
         storageBarrier();\n        \
         if l.x == 0u {{\n            \
         finalize_{}(p.fin, c);\n        \
         }}\n    \
         }}",
        if backward { "backward" } else { "forward" }
    );
    (b, helpers, finish)
}

/// A sweeping pass's template with `{{V}}` (the unit it computes in: `f32` or `vec4<f32>`)
/// filled in. With `half`, x, g and the output are stored as f16 (`f16` or `vec4<f16>`): each
/// load of x or g converts to the f32 unit and the store rounds back, so the sums and the
/// arithmetic stay f32 as in PyTorch's kernels for f16 input.
fn specialise(tpl: String, vec4: bool, half: bool) -> String {
    let v = if vec4 { "vec4<f32>" } else { "f32" };
    if !half {
        return tpl.replace("{{V}}", v);
    }
    let h = if vec4 { "vec4<f16>" } else { "f16" };
    let mut s = format!("enable f16;\n\n{tpl}");
    for name in ["x", "g", "out"] {
        s = s.replace(
            &format!("{name}: array<{{{{V}}}}>"),
            &format!("{name}: array<{h}>"),
        );
    }
    for load in ["x[p.x_off + i]", "g[p.g_off + i]", "x[p.x_off + c * p.s]"] {
        s = s.replace(load, &format!("{{{{V}}}}({load})"));
    }
    // The apply pass's one store, `out[i] = <expr>;`, rounds to f16.
    if let Some(at) = s.find("out[i] = ") {
        let start = at + "out[i] = ".len();
        if let Some(len) = s[start..].find(';') {
            s.insert(start + len, ')');
            s.insert_str(start, &format!("{h}("));
        }
    }
    s.replace("{{V}}", v)
}
