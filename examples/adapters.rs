//! Prints every adapter wgpu finds, with the features and limits kiln uses.
//!
//! `cargo run --example adapters` (`-- --debug`: every field of each, limits included)

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "-"
    }
}

fn main() {
    let adapters = kiln::adapters();
    if std::env::args().any(|a| a == "--debug") {
        for a in &adapters {
            println!("{a:#?}");
        }
    }
    if adapters.is_empty() {
        println!("no adapters: install a Vulkan driver (on Debian: mesa-vulkan-drivers)");
        return;
    }
    println!(
        "{:<9} {:<40} {:<12} {:<28} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4} {:>6} {:>10} {:>11} {:>5} {:>5} {:>5}",
        "spec", "name", "type", "driver", "f16", "ts", "tsip", "sg", "imm", "coop", "sparse",
        "memory", "max bind", "align", "sbufs", "imm B"
    );
    for a in adapters {
        let f = a.features;
        let l = a.limits;
        let mem = a
            .memory_bytes
            .map_or("unknown".to_string(), kiln::alloc::format_size);
        let driver = format!("{} {}", a.driver, a.driver_info);
        println!(
            "{:<9} {:<40} {:<12} {:<28} {:>4} {:>4} {:>4} {:>4} {:>4} {:>4} {:>6} {:>10} {:>11} {:>5} {:>5} {:>5}",
            a.spec,
            a.name.chars().take(40).collect::<String>(),
            format!("{:?}", a.device_type),
            driver.chars().take(28).collect::<String>(),
            yes(f.shader_f16),
            yes(f.timestamp_query),
            yes(f.timestamp_query_inside_passes),
            yes(f.subgroups),
            yes(f.immediates),
            yes(f.cooperative_matrix),
            yes(f.sparse_binding),
            mem,
            l.max_storage_buffer_binding_size,
            l.min_storage_buffer_offset_alignment,
            l.max_storage_buffers_per_shader_stage,
            l.max_immediate_size,
        );
    }
    println!("\nf16 shader-f16, ts timestamp queries, tsip timestamps inside passes, sg subgroups, imm immediates, coop cooperative matrix, sparse Vulkan sparse buffer binding (expandable segments on GPU memory)");
}
