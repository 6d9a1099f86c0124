//! The examples' dry-run options (Note [Dry runs]): `--plan` runs the same program on a
//! planning twin of the device, `--plan-for NAME` on a GPU from kiln's table of known ones
//! (no GPU needed), `--memory-limit SIZE` caps reserved memory on either kind of run,
//! `--plan-tuning FILE` follows the target machine's tuned kernels (its `autotune.json`); and
//! the report a dry run ends with: the peak by category and the largest batch that fits.

// Each example includes this file and uses the parts it needs.
#![allow(dead_code)]

use clap::{Arg, ArgAction, ArgMatches, Command};
use kiln::device::BatchFit;
use kiln::{Device, PlanTarget};

/// The three options, added to `cmd`.
pub fn args(cmd: Command) -> Command {
    cmd.arg(
        Arg::new("plan")
            .long("plan")
            .action(ArgAction::SetTrue)
            .help("a dry run: the same program through the same allocator, no memory, no kernels"),
    )
    .arg(
        Arg::new("plan-for")
            .long("plan-for")
            .value_name("GPU")
            .help("a dry run for a known GPU (\"H100\", \"H200\"), on any machine"),
    )
    .arg(
        Arg::new("plan-tuning")
            .long("plan-tuning")
            .value_name("FILE")
            .help("the target machine's autotune.json, whose kernel choices the dry run follows"),
    )
    .arg(
        Arg::new("memory-limit")
            .long("memory-limit")
            .value_name("SIZE")
            .help("cap reserved memory (24GiB, 80GB, ...), as set_memory_limit"),
    )
}

/// The device the program runs on: `--plan-for`'s planning device, `--plan`'s twin of the
/// real device (`open()`, with `conf` applied first), or the real device; each with
/// `--memory-limit` and `conf` (allocator settings) applied.
pub fn device(
    m: &ArgMatches,
    open: impl FnOnce() -> kiln::Result<Device>,
    conf: Option<&str>,
) -> kiln::Result<Device> {
    let limit = m
        .get_one::<String>("memory-limit")
        .map(|s| kiln::alloc::parse_size(s))
        .transpose()?;
    let target = match (m.get_one::<String>("plan-for"), m.get_flag("plan")) {
        (Some(name), _) => PlanTarget::named(name)?,
        (None, true) => {
            let real = open()?;
            if let Some(conf) = conf {
                real.set_allocator_settings(conf)?;
            }
            PlanTarget::like(&real)?
        }
        (None, false) => return with_settings(open()?, conf, limit),
    };
    let target = match m.get_one::<String>("plan-tuning") {
        Some(file) => target.with_tuning_cache(file),
        None => target,
    };
    with_settings(Device::planning(target)?, conf, limit)
}

/// `device` with the allocator settings and the memory limit applied.
fn with_settings(device: Device, conf: Option<&str>, limit: Option<u64>) -> kiln::Result<Device> {
    if let Some(conf) = conf {
        device.set_allocator_settings(conf)?;
    }
    if limit.is_some() {
        device.set_memory_limit(limit);
    }
    Ok(device)
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// On a dry run, records the allocator's history from here on (for the peak by category);
/// call before the program allocates.
pub fn record(device: &Device) {
    if device.is_dry_run() {
        use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks};
        device.record_memory_history(
            Some(HistoryEnabled::All),
            HistoryContext::None,
            HistoryStacks::Kiln,
            1 << 24,
        );
    }
}

/// The budget a dry run's batch search fits in: the memory limit, else the GPU's memory.
pub fn budget(device: &Device) -> kiln::Result<(PlanTarget, u64)> {
    let target = PlanTarget::like(device)?;
    let total = device.mem_get_info().1.unwrap_or(u64::MAX);
    let budget = target.memory_limit.unwrap_or(total);
    Ok((target, budget))
}

/// The peak by category of a run whose history `record` started.
pub fn peaks(device: &Device) -> Vec<(kiln::alloc::MemoryCategory, i64)> {
    kiln::profiler::peak_by_category(&device.memory_snapshot())
}

/// What a dry run prints after its `memory_summary`: the peak by category (`peaks`) and the
/// largest batch that fits (`fit`, found within `budget`).
pub fn report(
    peaks: &[(kiln::alloc::MemoryCategory, i64)],
    fit: &BatchFit,
    budget: u64,
    started: std::time::Instant,
) {
    let parts: Vec<String> = peaks
        .iter()
        .filter(|(_, b)| *b != 0)
        .map(|(c, b)| format!("{} {:.1}", c.name(), mib(*b)))
        .collect();
    println!(
        "dry run: at the peak, MiB by category: {}",
        parts.join(", ")
    );
    println!(
        "dry run: the largest batch within {:.0} MiB is {} (peak reserved {:.1} MiB, allocated \
         {:.1} MiB); batch {} would reserve {:.1} MiB ({} dry runs, {:.2} s)",
        mib(budget as i64),
        fit.batch,
        mib(fit.peak_reserved as i64),
        mib(fit.peak_allocated as i64),
        fit.batch + 1,
        mib(fit.next_peak_reserved as i64),
        fit.runs,
        started.elapsed().as_secs_f64()
    );
    if !fit.next_fails_with.is_empty() {
        let why = fit.next_fails_with.lines().next().unwrap_or_default();
        println!("dry run: batch {} fails with: {why}", fit.batch + 1);
    }
}
