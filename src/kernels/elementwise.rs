//! Specialises `shaders/elementwise.wgsl` per (form, op, dtypes, contiguity): the template step
//! that keeps one WGSL file for every elementwise kernel.

use crate::base::{BinaryOp, DType, UnaryOp};

/// How many elements one invocation handles (grid-stride, so loads stay coalesced).
pub const PER_THREAD: u32 = 4;

/// One or two inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// `f(x)`
    Unary(UnaryOp),
    /// `f(x, y)`, broadcast
    Binary(BinaryOp),
    /// The second operand is a scalar carried in the immediates.
    Scalar(BinaryOp),
}

/// One elementwise kernel variant. Inputs and output share `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseKernel {
    /// The op.
    pub form: Form,
    /// The tensors' dtype.
    pub dtype: DType,
    /// All operands contiguous over the output's element order: no index arithmetic.
    pub contiguous: bool,
    /// Each invocation moves `vec4`s (16 bytes per f32 load), enough bytes in flight to
    /// saturate HBM: contiguous, with element counts and offsets divisible by 4; or, not
    /// contiguous, every operand's innermost dim unit-stride and everything else whole vec4s
    /// (the immediates then count in vec4s: the kernel unravels once per vec4).
    pub vector: bool,
    /// With `vector`, 4-byte elements: each invocation moves 32-byte `vec4<u64>` words (eight
    /// elements, split by masks and shifts), for adapters with 64-bit integers. Mesa's llvmpipe
    /// loads and stores a storage buffer component by component, two branches each, so a word
    /// of twice the bytes halves that cost (`ReduceStrategy::SerialWide`, the same idea).
    pub wide: bool,
    /// Store back into `a`'s own elements (PyTorch's trailing-underscore ops) instead of a fresh
    /// contiguous output.
    pub inplace: bool,
}

fn wgsl_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => unreachable!("bool has no elementwise GPU kernels yet"),
        DType::F64 => unreachable!("f64 never reaches a GPU kernel (Device::check_dtype)"),
    }
}

/// The type ops compute in: f32 for floats (PyTorch's opmath), the type itself for integers.
fn compute_type(d: DType) -> &'static str {
    if d.is_float() {
        "f32"
    } else {
        wgsl_type(d)
    }
}

