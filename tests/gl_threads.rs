//! Two threads on one GL device while the driver is busy. wgpu's GL backend guards its context
//! with a lock that panics after six seconds; before kiln serialised its GL calls
//! (`device/serial.rs`), the second thread's `Tensor::full` panicked inside pipeline creation
//! while the first waited on an 11-second matmul (llvmpipe, two cores). Now it waits its turn.

use kiln::{DType, Device, Tensor};

#[test]
fn a_second_thread_waits_for_a_long_gl_job_instead_of_panicking() {
    // The GL adapter as the rest of the suite opens adapters (`test_devices`): one that fails
    // to open is skipped with kiln's warning (the H100 machine's EGL lists the GPU, then
    // fails to make a context: "Parent device is lost").
    let Some(dev) = Device::all_adapters().into_iter().find(|d| {
        d.adapter_info()
            .is_some_and(|a| a.backend == wgpu::Backend::Gl)
    }) else {
        eprintln!("no GL adapter that opens: skipped");
        return;
    };
    // A product that keeps llvmpipe busy for over six seconds (11.5 s on the dev machine;
    // a real GPU finishes at once and the test only checks the results). The 64-tile kernel
    // compiles in seconds from a cold shader cache, the 128-tile one in minutes.
    kiln::ops::force_matmul_tile(Some(64));
    let n = 1536;
    let a = Tensor::full(&[n, n], 0.5, DType::F32, &dev).unwrap();
    a.sum_all().unwrap().item::<f32>().unwrap();
    let other = dev.clone();
    let second = std::thread::spawn(move || -> kiln::Result<f32> {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // A kernel this device has not compiled yet: pipeline creation takes the GL context.
        let x = Tensor::arange(0.0, 1000.0, 1.0, DType::F32, &other)?;
        x.sum_all()?.item::<f32>()
    });
    let total = a
        .matmul(&a)
        .unwrap()
        .sum_all()
        .unwrap()
        .item::<f32>()
        .unwrap();
    kiln::ops::force_matmul_tile(None);
    let sum = second.join().expect("the second thread panicked").unwrap();
    assert_eq!(sum, 499_500.0);
    // Every element of the product is n * 0.25.
    let want = (n * n) as f32 * n as f32 * 0.25;
    assert!((total - want).abs() <= want * 1e-5, "{total} vs {want}");
}
