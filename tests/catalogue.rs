//! The catalogue of bad inputs: each case is something a user can get wrong, across
//! ops, nn, optim, files and the allocator. Every case must fail with the error kind and text
//! PyTorch users would recognise, and leave everything else intact: a witness tensor allocated
//! before it reads back unchanged, and `memory_allocated` returns to its baseline. The same
//! catalogue runs on every adapter and on the CPU device. Also here: the softmax family on
//! extreme rows, where the GPU and the CPU device must both give PyTorch's answers.

use kiln::amp::GradScaler;
use kiln::data::{synthetic_glyphs, DataLoader, LoaderOptions};
use kiln::distributed::{ProcessGroup, ReduceOp};
use kiln::nn::{
    cross_entropy, load_safetensors, load_state_dict, mse_loss, save_safetensors, BatchNorm2d,
    Dropout, LayerNorm, Linear, Module,
};
use kiln::ops::Conv2dParams;
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::training::Checkpoint;
use kiln::{DType, Device, Error, Result, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

/// The variant's name: what a case's expected kind is written as.
fn kind(e: &Error) -> &'static str {
    match e {
        Error::OutOfMemory(_) => "OutOfMemory",
        Error::TooLarge { .. } => "TooLarge",
        Error::AllocConfig(_) => "AllocConfig",
        Error::InvalidPointer { .. } => "InvalidPointer",
        Error::DeviceMismatch { .. } => "DeviceMismatch",
        Error::ShapeMismatch { .. } => "ShapeMismatch",
        Error::DTypeMismatch { .. } => "DTypeMismatch",
        Error::UnsupportedDType { .. } => "UnsupportedDType",
        Error::IndexOutOfRange { .. } => "IndexOutOfRange",
        Error::InvalidArgument { .. } => "InvalidArgument",
        Error::NoSuchDevice { .. } => "NoSuchDevice",
        Error::RequestDevice { .. } => "RequestDevice",
        Error::Wgpu { .. } => "Wgpu",
        Error::DeviceLost { .. } => "DeviceLost",
        Error::DeviceAssert { .. } => "DeviceAssert",
        Error::Autograd { .. } => "Autograd",
        Error::ModifiedInplace { .. } => "ModifiedInplace",
        Error::Io { .. } => "Io",
        Error::InvalidFile { .. } => "InvalidFile",
        Error::Distributed { .. } => "Distributed",
        Error::DryRun { .. } => "DryRun",
        Error::GpuRequired => "GpuRequired",
    }
}

type Run = Box<dyn Fn(&Device, &Scratch) -> Result<()>>;

struct Case {
    name: &'static str,
    kind: &'static str,
    text: &'static str,
    run: Run,
    /// Only where the device is a GPU (device mismatch) or only on the CPU device.
    only: Only,
}

#[derive(PartialEq)]
enum Only {
    Any,
    Gpu,
    Cpu,
}

/// A directory for the file cases, with a good and a bad file in it.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("kiln-catalogue-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cpu = Device::cpu().unwrap();
        let t = Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0], &[2, 2], &cpu).unwrap();
        save_safetensors(&dir.join("good.safetensors"), &[("w".into(), t)]).unwrap();
        let good = std::fs::read(dir.join("good.safetensors")).unwrap();
        std::fs::write(dir.join("cut.safetensors"), &good[..good.len() - 3]).unwrap();
        Scratch { dir }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn f32s(d: &Device, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
    Tensor::from_slice(&v, shape, d).unwrap()
}

fn leaf(d: &Device, shape: &[usize]) -> Tensor {
    f32s(d, shape).requires_grad_(true).unwrap()
}

fn i32s(d: &Device, v: &[i32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], d).unwrap()
}

const BIG: usize = 1 << 32;

macro_rules! case {
    ($name:expr, $kind:expr, $text:expr, $run:expr) => {
        Case {
            name: $name,
            kind: $kind,
            text: $text,
            run: Box::new($run),
            only: Only::Any,
        }
    };
    ($name:expr, $kind:expr, $text:expr, $run:expr, gpu) => {
        Case {
            name: $name,
            kind: $kind,
            text: $text,
            run: Box::new($run),
            only: Only::Gpu,
        }
    };
    ($name:expr, $kind:expr, $text:expr, $run:expr, cpu) => {
        Case {
            name: $name,
            kind: $kind,
            text: $text,
            run: Box::new($run),
            only: Only::Cpu,
        }
    };
}

fn unit<T>(r: Result<T>) -> Result<()> {
    r.map(|_| ())
}

