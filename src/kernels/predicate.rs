//! Specialises `shaders/predicate.wgsl`: comparisons (to bool), casts between any dtypes, and
//! the masked select behind `where` and `masked_fill`.

use crate::base::{CmpOp, DType};

/// What a predicate kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PredicateForm {
    /// `a OP b` over two strided operands.
    Compare(CmpOp),
    /// `a OP scalar`, the scalar's bits in `off_b`.
    CompareScalar(CmpOp),
    /// `a` converted to the output dtype.
    Cast,
    /// In place on the contiguous output: where `a` (bool) holds, take `b`.
    Select,
    /// As `Select`, with a scalar in `off_b`.
    SelectScalar,
}

/// One variant: `input` is the dtype of the compared/cast/selected values, `output` the result's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PredicateKernel {
    /// What it computes.
    pub form: PredicateForm,
    /// The dtype of the compared, cast or selected values.
    pub input: DType,
    /// The result's dtype.
    pub output: DType,
}

fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::I32 => "i32",
        DType::U32 | DType::Bool => "u32",
        DType::F64 => unreachable!("f64 never reaches a GPU kernel (Device::check_dtype)"),
    }
}

fn compute_type(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 => "f32",
        DType::F64 => unreachable!("f64 never reaches a GPU kernel (Device::check_dtype)"),
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => "bool",
    }
}

/// WGSL reading element `idx` of buffer `buf` of dtype `d` as its compute type.
fn load(buf: &str, d: DType, idx: &str) -> String {
    match d {
        DType::Bool => format!("((({buf}[({idx}) / 4u] >> ((({idx}) % 4u) * 8u)) & 0xffu) != 0u)"),
        _ => format!("{}({buf}[{idx}])", compute_type(d)),
    }
}

/// WGSL converting `v` of dtype `from`'s compute type to dtype `to`'s storage value.
fn convert(v: &str, from: DType, to: DType) -> String {
    match (from, to) {
        (DType::Bool, DType::Bool) => v.to_string(),
        (DType::Bool, _) => format!("select({t}(0), {t}(1), {v})", t = storage_type(to)),
        // `!(x == 0)`, not `x != 0`: float `!=` compiles to an ordered compare, false for NaN,
        // and PyTorch's bool(NaN) is true.
        (_, DType::Bool) => format!("!({v} == {}(0))", compute_type(from)),
        _ => format!("{}({v})", storage_type(to)),
    }
}

impl PredicateKernel {
    /// The kernel's name, as the profiler prints it.
    pub fn name(&self) -> String {
        let form = match self.form {
            PredicateForm::Compare(op) => op.name().to_string(),
            PredicateForm::CompareScalar(op) => format!("{}_scalar", op.name()),
            PredicateForm::Cast => "cast".into(),
            PredicateForm::Select => "select".into(),
            PredicateForm::SelectScalar => "select_scalar".into(),
        };
        format!("{form}_{}_{}", self.input, self.output)
    }

    /// Storage buffers the kernel binds.
    pub fn bindings(&self) -> u32 {
        match self.form {
            PredicateForm::Compare(_) | PredicateForm::Select => 3,
            _ => 2,
        }
    }

