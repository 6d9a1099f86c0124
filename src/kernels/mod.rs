//! The shader registry: every WGSL kernel, reached by a typed id, with its pipeline and
//! bind-group layout created once per device and cached. One launch path encodes every dispatch.

use std::collections::HashMap;

/// Every kernel kiln has. Adding one means adding its file to `shaders/` and a row here; the
/// `every_kernel_validates` test compiles each with naga.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Fill 32-bit words with a value (immediates: len_words, value).
    Fill,
}

/// Workgroup size shared by the 1-D kernels.
pub const WORKGROUP: u32 = 256;

impl Kernel {
    pub const ALL: &'static [Kernel] = &[Kernel::Fill];

    pub fn source(self) -> &'static str {
        match self {
            Kernel::Fill => include_str!("../../shaders/fill.wgsl"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fill => "fill",
        }
    }

    /// Storage buffers the kernel binds, in binding order.
    fn bindings(self) -> u32 {
        match self {
            Kernel::Fill => 1,
        }
    }

    /// Bytes of immediates.
    pub fn immediate_size(self) -> u32 {
        match self {
            Kernel::Fill => 8,
        }
    }
}

/// Parses and validates a kernel's WGSL with naga, as wgpu will.
pub fn validate(kernel: Kernel) -> Result<naga::valid::ModuleInfo, String> {
    let module = naga::front::wgsl::parse_str(kernel.source())
        .map_err(|e| e.emit_to_string(kernel.source()))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{}: {e:?}", kernel.name()))
}

pub(crate) struct Compiled {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// Pipelines and layouts of one device, created on first use.
#[derive(Default)]
pub(crate) struct KernelCache {
    compiled: HashMap<Kernel, std::sync::Arc<Compiled>>,
}

impl KernelCache {
    pub fn get(&mut self, device: &wgpu::Device, kernel: Kernel) -> std::sync::Arc<Compiled> {
        self.compiled
            .entry(kernel)
            .or_insert_with(|| std::sync::Arc::new(compile(device, kernel)))
            .clone()
    }
}

fn compile(device: &wgpu::Device, kernel: Kernel) -> Compiled {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..kernel.bindings())
        .map(|binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                // read_write everywhere: tensors sub-allocated from one segment may meet in one
                // dispatch, and wgpu refuses read + read_write ranges of one buffer.
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(kernel.name()),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(kernel.name()),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: kernel.immediate_size(),
    });
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(kernel.name()),
        source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(kernel.name()),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    Compiled { pipeline, layout }
}

/// A dispatch grid for `n` invocations of `WORKGROUP` threads: x up to the per-dimension limit,
/// the rest in y (the shader folds them back with `num_workgroups`).
pub(crate) fn grid(n: u64, max_per_dim: u32) -> (u32, u32) {
    let groups = n.div_ceil(WORKGROUP as u64).max(1);
    let x = groups.min(max_per_dim as u64);
    let y = groups.div_ceil(x);
    (x as u32, y as u32)
}
