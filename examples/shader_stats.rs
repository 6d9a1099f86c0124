//! What the Vulkan driver made of kiln's kernels: registers, shared memory, spills, as the
//! driver reports them through `VK_KHR_pipeline_executable_properties` (NVIDIA, RADV and
//! lavapipe implement it). wgpu gives no way to ask, so this example compiles each kernel
//! itself, the way wgpu-hal does (naga's SPIR-V writer with the options wgpu uses for a trusted
//! module on a Vulkan 1.3 device), into a pipeline of its own.
//!
//! `cargo run --release --example shader_stats -- [SUBSTRING...]` prints every kernel whose
//! name contains one of the substrings (all kernels without any). `KILN_STATS_ADAPTER=nvidia`
//! picks the adapter by name; `KILN_STATS_IR=DIR` also writes the driver's internal
//! representations (where it gives any) to DIR, and `KILN_STATS_CACHE=DIR` each kernel's
//! pipeline cache data (`vkGetPipelineCacheData`; NVIDIA's holds the compiled machine code as
//! an ELF image, which CUDA's `nvdisasm` lists: the driver gives no IR of its own).
//!
//! Occupancy on NVIDIA follows from the register count: an SM has 65536 registers, so a
//! workgroup of 256 invocations at R registers leaves room for floor(256 / R) workgroups.

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
fn main() {
    let filters: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = stats::run(&filters) {
        eprintln!("shader_stats: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
fn main() {
    eprintln!("shader_stats needs a Vulkan driver (Linux or Windows)");
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
mod stats {
    use ash::vk;
    use std::ffi::{CStr, CString};

    type Res<T> = Result<T, String>;

    fn vkerr(what: &str) -> impl Fn(vk::Result) -> String + '_ {
        move |e| format!("{what}: {e}")
    }

    fn text(chars: &[std::ffi::c_char]) -> String {
        // SAFETY: Vulkan's fixed-size name arrays are NUL-terminated.
        unsafe { CStr::from_ptr(chars.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn run(filters: &[String]) -> Res<()> {
        // SAFETY: loading the system's Vulkan loader; every handle below is used only while
        // the objects it came from live, and destroyed in reverse order.
        unsafe {
            let entry = ash::Entry::load().map_err(|e| format!("no Vulkan loader: {e}"))?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
            let instance = entry
                .create_instance(
                    &vk::InstanceCreateInfo::default().application_info(&app),
                    None,
                )
                .map_err(vkerr("vkCreateInstance"))?;
            let result = with_instance(&instance, filters);
            instance.destroy_instance(None);
            result
        }
    }

    unsafe fn with_instance(instance: &ash::Instance, filters: &[String]) -> Res<()> {
        let want = std::env::var("KILN_STATS_ADAPTER")
            .unwrap_or_default()
            .to_lowercase();
        let exec_ext = ash::khr::pipeline_executable_properties::NAME;
        let coop_ext = ash::khr::cooperative_matrix::NAME;
        let mut chosen = None;
        for pd in instance
            .enumerate_physical_devices()
            .map_err(vkerr("vkEnumeratePhysicalDevices"))?
        {
            let props = instance.get_physical_device_properties(pd);
            let name = text(&props.device_name);
            let exts: Vec<String> = instance
                .enumerate_device_extension_properties(pd)
                .map_err(vkerr("vkEnumerateDeviceExtensionProperties"))?
                .iter()
                .map(|e| text(&e.extension_name))
                .collect();
            let has = |n: &CStr| exts.iter().any(|e| e.as_bytes() == n.to_bytes());
            println!(
                "adapter {name}: API {}.{}, driver {:#x}, pipeline executable properties: {}",
                vk::api_version_major(props.api_version),
                vk::api_version_minor(props.api_version),
                props.driver_version,
                if has(exec_ext) { "yes" } else { "no" }
            );
            if chosen.is_none()
                && has(exec_ext)
                && props.api_version >= vk::API_VERSION_1_3
                && name.to_lowercase().contains(&want)
            {
                chosen = Some((pd, name, has(coop_ext)));
            }
        }
        let Some((pd, name, coop)) = chosen else {
            return Err("no Vulkan 1.3 adapter with VK_KHR_pipeline_executable_properties".into());
        };
        println!("using {name}\n");

        // Every feature the adapter has (the kernels need f16, 16-bit storage, the memory
        // model, subgroups and, for the tensor-core kernels, cooperative matrices).
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut fexec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13)
            .push_next(&mut fexec);
        if coop {
            features = features.push_next(&mut fcoop);
        }
        instance.get_physical_device_features2(pd, &mut features);
        let mut exts = vec![exec_ext.as_ptr()];
        if coop {
            exts.push(coop_ext.as_ptr());
        }
        let priorities = [1.0];
        let queue = vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities);
        let device = instance
            .create_device(
                pd,
                &vk::DeviceCreateInfo::default()
                    .queue_create_infos(std::slice::from_ref(&queue))
                    .enabled_extension_names(&exts)
                    .push_next(&mut features),
                None,
            )
            .map_err(vkerr("vkCreateDevice"))?;
        let result = with_device(instance, &device, filters);
        device.destroy_device(None);
        result
    }

    /// SPIR-V as wgpu-hal writes it for a trusted module on a Vulkan 1.3 device.
    fn spirv(k: &kiln::kernels::Kernel, entry: &str) -> Res<Vec<u32>> {
        use naga::back::spv;
        use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
        let src = k.source();
        let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
        let info = kiln::kernels::validate(k)?;
        let unchecked = BoundsCheckPolicy::Unchecked;
        let options = spv::Options {
            lang_version: (1, 6),
            bounds_check_policies: BoundsCheckPolicies {
                index: unchecked,
                buffer: unchecked,
                image_load: unchecked,
                binding_array: unchecked,
            },
            zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Native,
            force_loop_bounding: false,
            emit_int_div_checks: false,
            ..Default::default()
        };
        let pipeline = spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.to_string(),
        };
        spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())
    }

    /// Descriptor set layouts for the module's bindings (storage and uniform buffers).
    fn set_bindings(module: &naga::Module) -> Vec<Vec<(u32, vk::DescriptorType)>> {
        let mut sets: Vec<Vec<(u32, vk::DescriptorType)>> = Vec::new();
        for (_, g) in module.global_variables.iter() {
            let Some(b) = &g.binding else { continue };
            let ty = match g.space {
                naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                _ => vk::DescriptorType::STORAGE_BUFFER,
            };
            let group = b.group as usize;
            if sets.len() <= group {
                sets.resize(group + 1, Vec::new());
            }
            sets[group].push((b.binding, ty));
        }
        sets
    }

    unsafe fn with_device(
        instance: &ash::Instance,
        device: &ash::Device,
        filters: &[String],
    ) -> Res<()> {
        let exec = ash::khr::pipeline_executable_properties::Device::new(instance, device);
        let ir_dir = std::env::var_os("KILN_STATS_IR").map(std::path::PathBuf::from);
        if let Some(d) = &ir_dir {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        for k in kiln::kernels::Kernel::all() {
            let name = k.name();
            if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let src = k.source();
            let Ok(module) = naga::front::wgsl::parse_str(&src) else {
                continue;
            };
            for ep in module.entry_points.iter() {
                let label = if module.entry_points.len() > 1 {
                    format!("{name}::{}", ep.name)
                } else {
                    name.to_string()
                };
                match pipeline_stats(device, &exec, &k, &module, &ep.name, &label, &ir_dir) {
                    Ok(line) => println!("{line}"),
                    Err(e) => println!("{label}: {e}"),
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn pipeline_stats(
        device: &ash::Device,
        exec: &ash::khr::pipeline_executable_properties::Device,
        k: &kiln::kernels::Kernel,
        module: &naga::Module,
        entry: &str,
        label: &str,
        ir_dir: &Option<std::path::PathBuf>,
    ) -> Res<String> {
        let words = spirv(k, entry)?;
        let shader = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
            .map_err(vkerr("vkCreateShaderModule"))?;
        let mut set_layouts = Vec::new();
        for set in set_bindings(module) {
            let bindings: Vec<_> = set
                .iter()
                .map(|&(b, ty)| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b)
                        .descriptor_type(ty)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            set_layouts.push(
                device
                    .create_descriptor_set_layout(
                        &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                        None,
                    )
                    .map_err(vkerr("vkCreateDescriptorSetLayout"))?,
            );
        }
        // Immediates: a range as large as any kernel's (kiln's are at most 128 bytes).
        let push = vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(128);
        let layout = device
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default()
                    .set_layouts(&set_layouts)
                    .push_constant_ranges(std::slice::from_ref(&push)),
                None,
            )
            .map_err(vkerr("vkCreatePipelineLayout"))?;
        let entry_c = CString::new(entry).map_err(|e| e.to_string())?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(shader)
            .name(&entry_c)
            .flags(vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE);
        let mut flags = vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR;
        if ir_dir.is_some() {
            flags |= vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR;
        }
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)
            .flags(flags);
        let started = std::time::Instant::now();
        let cache_dir = std::env::var_os("KILN_STATS_CACHE").map(std::path::PathBuf::from);
        let cache = match &cache_dir {
            Some(_) => device
                .create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
                .map_err(vkerr("vkCreatePipelineCache"))?,
            None => vk::PipelineCache::null(),
        };
        let created = device.create_compute_pipelines(cache, &[info], None);
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(dir) = &cache_dir {
            let data = device.get_pipeline_cache_data(cache);
            device.destroy_pipeline_cache(cache, None);
            let data = data.map_err(vkerr("vkGetPipelineCacheData"))?;
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = dir.join(format!("{}.bin", file_name(label)));
            std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let out = match created {
            Ok(p) => {
                let r = describe(exec, p[0], label, compile_ms, ir_dir);
                device.destroy_pipeline(p[0], None);
                r
            }
            Err((_, e)) => Err(format!("vkCreateComputePipelines: {e}")),
        };
        device.destroy_pipeline_layout(layout, None);
        for l in set_layouts {
            device.destroy_descriptor_set_layout(l, None);
        }
        device.destroy_shader_module(shader, None);
        out
    }

    unsafe fn describe(
        exec: &ash::khr::pipeline_executable_properties::Device,
        pipeline: vk::Pipeline,
        label: &str,
        compile_ms: f64,
        ir_dir: &Option<std::path::PathBuf>,
    ) -> Res<String> {
        let executables = exec
            .get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))
            .map_err(vkerr("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut line = format!("{label} (compiled in {compile_ms:.0} ms):");
        for (i, props) in executables.iter().enumerate() {
            let info = vk::PipelineExecutableInfoKHR::default()
                .pipeline(pipeline)
                .executable_index(i as u32);
            let stats = exec
                .get_pipeline_executable_statistics(&info)
                .map_err(vkerr("vkGetPipelineExecutableStatisticsKHR"))?;
            line += &format!(" [{} sg {}]", text(&props.name), props.subgroup_size);
            for s in stats {
                let v = match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    _ => format!("{:.3}", s.value.f64),
                };
                line += &format!(" {}={v};", text(&s.name));
            }
            if let Some(dir) = ir_dir {
                write_ir(exec, &info, dir, label, i)?;
            }
        }
        Ok(line)
    }

    /// A kernel's label as a file name.
    fn file_name(label: &str) -> String {
        label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    }

    /// The driver's internal representations of one executable, each to its own file.
    unsafe fn write_ir(
        exec: &ash::khr::pipeline_executable_properties::Device,
        info: &vk::PipelineExecutableInfoKHR,
        dir: &std::path::Path,
        label: &str,
        index: usize,
    ) -> Res<()> {
        let fp = exec
            .fp()
            .get_pipeline_executable_internal_representations_khr;
        let mut count = 0u32;
        fp(exec.device(), info, &mut count, std::ptr::null_mut())
            .result()
            .map_err(vkerr("vkGetPipelineExecutableInternalRepresentationsKHR"))?;
        let mut reps =
            vec![vk::PipelineExecutableInternalRepresentationKHR::default(); count as usize];
        fp(exec.device(), info, &mut count, reps.as_mut_ptr())
            .result()
            .map_err(vkerr("vkGetPipelineExecutableInternalRepresentationsKHR"))?;
        let mut data: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
        for (r, d) in reps.iter_mut().zip(data.iter_mut()) {
            r.p_data = d.as_mut_ptr().cast();
        }
        fp(exec.device(), info, &mut count, reps.as_mut_ptr())
            .result()
            .map_err(vkerr("vkGetPipelineExecutableInternalRepresentationsKHR"))?;
        let safe = file_name(label);
        for (j, (r, d)) in reps.iter().zip(&data).enumerate() {
            let path = dir.join(format!("{safe}.{index}.{j}.txt"));
            let body = if r.is_text == vk::TRUE {
                String::from_utf8_lossy(d.split(|&b| b == 0).next().unwrap_or(&[])).into_owned()
            } else {
                format!("({} bytes of binary)", d.len())
            };
            std::fs::write(&path, format!("# {}\n{body}", text(&r.name)))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }
}