    /// Whether each invocation writes a word of four bools.
    pub fn packs_bools(&self) -> bool {
        self.output == DType::Bool
            && !matches!(
                self.form,
                PredicateForm::Select | PredicateForm::SelectScalar
            )
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        let (ti, to) = (storage_type(self.input), storage_type(self.output));
        let f16 = self.input == DType::F16 || self.output == DType::F16;
        let bindings = match self.form {
            PredicateForm::Compare(_) => format!(
                "@group(0) @binding(0) var<storage, read_write> a: array<{ti}>;\n\
                 @group(0) @binding(1) var<storage, read_write> b: array<{ti}>;\n\
                 @group(0) @binding(2) var<storage, read_write> out: array<u32>;"
            ),
            PredicateForm::CompareScalar(_) | PredicateForm::Cast => format!(
                "@group(0) @binding(0) var<storage, read_write> a: array<{ti}>;\n\
                 @group(0) @binding(1) var<storage, read_write> out: array<{}>;",
                if self.output == DType::Bool {
                    "u32"
                } else {
                    to
                }
            ),
            PredicateForm::Select => format!(
                "@group(0) @binding(0) var<storage, read_write> a: array<u32>;\n\
                 @group(0) @binding(1) var<storage, read_write> b: array<{ti}>;\n\
                 @group(0) @binding(2) var<storage, read_write> out: array<{to}>;"
            ),
            PredicateForm::SelectScalar => format!(
                "@group(0) @binding(0) var<storage, read_write> a: array<u32>;\n\
                 @group(0) @binding(1) var<storage, read_write> out: array<{to}>;"
            ),
        };
        let c = compute_type(self.input);
        let value = match self.form {
            PredicateForm::Compare(op) => format!(
                "({} {} {})",
                load("a", self.input, "o.x"),
                op.wgsl(),
                load("b", self.input, "o.y")
            ),
            PredicateForm::CompareScalar(op) => format!(
                "({} {} bitcast<{c}>(p.off_b))",
                load("a", self.input, "o.x"),
                op.wgsl()
            ),
            PredicateForm::Cast => convert(&load("a", self.input, "o.x"), self.input, self.output),
            PredicateForm::Select | PredicateForm::SelectScalar => String::new(),
        };
        let body = if self.packs_bools() {
            format!(
                "if i * 4u >= p.numel {{\n        return;\n    }}\n    var word = 0u;\n    \
                 for (var k = 0u; k < 4u; k++) {{\n        let e = i * 4u + k;\n        \
                 if e < p.numel {{\n            let o = offsets(e);\n            \
                 word |= select(0u, 1u, {value}) << (k * 8u);\n        }}\n    }}\n    out[i] = word;"
            )
        } else {
            let store = match self.form {
                PredicateForm::Cast => format!("out[i] = {value};"),
                PredicateForm::Select => format!(
                    "if {} {{\n        out[i] = {};\n    }}",
                    load("a", DType::Bool, "o.x"),
                    convert(&load("b", self.input, "o.y"), self.input, self.output)
                ),
                PredicateForm::SelectScalar => format!(
                    "if {} {{\n        out[i] = {to}(bitcast<{}>(p.off_b));\n    }}",
                    load("a", DType::Bool, "o.x"),
                    compute_type(self.output)
                ),
                _ => unreachable!("compare forms pack bools"),
            };
            format!(
                "if i >= p.numel {{\n        return;\n    }}\n    let o = offsets(i);\n    {store}"
            )
        };
        include_str!("../../shaders/predicate.wgsl")
            .replace("{{ENABLES}}", if f16 { "enable f16;" } else { "" })
            .replace("{{BINDINGS}}", &bindings)
            .replace("{{BODY}}", &body)
    }

    /// Every variant that exists (for validation).
    pub fn all() -> Vec<PredicateKernel> {
        let values = [DType::F32, DType::F16, DType::I32, DType::U32];
        let all = [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool];
        let mut v = Vec::new();
        for &input in &values {
            for op in CmpOp::ALL {
                v.push(PredicateKernel {
                    form: PredicateForm::Compare(op),
                    input,
                    output: DType::Bool,
                });
                v.push(PredicateKernel {
                    form: PredicateForm::CompareScalar(op),
                    input,
                    output: DType::Bool,
                });
            }
            v.push(PredicateKernel {
                form: PredicateForm::Select,
                input,
                output: input,
            });
            v.push(PredicateKernel {
                form: PredicateForm::SelectScalar,
                input,
                output: input,
            });
        }
        for &input in &all {
            for &output in &all {
                v.push(PredicateKernel {
                    form: PredicateForm::Cast,
                    input,
                    output,
                });
            }
        }
        v
    }
}
