//! GPU time of a stretch of queued work, from two timestamp queries written into the stream's
//! encoder around it. For benchmarks: separates kernel time from host-side noise.

use super::{lock, Device};
use crate::Result;

/// Runs `f` (which queues GPU work) and returns the GPU seconds between the start and the end
/// of that work, or `None` where the adapter has no timestamp queries inside encoders (or for
/// the CPU device). A sync point.
pub fn gpu_time(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<Option<f64>> {
    let Some(g) = device.gpu() else {
        f()?;
        return Ok(None);
    };
    if !g
        .device
        .features()
        .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS)
    {
        f()?;
        return Ok(None);
    }
    let gl = g.gl.guard();
    let set = g.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("kiln timer"),
        ty: wgpu::QueryType::Timestamp,
        count: 2,
    });
    let resolve = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kiln timer resolve"),
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    drop(gl);
    lock(&g.stream)
        .copy_encoder(&g.device)
        .write_timestamp(&set, 0);
    f()?;
    let view = g.read_back("gpu_time", 16, |enc, readback| {
        enc.write_timestamp(&set, 1);
        enc.resolve_query_set(&set, 0..2, &resolve, 0);
        enc.copy_buffer_to_buffer(&resolve, 0, readback, 0, 16);
    })?;
    g.check("gpu_time")?;
    {
        let _gl = g.gl.guard();
        drop(resolve);
        drop(set);
    }
    let ticks: [u64; 2] = bytemuck::pod_read_unaligned(&view[..16]);
    let period_ns = g.queue.get_timestamp_period() as f64;
    Ok(Some(
        ticks[1].saturating_sub(ticks[0]) as f64 * period_ns * 1e-9,
    ))
}