fn conv(stride: usize, padding: usize, groups: usize) -> Conv2dParams {
    Conv2dParams {
        stride: (stride, stride),
        padding: (padding, padding),
        dilation: (1, 1),
        groups,
    }
}

fn catalogue() -> Vec<Case> {
    vec![
        // ---- constructors and shape arithmetic ----
        case!(
            "zeros of 2^64 elements",
            "InvalidArgument",
            "Storage size calculation overflowed",
            |d, _| unit(Tensor::zeros(&[BIG, BIG], DType::F32, d))
        ),
        case!(
            "full of 2^64 elements",
            "InvalidArgument",
            "Storage size calculation overflowed",
            |d, _| unit(Tensor::full(&[BIG, BIG], 1.0, DType::F32, d))
        ),
        case!(
            "zeros whose bytes overflow",
            "InvalidArgument",
            "Storage size calculation overflowed",
            |d, _| unit(Tensor::zeros(&[1 << 62, 4], DType::F32, d))
        ),
        case!(
            "zeros with a zero dim beside an overflow",
            "InvalidArgument",
            "Storage size calculation overflowed",
            |d, _| unit(Tensor::zeros(&[0, BIG, BIG], DType::F32, d))
        ),
        case!(
            "from_slice with the wrong length",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(Tensor::from_slice(&[1f32, 2.0, 3.0], &[2, 2], d))
        ),
        case!(
            "from_le_bytes with the wrong length",
            "InvalidArgument",
            "",
            |d, _| unit(Tensor::from_le_bytes(&[0u8; 7], &[2], DType::F32, d))
        ),
        case!(
            "eye of 2^64 elements",
            "InvalidArgument",
            "overflow",
            |d, _| unit(Tensor::eye(BIG, BIG, DType::F32, d))
        ),
        case!(
            "view to another element count",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).view(&[4, 2]))
        ),
        case!(
            "view with two -1",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).view(&[-1, -1]))
        ),
        case!(
            "view with a size below -1",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).view(&[-2, -3]))
        ),
        case!(
            "reshape whose sizes overflow",
            "InvalidArgument",
            "numel: integer multiplication overflow",
            |d, _| unit(f32s(d, &[0]).reshape(&[1 << 40, 1 << 40, 0]))
        ),
        case!(
            "expand whose element count overflows",
            "InvalidArgument",
            "numel: integer multiplication overflow",
            |d, _| unit(f32s(d, &[1, 1]).expand(&[BIG, BIG]))
        ),
        case!(
            "expand to a shape that does not fit",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).expand(&[4, 3]))
        ),
        case!(
            "broadcast whose result overflows",
            "InvalidArgument",
            "numel: integer multiplication overflow",
            |d, _| {
                let a = f32s(d, &[1, 1]).expand(&[BIG, 1])?;
                let b = f32s(d, &[1, 1]).expand(&[1, BIG])?;
                unit(a.add(&b))
            }
        ),
        case!(
            "add of shapes that do not broadcast",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).add(&f32s(d, &[4])))
        ),
        case!(
            "narrow past the end",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[4]).narrow(0, 2, 3))
        ),
        case!(
            "narrow whose end overflows",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[4]).narrow(0, usize::MAX, 2))
        ),
        case!(
            "narrow of the overflowing tensor",
            "InvalidArgument",
            "overflow",
            |d, _| unit(Tensor::zeros(&[BIG, BIG], DType::F32, d).and_then(|t| t.narrow(0, 0, 1)))
        ),
        case!(
            "cat of an empty list",
            "InvalidArgument",
            "non-empty",
            |_, _| unit(Tensor::cat(&[], 0))
        ),
        case!(
            "cat of mismatched shapes",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(Tensor::cat(&[f32s(d, &[2, 3]), f32s(d, &[2, 4])], 0))
        ),
        case!(
            "cat of mixed dtypes",
            "DTypeMismatch",
            "expected dtype",
            |d, _| unit(Tensor::cat(&[f32s(d, &[2]), i32s(d, &[1, 2])], 0))
        ),
        case!(
            "cat whose size overflows",
            "InvalidArgument",
            "overflow",
            |d, _| {
                let t = f32s(d, &[1]).expand(&[1 << 62])?;
                unit(Tensor::cat(&[t.clone(), t.clone(), t.clone(), t], 0))
            }
        ),
        case!(
            "stack of mismatched shapes",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(Tensor::stack(&[f32s(d, &[2]), f32s(d, &[3])], 0))
        ),
        case!(
            "split of size 0",
            "InvalidArgument",
            "split size",
            |d, _| unit(f32s(d, &[4]).split(0, 0))
        ),
        case!("chunk into 0", "InvalidArgument", "chunk", |d, _| unit(
            f32s(d, &[4]).chunk(0, 0)
        )),
        case!(
            "matmul of mismatched inner dims",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(f32s(d, &[2, 3]).matmul(&f32s(d, &[4, 2])))
        ),
        case!(
            "matmul of mixed dtypes",
            "DTypeMismatch",
            "expected dtype",
            |d, _| unit(f32s(d, &[2, 2]).matmul(&Tensor::zeros(&[2, 2], DType::I32, d)?))
        ),
        case!(
            "matmul whose batch overflows",
            "InvalidArgument",
            "overflow",
            |d, _| {
                let a = f32s(d, &[1, 1, 1, 1]).expand(&[BIG, 1, 1, 1])?;
                let b = f32s(d, &[1, 1, 1, 1]).expand(&[1, BIG, 1, 1])?;
                unit(a.matmul(&b))
            }
        ),
        case!(
            "matmul across devices",
            "DeviceMismatch",
            "expected a tensor on",
            |d, _| unit(f32s(d, &[2, 2]).matmul(&f32s(&Device::cpu()?, &[2, 2]))),
            gpu
        ),
        case!(
            "add across devices",
            "DeviceMismatch",
            "expected a tensor on",
            |d, _| unit(f32s(d, &[2]).add(&f32s(&Device::cpu()?, &[2]))),
            gpu
        ),
        // ---- dim lists ----
        case!(
            "sum over dims [0, 0]",
            "InvalidArgument",
            "dim 0 appears multiple times in the list of dims",
            |d, _| unit(f32s(d, &[2, 3]).sum(&[0, 0], false))
        ),
        case!(
            "sum over dims [1, -1]",
            "InvalidArgument",
            "dim 1 appears multiple times in the list of dims",
            |d, _| unit(f32s(d, &[2, 3]).sum(&[1, -1], false))
        ),
        case!(
            "mean over an out-of-range dim",
            "IndexOutOfRange",
            "dim 2 out of range",
            |d, _| unit(f32s(d, &[2, 3]).mean(&[2], false))
        ),
        case!(
            "amax over dims [-1, 1]",
            "InvalidArgument",
            "appears multiple times",
            |d, _| unit(f32s(d, &[2, 3]).amax(&[-1, 1], false))
        ),
        case!(
            "prod over dim -3 of a matrix",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 3]).prod(&[-3], false))
        ),
        case!(
            "var over dims [0, 0]",
            "InvalidArgument",
            "appears multiple times",
            |d, _| unit(f32s(d, &[2, 3]).var(&[0, 0], 1, false))
        ),
        case!(
            "argmax over an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 3]).argmax(5, false))
        ),
        case!(
            "permute with a repeated dim",
            "InvalidArgument",
            "duplicate dims are not allowed",
            |d, _| unit(f32s(d, &[2, 3]).permute(&[0, 0]))
        ),
        case!(
            "permute with a repeated negative dim",
            "InvalidArgument",
            "duplicate dims are not allowed",
            |d, _| unit(f32s(d, &[2, 3]).permute(&[1, -1]))
        ),
        case!(
            "permute of the wrong length",
            "InvalidArgument",
            "dims for a tensor of rank",
            |d, _| unit(f32s(d, &[2, 3]).permute(&[0]))
        ),
        case!(
            "transpose of an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 3]).transpose(0, 2))
        ),
        case!(
            "softmax over an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 3]).softmax(2))
        ),
        case!(
            "log_softmax of integers",
            "UnsupportedDType",
            "log_softmax",
            |d, _| unit(i32s(d, &[1, 2]).log_softmax(0))
        ),
        case!(
            "squeeze of an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 1]).squeeze(Some(2)))
        ),
        case!(
            "unsqueeze of an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 1]).unsqueeze(4))
        ),
        case!(
            "flatten with start after end",
            "InvalidArgument",
            "start_dim (1) cannot come after end_dim (0)",
            |d, _| unit(f32s(d, &[2, 3]).flatten(1, 0))
        ),
        case!(
            "cat along an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(Tensor::cat(&[f32s(d, &[2]), f32s(d, &[2])], 1))
        ),
        case!(
            "gather along an out-of-range dim",
            "IndexOutOfRange",
            "out of range",
            |d, _| unit(f32s(d, &[2, 3]).gather(2, &Tensor::zeros(&[2, 3], DType::I32, d)?))
        ),
        case!(
            "index_select with float indices",
            "DTypeMismatch",
            "expected dtype",
            |d, _| unit(f32s(d, &[2, 3]).index_select(0, &f32s(d, &[1])))
        ),
        case!(
            "embedding with float ids",
            "DTypeMismatch",
            "expected dtype",
            |d, _| unit(kiln::ops::embedding(&f32s(d, &[4, 2]), &f32s(d, &[2])))
        ),
        // ---- convolution and pooling ----
        case!(
            "conv2d of a 3-D input",
            "InvalidArgument",
            "expected a 4-D",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 4, 4]),
                &f32s(d, &[1, 1, 3, 3]),
                None,
                conv(1, 0, 1)
            ))
        ),
        case!(
            "conv2d with groups that do not divide",
            "InvalidArgument",
            "groups",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 3, 4, 4]),
                &f32s(d, &[2, 3, 3, 3]),
                None,
                conv(1, 0, 2)
            ))
        ),
        case!(
            "conv2d with stride 0",
            "InvalidArgument",
            "stride and dilation must be positive",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 1, 4, 4]),
                &f32s(d, &[1, 1, 3, 3]),
                None,
                conv(0, 0, 1)
            ))
        ),
        case!(
            "conv2d with a kernel larger than the input",
            "InvalidArgument",
            "",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 1, 2, 2]),
                &f32s(d, &[1, 1, 3, 3]),
                None,
                conv(1, 0, 1)
            ))
        ),
        case!(
            "conv2d whose padding overflows",
            "InvalidArgument",
            "",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 1, 4, 4]),
                &f32s(d, &[1, 1, 3, 3]),
                None,
                conv(1, usize::MAX / 2 + 1, 1)
            ))
        ),
        case!(
            "conv2d with a bias of the wrong size",
            "ShapeMismatch",
            "do not match",
            |d, _| unit(kiln::ops::conv2d(
                &f32s(d, &[1, 1, 4, 4]),
                &f32s(d, &[2, 1, 3, 3]),
                Some(&f32s(d, &[3])),
                conv(1, 0, 1)
            ))
        ),
        case!(
            "max_pool2d with kernel 0",
            "InvalidArgument",
            "kernel and stride must be positive",
            |d, _| unit(kiln::ops::max_pool2d(
                &f32s(d, &[1, 1, 4, 4]),
                (0, 0),
                (1, 1),
                (0, 0)
            ))
        ),
        case!(
            "max_pool2d with padding over half the kernel",
            "InvalidArgument",
            "pad should be at most half",
            |d, _| unit(kiln::ops::max_pool2d(
                &f32s(d, &[1, 1, 4, 4]),
                (2, 2),
                (1, 1),
                (2, 2)
            ))
        ),
        case!(
            "avg_pool2d with huge padding",
            "InvalidArgument",
            "pad should be at most half",
            |d, _| unit(kiln::ops::avg_pool2d(
                &f32s(d, &[1, 1, 4, 4]),
                (2, 2),
                (1, 1),
                (usize::MAX, 0)
            ))
        ),
        // ---- autograd and in-place ----
        case!(
            "in-place add on a leaf that requires grad",
            "Autograd",
            "a leaf Variable that requires grad is being used in an in-place operation",
            |d, _| leaf(d, &[2]).add_(&f32s(d, &[2]))
        ),
        case!(
            "in-place add that would broadcast the target",
            "ShapeMismatch",
            "",
            |d, _| f32s(d, &[1, 3]).add_(&f32s(d, &[2, 3]))
        ),
        case!(
            "backward of a non-scalar",
            "Autograd",
            "grad can be implicitly created only for scalar outputs",
            |d, _| leaf(d, &[2]).mul_scalar(2.0)?.backward()
        ),
        case!(
            "backward twice through a freed graph",
            "Autograd",
            "Trying to backward through the graph a second time",
            |d, _| {
                let y = leaf(d, &[2]).exp()?.sum_all()?;
                y.backward()?;
                y.backward()
            }
        ),
        case!(
            "backward of a tensor that does not require grad",
            "Autograd",
            "does not require grad",
            |d, _| f32s(d, &[2]).sum_all()?.backward()
        ),
        case!(
            "item of a multi-element tensor",
            "InvalidArgument",
            "",
            |d, _| unit(f32s(d, &[2]).item::<f32>())
        ),
        case!(
            "to_vec as the wrong dtype",
            "DTypeMismatch",
            "expected dtype",
            |d, _| unit(f32s(d, &[2]).to_vec::<i32>())
        ),
        // ---- nn ----
        case!(
            "Linear on the wrong feature count",
            "ShapeMismatch",
            "",
            |d, _| unit(Linear::new(4, 2, true, d)?.forward(&f32s(d, &[3, 5])))
        ),
        case!(
            "Dropout with p = 1",
            "InvalidArgument",
            "dropout probability has to be in [0, 1)",
            |_, _| unit(Dropout::new(1.0))
        ),
        case!(
            "cross_entropy with float targets",
            "DTypeMismatch",
            "",
            |d, _| unit(cross_entropy(&f32s(d, &[2, 3]), &f32s(d, &[2])))
        ),
        case!(
            "cross_entropy with a target per class",
            "ShapeMismatch",
            "",
            |d, _| unit(cross_entropy(&f32s(d, &[2, 3]), &i32s(d, &[0, 1, 2])))
        ),
        case!(
            "mse_loss of mismatched shapes",
            "ShapeMismatch",
            "",
            |d, _| unit(mse_loss(&f32s(d, &[2, 3]), &f32s(d, &[3, 2])))
        ),
        case!(
            "BatchNorm2d on the wrong channel count",
            "ShapeMismatch",
            "",
            |d, _| unit(BatchNorm2d::new(3, d)?.forward(&f32s(d, &[2, 4, 2, 2])))
        ),
        case!(
            "LayerNorm on the wrong last dim",
            "ShapeMismatch",
            "",
            |d, _| unit(LayerNorm::new(4, d)?.forward(&f32s(d, &[2, 3])))
        ),
        case!(
            "load_state_dict with a missing key",
            "InvalidArgument",
            "missing keys",
            |d, _| {
                let mut l = Linear::new(2, 2, true, d)?;
                load_state_dict(&mut l, &[("weight".into(), f32s(d, &[2, 2]))])
            }
        ),
        case!(
            "load_state_dict with a wrong shape",
            "InvalidArgument",
            "size mismatch for weight",
            |d, _| {
                let mut l = Linear::new(2, 2, true, d)?;
                load_state_dict(
                    &mut l,
                    &[
                        ("weight".into(), f32s(d, &[3, 2])),
                        ("bias".into(), f32s(d, &[2])),
                    ],
                )
            }
        ),
        case!(
            "DataLoader with batch size 0",
            "InvalidArgument",
            "batch_size",
            |d, _| unit(DataLoader::new(
                Arc::new(synthetic_glyphs(4, 1)),
                d,
                LoaderOptions {
                    batch_size: 0,
                    ..Default::default()
                }
            ))
        ),
        // ---- optim ----
        case!(
            "SGD with a negative lr",
            "InvalidArgument",
            "Invalid learning rate: -1.0",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], -1.0))
        ),
        case!(
            "SGD with a NaN lr",
            "InvalidArgument",
            "Invalid learning rate: NaN",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], f64::NAN))
        ),
        case!(
            "SGD with an infinite lr",
            "InvalidArgument",
            "Invalid learning rate: inf",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], f64::INFINITY))
        ),
        case!(
            "SGD with negative momentum",
            "InvalidArgument",
            "Invalid momentum value: -0.5",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], 0.1)?.momentum(-0.5))
        ),
        case!(
            "SGD with negative weight decay",
            "InvalidArgument",
            "Invalid weight_decay value: -0.1",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], 0.1)?.weight_decay(-0.1))
        ),
        case!(
            "SGD nesterov without momentum",
            "InvalidArgument",
            "Nesterov momentum requires a momentum and zero dampening",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], 0.1)?.nesterov(true))
        ),
        case!(
            "SGD nesterov with dampening",
            "InvalidArgument",
            "Nesterov momentum requires a momentum and zero dampening",
            |d, _| unit(
                Sgd::new(vec![leaf(d, &[2])], 0.1)?
                    .momentum(0.9)?
                    .nesterov(true)?
                    .dampening(0.1)
            )
        ),
        case!(
            "SGD with a NaN dampening",
            "InvalidArgument",
            "Invalid dampening value: NaN",
            |d, _| unit(Sgd::new(vec![leaf(d, &[2])], 0.1)?.dampening(f64::NAN))
        ),
        case!(
            "SGD whose lr turned negative before a step",
            "InvalidArgument",
            "Invalid learning rate: -0.1",
            |d, _| {
                let p = leaf(d, &[2]);
                p.sum_all()?.backward()?;
                let mut opt = Sgd::new(vec![p.clone()], 0.1)?;
                opt.lr = -0.1;
                let before = p.to_vec::<f32>()?;
                let r = opt.step();
                assert_eq!(
                    p.to_vec::<f32>()?,
                    before,
                    "a refused step changed the parameter"
                );
                r
            }
        ),
        case!(
            "SGD of a tensor that does not require grad",
            "InvalidArgument",
            "can't optimize a non-leaf Tensor",
            |d, _| unit(Sgd::new(vec![f32s(d, &[2])], 0.1))
        ),
        case!(
            "Adam with beta1 = 1",
            "InvalidArgument",
            "Invalid beta parameter at index 0: 1.0",
            |d, _| unit(Adam::new(vec![leaf(d, &[2])], 0.1)?.betas(1.0, 0.999))
        ),
        case!(
            "Adam with a negative beta2",
            "InvalidArgument",
            "Invalid beta parameter at index 1: -0.1",
            |d, _| unit(Adam::new(vec![leaf(d, &[2])], 0.1)?.betas(0.9, -0.1))
        ),
        case!(
            "Adam with a negative eps",
            "InvalidArgument",
            "Invalid epsilon value: -1e-8",
            |d, _| unit(Adam::new(vec![leaf(d, &[2])], 0.1)?.eps(-1e-8))
        ),
        case!(
            "Adam with a negative lr",
            "InvalidArgument",
            "Invalid learning rate: -0.001",
            |d, _| unit(Adam::new(vec![leaf(d, &[2])], -1e-3))
        ),
        case!(
            "AdamW with a NaN weight decay",
            "InvalidArgument",
            "Invalid weight_decay value: NaN",
            |d, _| unit(Adam::adamw(vec![leaf(d, &[2])], 1e-3)?.weight_decay(f64::NAN))
        ),
        case!(
            "Adam whose betas changed before a step",
            "InvalidArgument",
            "Invalid beta parameter at index 1: 1.5",
            |d, _| {
                let p = leaf(d, &[2]);
                p.sum_all()?.backward()?;
                let mut opt = Adam::new(vec![p.clone()], 0.1)?;
                opt.betas = (0.9, 1.5);
                opt.step()
            }
        ),
        case!(
            "GradScaler with growth below 1",
            "InvalidArgument",
            "The growth factor must be > 1.0.",
            |_, _| unit(GradScaler::with_options(65536.0, 0.5, 0.5, 2000, true))
        ),
        case!(
            "GradScaler step before scale",
            "InvalidArgument",
            "",
            |d, _| {
                let p = leaf(d, &[2]);
                p.sum_all()?.backward()?;
                let mut opt = Sgd::new(vec![p], 0.1)?;
                unit(GradScaler::new().step(&mut opt))
            }
        ),
        // ---- files ----
        case!("load_safetensors of a missing file", "Io", "", |d, s| unit(
            load_safetensors(&s.path("missing.safetensors"), d)
        )),
        case!(
            "load_safetensors of a truncated file",
            "InvalidFile",
            "",
            |d, s| unit(load_safetensors(&s.path("cut.safetensors"), d))
        ),
        case!(
            "save_safetensors into a missing directory",
            "Io",
            "",
            |d, s| save_safetensors(
                &s.path("no/such/dir.safetensors"),
                &[("w".into(), f32s(d, &[2]))]
            )
        ),
        case!(
            "save_safetensors with a name used twice",
            "InvalidArgument",
            "used twice",
            |d, s| save_safetensors(
                &s.path("twice.safetensors"),
                &[("w".into(), f32s(d, &[2])), ("w".into(), f32s(d, &[2]))]
            )
        ),
        case!(
            "a checkpoint load of a plain state dict",
            "InvalidFile",
            "not a kiln training checkpoint",
            |_, s| Checkpoint::default().load(s.path("good.safetensors"))
        ),
        case!(
            "an optimizer load of another optimizer's state",
            "InvalidArgument",
            "the state dict is of a SGD optimizer, this one is Adam",
            |d, _| {
                let p = leaf(d, &[2]);
                let sgd = Sgd::new(vec![p.clone()], 0.1)?;
                Adam::new(vec![p], 0.1)?.load_state_dict(&sgd.state_dict())
            }
        ),
        case!("dump_snapshot onto a directory", "Io", "", |d, s| d
            .dump_snapshot(&s.dir)),
        // ---- allocator ----
        case!(
            "an allocation over the memory limit",
            "OutOfMemory",
            "Tried to allocate",
            |d, _| {
                d.set_memory_limit(Some(64 << 20));
                let r = unit(Tensor::zeros(&[32 << 20], DType::F32, d));
                d.set_memory_limit(None);
                r
            }
        ),
        // 256 TiB: more than x86-64's user address space, so the host refuses it whatever the
        // overcommit policy; the CPU device reports PyTorch's OOM instead of aborting.
        case!(
            "a CPU tensor larger than the address space",
            "OutOfMemory",
            "Tried to allocate 262144.00 GiB",
            |d, _| unit(Tensor::zeros(&[1 << 46], DType::F32, d)),
            cpu
        ),
        case!(
            "an allocation of more than an exabyte",
            "OutOfMemory",
            "more than 1EB",
            |d, _| unit(d.allocate(1 << 62))
        ),
        case!(
            "a memory fraction above 1",
            "InvalidArgument",
            "",
            |d, _| {
                let r = d.set_per_process_memory_fraction(1.5);
                d.set_memory_limit(None);
                r
            }
        ),
        case!(
            "an allocator setting that does not parse",
            "AllocConfig",
            "",
            |d, _| d.set_allocator_settings("max_split_size_mb:abc")
        ),
        case!(
            "a broadcast from a rank outside the group",
            "InvalidArgument",
            "Invalid rank 1",
            |d, _| group().broadcast(&f32s(d, &[4]), 1)
        ),
        case!(
            "an all_reduce of a non-contiguous tensor",
            "InvalidArgument",
            "Tensors must be contiguous",
            |d, _| group().all_reduce(&f32s(d, &[2, 3]).transpose(0, 1)?, ReduceOp::Sum)
        ),
        case!(
            "an average of integers across ranks",
            "UnsupportedDType",
            "ReduceOp::Avg",
            |d, _| group().all_reduce(&i32s(d, &[1, 2]), ReduceOp::Avg)
        ),
    ]
}