impl ElementwiseKernel {
    /// The op's WGSL expression, or `None` where the op does not take this dtype on the GPU.
    pub fn expr(&self) -> Option<&'static str> {
        if self.dtype == DType::Bool {
            return None;
        }
        let float = self.dtype.is_float();
        match self.form {
            Form::Unary(op) if float => Some(op.wgsl_float()),
            Form::Unary(op) => op.wgsl_int(self.dtype == DType::I32),
            Form::Binary(op) | Form::Scalar(op) if float => Some(op.wgsl_float()),
            Form::Binary(op) | Form::Scalar(op) => op.wgsl_int(),
        }
    }

    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let (form, op) = match self.form {
            Form::Unary(op) => ("unary", op.name()),
            Form::Binary(op) => ("binary", op.name()),
            Form::Scalar(op) => ("scalar", op.name()),
        };
        let layout = match (self.contiguous, self.vector) {
            (true, true) if self.wide => "vec8",
            (true, true) => "vec4",
            (true, false) => "contig",
            (false, true) => "strided_vec4",
            (false, false) => "strided",
        };
        let inplace = if self.inplace { "_inplace" } else { "" };
        format!("{form}_{op}_{}_{layout}{inplace}", self.dtype)
    }

    /// Storage buffers the kernel binds.
    pub fn bindings(&self) -> u32 {
        let inputs = match self.form {
            Form::Binary(_) => 2,
            Form::Unary(_) | Form::Scalar(_) => 1,
        };
        inputs + !self.inplace as u32
    }

    /// The WGSL of this variant. Panics only for a variant `expr` refuses (never dispatched).
    pub fn source(&self) -> String {
        let scalar_t = wgsl_type(self.dtype);
        let c = compute_type(self.dtype);
        let vector_t = format!("vec4<{scalar_t}>");
        let t: &str = if self.wide {
            "vec4<u64>"
        } else if self.vector {
            &vector_t
        } else {
            scalar_t
        };
        let expr = self.expr().expect("variant exists");
        let binary = matches!(self.form, Form::Binary(_));
        let mut names = vec!["a"];
        if binary {
            names.push("b");
        }
        if !self.inplace {
            names.push("out");
        }
        let bindings: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!("@group(0) @binding({i}) var<storage, read_write> {n}: array<{t}>;")
            })
            .collect();
        let bindings = bindings.join("\n");
        let (ia, ib) = if self.contiguous {
            ("p.off_a + i".to_string(), "p.off_b + i".to_string())
        } else {
            ("o.x".to_string(), "o.y".to_string())
        };
        // The strided forms unravel the operands' offsets first (the wide form is contiguous).
        let o = if self.contiguous {
            ""
        } else {
            "let o = offsets(i);\n        "
        };
        // In place, each element goes back where it was read from.
        let dst = if self.inplace {
            format!("a[{ia}]")
        } else {
            "out[i]".to_string()
        };
        let y = match self.form {
            Form::Binary(_) if self.vector => format!("let y = {c}(vb[k4]);"),
            Form::Binary(_) => format!("let y = {c}(b[{ib}]);"),
            Form::Scalar(_) => format!("let y = bitcast<{c}>(p.off_b);"),
            Form::Unary(_) => String::new(),
        };
        let body = if self.wide {
            // Word j of a vec4<u64> holds elements 2j (low half) and 2j + 1 (high half): the
            // op runs on the low halves, then the high ones, and the halves go back in place.
            let split = |v: &str, n: &str| {
                format!(
                    "let {n}lo = bitcast<{vector_t}>(vec4<u32>({v} & vec4<u64>(0xfffffffflu)));\n        \
                     let {n}hi = bitcast<{vector_t}>(vec4<u32>({v} >> vec4<u32>(32u)));\n        "
                )
            };
            let mut body = format!("let va = a[{ia}];\n        {}", split("va", "a"));
            if binary {
                body += &format!("let vb = b[{ib}];\n        {}", split("vb", "b"));
            }
            let half = |h: &str| {
                let y = match self.form {
                    Form::Binary(_) => format!("let y = {c}(b{h}[k4]);"),
                    Form::Scalar(_) => format!("let y = bitcast<{c}>(p.off_b);"),
                    Form::Unary(_) => String::new(),
                };
                format!(
                    "for (var k4 = 0u; k4 < 4u; k4++) {{\n            let x = {c}(a{h}[k4]);\n            \
                     {y}\n            r{h}[k4] = {scalar_t}({expr});\n        }}\n        "
                )
            };
            body += &format!(
                "var rlo: {vector_t};\n        var rhi: {vector_t};\n        {}{}{dst} = \
                 vec4<u64>(bitcast<vec4<u32>>(rlo)) | (vec4<u64>(bitcast<vec4<u32>>(rhi)) << \
                 vec4<u32>(32u));",
                half("lo"),
                half("hi")
            );
            body
        } else if self.vector {
            // One vec4 load per operand, the op per component, one vec4 store.
            let vb = if binary {
                format!("let vb = b[{ib}];")
            } else {
                String::new()
            };
            format!(
                "{o}let va = a[{ia}];\n        {vb}\n        var r: {t};\n        \
                 for (var k4 = 0u; k4 < 4u; k4++) {{\n            let x = {c}(va[k4]);\n            \
                 {y}\n            r[k4] = {scalar_t}({expr});\n        }}\n        {dst} = r;"
            )
        } else {
            format!("{o}let x = {c}(a[{ia}]);\n        {y}\n        {dst} = {t}({expr});")
        };
        let enables = if self.dtype == DType::F16 {
            "enable f16;"
        } else {
            ""
        };
        let helpers = if self.dtype.is_float() {
            include_str!("../../shaders/math.wgsl")
        } else {
            ""
        };
        include_str!("../../shaders/elementwise.wgsl")
            .replace("{{ENABLES}}", enables)
            .replace("{{BINDINGS}}", &bindings)
            .replace("{{HELPERS}}", helpers)
            .replace("{{PER_THREAD}}", &PER_THREAD.to_string())
            .replace("{{BODY}}", &body)
    }

    /// Every variant that exists (for validation).
    pub fn all() -> Vec<ElementwiseKernel> {
        let mut v = Vec::new();
        let forms = UnaryOp::ALL
            .iter()
            .map(|&o| Form::Unary(o))
            .chain(BinaryOp::ALL.iter().map(|&o| Form::Binary(o)))
            .chain(BinaryOp::GRADS.iter().map(|&o| Form::Binary(o)))
            .chain(BinaryOp::ALL.iter().map(|&o| Form::Scalar(o)));
        for form in forms {
            for dtype in [DType::F32, DType::F16, DType::I32, DType::U32] {
                for (contiguous, vector, wide) in [
                    (true, true, true),
                    (true, true, false),
                    (true, false, false),
                    (false, true, false),
                    (false, false, false),
                ] {
                    if wide && dtype.size_bytes() != 4 {
                        continue;
                    }
                    for inplace in [false, true] {
                        let k = ElementwiseKernel {
                            form,
                            dtype,
                            contiguous,
                            vector,
                            wide,
                            inplace,
                        };
                        if k.expr().is_some() {
                            v.push(k);
                        }
                    }
                }
            }
        }
        v
    }
}
