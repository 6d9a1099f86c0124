//! Replays allocator traces recorded from PyTorch and compares kiln's statistics with them.
//!
//! `cargo run --release --example replay_trace -- tests/fixtures/*.json`
//! (gzipped traces too: `tests/fixtures/recorded/*.json.gz`). By default on the simulated
//! source; `--device vulkan:0` replays through a fresh allocator on that device's real memory
//! (expandable segments through Vulkan sparse binding: `tests/fixtures/expandable/`).

use kiln::alloc::replay::AllocTrace;
use std::io::Read;
use std::process::ExitCode;

/// A trace's text, gunzipped where the name ends in `.gz`.
fn read_trace(file: &str) -> std::io::Result<String> {
    let bytes = std::fs::read(file)?;
    if !file.ends_with(".gz") {
        return String::from_utf8(bytes).map_err(std::io::Error::other);
    }
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes.as_slice()).read_to_string(&mut text)?;
    Ok(text)
}

fn main() -> ExitCode {
    let args =
        clap::Command::new("replay_trace")
            .about("Replays allocator traces recorded from PyTorch and compares the statistics")
            .arg(clap::Arg::new("device").long("device").help(
                "replay on this device's memory (vulkan:0, ...) instead of the simulated source",
            ))
            .arg(
                clap::Arg::new("files")
                    .required(true)
                    .num_args(1..)
                    .help("trace files (.json or .json.gz)"),
            )
            .get_matches();
    let files: Vec<String> = args
        .get_many::<String>("files")
        .expect("required")
        .cloned()
        .collect();
    let device = match args
        .get_one::<String>("device")
        .map(|s| kiln::Device::from_spec(s))
    {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            eprintln!("replay_trace: {e}");
            return ExitCode::FAILURE;
        }
        None => None,
    };
    if let Some(d) = &device {
        println!("replaying on {}", d.name());
    }
    let mut failed = false;
    for file in &files {
        let base = std::path::Path::new(file)
            .file_name()
            .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
        let name = base.trim_end_matches(".gz").trim_end_matches(".json");
        let outcome = read_trace(file)
            .map_err(|e| e.to_string())
            .and_then(|text| AllocTrace::from_json(&text).map_err(|e| e.to_string()))
            .and_then(|trace| {
                match &device {
                    Some(d) => d.replay_trace(&trace),
                    None => trace.replay(),
                }
                .map_err(|e| e.to_string())
            });
        match outcome {
            Ok(Ok(n)) => println!("PASS {name} ({n} events)"),
            Ok(Err(m)) => {
                println!("FAIL {name}: {m}");
                failed = true;
            }
            Err(e) => {
                println!("FAIL {name}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