/// This process's group (of one: no mpirun here).
fn group() -> &'static ProcessGroup {
    static PG: std::sync::OnceLock<ProcessGroup> = std::sync::OnceLock::new();
    PG.get_or_init(|| kiln::distributed::init_process_group().unwrap())
}

#[test]
fn every_bad_input_in_the_catalogue_is_a_clean_typed_error() {
    let scratch = Scratch::new();
    let cases = catalogue();
    assert!(cases.len() >= 60, "the catalogue has {} cases", cases.len());
    let mut failures = Vec::new();
    let mut tried = 0;
    for device in kiln::device::test_devices().unwrap() {
        let witness_values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let witness = Tensor::from_slice(&witness_values, &[1000], &device).unwrap();
        for case in &cases {
            if (case.only == Only::Gpu && device.is_cpu())
                || (case.only == Only::Cpu && !device.is_cpu())
            {
                continue;
            }
            tried += 1;
            device.synchronize().unwrap();
            let baseline = device.memory_allocated();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (case.run)(&device, &scratch)
            }));
            let mut fail =
                |why: String| failures.push(format!("[{}] {}: {why}", device.spec(), case.name));
            match outcome {
                Err(_) => fail("panicked".into()),
                Ok(Ok(())) => fail("was accepted".into()),
                Ok(Err(e)) => {
                    if kind(&e) != case.kind {
                        fail(format!("{} instead of {}: {e}", kind(&e), case.kind));
                    } else if !e.to_string().contains(case.text) {
                        fail(format!("text {:?} lacks {:?}", e.to_string(), case.text));
                    }
                }
            }
            if let Err(e) = device.synchronize() {
                failures.push(format!(
                    "[{}] {}: the device is not usable after it: {e}",
                    device.spec(),
                    case.name
                ));
            }
            let after = device.memory_allocated();
            if after != baseline {
                failures.push(format!(
                    "[{}] {}: memory_allocated {baseline} before, {after} after",
                    device.spec(),
                    case.name
                ));
            }
            if witness.to_vec::<f32>().unwrap() != witness_values {
                failures.push(format!(
                    "[{}] {}: the witness tensor changed",
                    device.spec(),
                    case.name
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch.dir);
    eprintln!(
        "catalogue: {} cases, {tried} tried across devices, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {tried} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Per element, PyTorch's value (None: NaN).
type Expected = Vec<Option<f32>>;

/// Rows PyTorch answers in a particular way: all -inf (NaN), huge finite magnitudes (exactly
/// uniform), +inf or NaN present (NaN), a single -inf (0 there), in f32 and in f16.
#[test]
fn the_softmax_family_matches_pytorch_on_extreme_rows() {
    let inf = f32::INFINITY;
    let n = 6usize;
    // (row, softmax expected, log_softmax expected); None: NaN.
    let uniform = 1.0 / n as f32;
    let log_uniform = -(n as f32).ln();
    let rows: Vec<(Vec<f32>, Expected, Expected)> = vec![
        (vec![-inf; n], vec![None; n], vec![None; n]),
        (
            vec![-3.3e38; n],
            vec![Some(uniform); n],
            vec![Some(log_uniform); n],
        ),
        (
            vec![3.3e38; n],
            vec![Some(uniform); n],
            vec![Some(log_uniform); n],
        ),
        (
            vec![1.0, inf, 2.0, 3.0, 4.0, 5.0],
            vec![None; n],
            vec![None; n],
        ),
        (
            vec![1.0, f32::NAN, 2.0, 3.0, 4.0, 5.0],
            vec![None; n],
            vec![None; n],
        ),
        (
            vec![-inf, 0.0, 0.0, -inf, 0.0, 0.0],
            vec![
                Some(0.0),
                Some(0.25),
                Some(0.25),
                Some(0.0),
                Some(0.25),
                Some(0.25),
            ],
            vec![
                Some(-inf),
                Some(-(4f32).ln()),
                Some(-(4f32).ln()),
                Some(-inf),
                Some(-(4f32).ln()),
                Some(-(4f32).ln()),
            ],
        ),
    ];
    for device in kiln::device::test_devices().unwrap() {
        // cross_entropy goes through log_softmax: a huge finite row costs exactly ln(n), an
        // all -inf row is NaN, as in PyTorch.
        for (value, want) in [(-3.3e38f32, Some((n as f32).ln())), (-inf, None)] {
            let logits = Tensor::from_slice(&vec![value; n], &[1, n], &device).unwrap();
            let target = Tensor::from_slice(&[2i32], &[1], &device).unwrap();
            let loss = cross_entropy(&logits, &target)
                .unwrap()
                .item::<f32>()
                .unwrap();
            match want {
                Some(w) => assert!(
                    (loss - w).abs() < 1e-6,
                    "{}: cross_entropy {loss}, want {w}",
                    device.spec()
                ),
                None => assert!(
                    loss.is_nan(),
                    "{}: cross_entropy {loss}, want NaN",
                    device.spec()
                ),
            }
        }
        for dtype in [DType::F32, DType::F16] {
            let has_f16 = device.adapter_info().is_none_or(|i| i.features.shader_f16);
            if dtype == DType::F16 && !has_f16 {
                continue;
            }
            // Rows of 6 (the strided kernel) and the same rows padded to 8 with -inf (two whole
            // vec4s: the vector kernel); -inf lanes change nothing in the first 6.
            for (row, soft, log) in &rows {
                let f16_huge = dtype == DType::F16 && row[1].abs() > 1e30 && row[1].is_finite();
                let row: Vec<f32> = if f16_huge {
                    row.iter().map(|&x| x.signum() * 65504.0).collect()
                } else {
                    row.clone()
                };
                for width in [n, 8] {
                    let mut padded = row.clone();
                    padded.resize(width, -inf);
                    let x = Tensor::from_f64_slice(
                        &padded.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                        &[1, width],
                        dtype,
                        &device,
                    )
                    .unwrap();
                    for (log_form, want) in [(false, soft), (true, log)] {
                        let y = if log_form {
                            x.log_softmax(-1)
                        } else {
                            x.softmax(-1)
                        }
                        .unwrap();
                        let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                        for j in 0..n {
                            let ok = match want[j] {
                                None => got[j].is_nan(),
                                // Padding to 8 with -inf changes nothing but the extra lanes.
                                Some(w) => {
                                    let tol = if dtype == DType::F16 { 2e-3 } else { 1e-6 };
                                    (got[j] == w) || (got[j] - w).abs() <= tol * w.abs().max(1.0)
                                }
                            };
                            assert!(
                                ok,
                                "{} {dtype} {}softmax of {row:?} (width {width}): element {j} is {}, PyTorch gives {:?}",
                                device.spec(),
                                if log_form { "log_" } else { "" },
                                got[j],
                                want[j]
                            );
                        }
                    }
                }
            }
        }
    }
}
