//! Adapter discovery: every adapter wgpu finds, with the features and limits kiln uses.

use std::sync::OnceLock;

/// The optional features kiln cares about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KilnFeatures {
    /// 16-bit floats in shaders (`shader-f16`).
    pub shader_f16: bool,
    /// Timestamp queries around passes.
    pub timestamp_query: bool,
    /// Timestamp queries inside compute passes (per-kernel times).
    pub timestamp_query_inside_passes: bool,
    /// Subgroup operations.
    pub subgroups: bool,
    /// Immediates (push constants): kiln's per-dispatch parameters.
    pub immediates: bool,
    /// Cooperative matrices (tensor cores).
    pub cooperative_matrix: bool,
    /// Vulkan sparse buffer binding (sparseBinding and sparseResidencyBuffer): what
    /// `expandable_segments:True` maps pages with.
    pub sparse_binding: bool,
    /// 64-bit integers in shaders: the reduction that loads 32-byte words (`serial_wide`).
    pub shader_int64: bool,
}

impl KilnFeatures {
    pub(crate) fn of(f: wgpu::Features) -> Self {
        KilnFeatures {
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamp_query_inside_passes: f
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            immediates: f.contains(wgpu::Features::IMMEDIATES),
            cooperative_matrix: f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            sparse_binding: false,
            shader_int64: f.contains(wgpu::Features::SHADER_INT64),
        }
    }

    /// The wgpu features kiln requests when the adapter has them. Cooperative matrix is
    /// experimental in wgpu 30 and is requested only by the kernels that need it (a later issue).
    pub(crate) fn requested(available: wgpu::Features) -> wgpu::Features {
        available
            & (wgpu::Features::SHADER_F16
                | wgpu::Features::TIMESTAMP_QUERY
                | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
                | wgpu::Features::SUBGROUP
                | wgpu::Features::IMMEDIATES
                | wgpu::Features::SHADER_INT64)
    }
}

/// The limits that bound kiln's segments, bindings and dispatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KilnLimits {
    /// The largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// The largest storage binding, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// The alignment of a storage binding's offset, in bytes.
    pub min_storage_buffer_offset_alignment: u32,
    /// Storage buffers a shader may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Bytes of immediates a pipeline may take.
    pub max_immediate_size: u32,
    /// Workgroups a dispatch may have along each dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Invocations a workgroup may have.
    pub max_compute_invocations_per_workgroup: u32,
    /// Bytes of workgroup memory a workgroup may have.
    pub max_compute_workgroup_storage_size: u32,
}

impl KilnLimits {
    pub(crate) fn of(l: &wgpu::Limits) -> Self {
        KilnLimits {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_immediate_size: l.max_immediate_size,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        }
    }
}

/// One adapter as `kiln::adapters()` lists it.
#[derive(Clone, Debug)]
pub struct AdapterInfo {
    /// `vulkan:0`, `gl:0`, ...: what `KILN_DEVICE` and `Device::from_spec` accept.
    pub spec: String,
    /// The adapter's name, as the driver gives it.
    pub name: String,
    /// Vulkan, Metal, DX12 or GL.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, virtual, CPU (software) or other.
    pub device_type: wgpu::DeviceType,
    /// The driver's name.
    pub driver: String,
    /// The driver's version string.
    pub driver_info: String,
    /// What kiln uses of the adapter's features.
    pub features: KilnFeatures,
    /// The limits kiln asks for.
    pub limits: KilnLimits,
    /// Device-local memory, where the backend reports it (Vulkan heaps).
    pub memory_bytes: Option<u64>,
}

impl AdapterInfo {
    /// Preference of `Device::best()`: discrete, integrated, virtual, software, other.
    pub(crate) fn rank(&self) -> (u8, u8) {
        let ty = match self.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Cpu => 3,
            wgpu::DeviceType::Other => 4,
        };
        let backend = match self.backend {
            wgpu::Backend::Vulkan => 0,
            wgpu::Backend::Metal => 1,
            wgpu::Backend::Dx12 => 2,
            _ => 3,
        };
        (ty, backend)
    }
}

pub(crate) fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        wgpu::Backend::Noop => "noop",
    }
}

/// The process's one wgpu instance. Validation follows wgpu's defaults for the build profile
/// unless `WGPU_VALIDATION` and friends say otherwise.
pub(crate) fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN
            | wgpu::Backends::METAL
            | wgpu::Backends::DX12
            | wgpu::Backends::GL;
        // WGPU_BACKEND, WGPU_VALIDATION, ... override the above.
        wgpu::Instance::new(desc.with_env())
    })
}

/// Every adapter with its spec, in wgpu's enumeration order.
pub(crate) fn enumerate() -> Vec<(AdapterInfo, wgpu::Adapter)> {
    static ADAPTERS: OnceLock<Vec<(AdapterInfo, wgpu::Adapter)>> = OnceLock::new();
    ADAPTERS
        .get_or_init(|| {
            let adapters = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
            let mut per_backend: std::collections::HashMap<wgpu::Backend, usize> =
                Default::default();
            adapters
                .into_iter()
                .map(|a| {
                    let info = a.get_info();
                    let n = per_backend.entry(info.backend).or_default();
                    let spec = format!("{}:{n}", backend_name(info.backend));
                    *n += 1;
                    let memory_bytes = super::memory::device_memory(&a).and_then(|m| m.total);
                    let kiln = AdapterInfo {
                        spec,
                        name: info.name,
                        backend: info.backend,
                        device_type: info.device_type,
                        driver: info.driver,
                        driver_info: info.driver_info,
                        features: KilnFeatures {
                            #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
                            sparse_binding: super::sparse::supported(&a),
                            ..KilnFeatures::of(a.features())
                        },
                        limits: KilnLimits::of(&a.limits()),
                        memory_bytes,
                    };
                    (kiln, a)
                })
                .collect()
        })
        .clone()
}

/// The GPU an adapter drives, from its name: GL appends the renderer's extras
/// (`NVIDIA H100 80GB HBM3/PCIe/SSE2`), which Vulkan does not.
pub(crate) fn gpu_name(name: &str) -> &str {
    name.split('/').next().unwrap_or(name).trim()
}

/// Lists every adapter wgpu finds (software ones such as lavapipe included).
pub fn adapters() -> Vec<AdapterInfo> {
    enumerate().into_iter().map(|(info, _)| info).collect()
}
