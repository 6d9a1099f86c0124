//! Kernel variants chosen per adapter by measurement (autotuning).
//!
//! An op with several correct kernels (a reduction's strategy, a softmax's row mapping, a
//! transpose through shared memory or not, a product's tile shape) names them as candidates,
//! the first being the fixed default. The first time the op meets a size class on a device,
//! `pick` runs every candidate on the op's own operands, times each between two
//! synchronisations, and keeps the fastest: in memory for the device, and in a JSON file in
//! the user's cache directory (`autotune.json`, one entry per adapter, driver, kiln version
//! and kernels' fingerprint, a hash of kiln's sources from `build.rs`), so that the next
//! process starts tuned. The op then launches the winner as usual:
//! its result never comes from a timing run.
//!
//! - Small problems are never tuned: below [`MIN_WORK`] launch costs dominate and the default
//!   runs.
//! - `KILN_AUTOTUNE=off` (or [`set_autotune`]) picks the defaults everywhere, for runs that
//!   must be reproducible from machine to machine: the variants differ in summation order.
//! - Every candidate is a kernel that `tests/autotune.rs` checks against the CPU device
//!   ([`force_variant`] runs one by name).
//! - The kernel's name in the profiler's trace carries the variant that ran.
//! - A choice read from the cache file is measured again when today's kiln offers a candidate
//!   that its measurement did not have (`TuneRecord::offered`).
//! - Tuning one key stays within [`BUDGET`] where it can: a candidate is not tried when the
//!   fastest run so far would take it past it (the default always runs first). A key tuned
//!   inside another's measurement shares the outer key's deadline, less [`NESTED_RESERVE`]
//!   for the outer key's own runs, so that one op's first use stays within the budget.

use crate::device::Device;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use timing::{time_one, Best};

mod timing;

/// Work (elements, or multiply-adds for products) below which the default runs untuned.
pub const MIN_WORK: u64 = 1 << 16;

/// The most time one key's tuning should spend: a candidate is not tried when the fastest run
/// so far would take it past this.
pub const BUDGET: Duration = Duration::from_millis(2000);

/// How much faster than the default another candidate must be to win.
pub const MARGIN: f64 = 0.05;

/// Whether kernels are chosen by measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Autotune {
    /// Measure on first use of a size class, remember (the default).
    On,
    /// The fixed defaults everywhere (`KILN_AUTOTUNE=off`).
    Off,
}

/// 0: not read yet, 1: on, 2: off.
static MODE: AtomicU8 = AtomicU8::new(0);

/// The mode in force: [`set_autotune`]'s, else `KILN_AUTOTUNE` (`off`, `0` or `false` turn it
/// off), else on.
pub fn autotune() -> Autotune {
    match MODE.load(Ordering::Relaxed) {
        1 => Autotune::On,
        2 => Autotune::Off,
        _ => {
            let off = std::env::var("KILN_AUTOTUNE")
                .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"));
            let mode = if off { Autotune::Off } else { Autotune::On };
            set_autotune(mode);
            mode
        }
    }
}

/// Sets the mode for the whole process (overrides `KILN_AUTOTUNE`).
pub fn set_autotune(mode: Autotune) {
    MODE.store(
        match mode {
            Autotune::On => 1,
            Autotune::Off => 2,
        },
        Ordering::Relaxed,
    );
}

thread_local! {
    static FORCED: RefCell<BTreeMap<String, String>> = const { RefCell::new(BTreeMap::new()) };
    /// The deadline of the outermost tuning in progress on this thread. A key tuned inside
    /// another's measurement (a narrow product's `tiled` candidate is the general product,
    /// with its own key; in f16 that is an f32 narrow product, with its own) shares the outer
    /// key's budget: on lavapipe the f16 head product 512x4096x10 took 4.2 s to tune, three
    /// nested keys of up to 2 s each, where one op's first use should cost at most BUDGET.
    /// Each key in progress sets it to its own deadline for the keys inside it.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `family`'s ops on this thread with the variant named `variant` wherever it is a
/// candidate (`None`: back to the normal choice). For tests and for comparing variants by
/// hand; a name that is not a candidate of some key leaves that key's choice alone, and
/// `a|b` forces the first of `a` and `b` that is one.
pub fn force_variant(family: &str, variant: Option<&str>) {
    FORCED.with(|f| match variant {
        Some(v) => {
            f.borrow_mut().insert(family.to_string(), v.to_string());
        }
        None => {
            f.borrow_mut().remove(family);
        }
    });
}

/// `KILN_FORCE_VARIANT=family=variant[,family=variant...]`: `force_variant` for the whole
/// process, for comparing variants by hand in the bench.
fn forced_by_env(family: &str) -> Option<String> {
    static ENV: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let spec = std::env::var("KILN_FORCE_VARIANT").unwrap_or_default();
        spec.split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    })
    .get(family)
    .cloned()
}

/// One tuned key, as the bench and the tune-ahead example report it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TuneRecord {
    /// The op family (`reduce`, `softmax`, `transpose`, `matmul`).
    pub family: String,
    /// The size class and operand kinds, e.g. `sum f32 vec4 rows 2^0 inner 2^22`.
    pub key: String,
    /// The candidate kept.
    pub winner: String,
    /// Seconds per run of every candidate timed (those beyond the budget are absent).
    pub candidates: Vec<(String, f64)>,
    /// Every candidate the op offered when it was tuned, timed or not. A record read from the
    /// cache file that lacks one of today's candidates is measured again: a kiln that gained a
    /// kernel (same version number, new build) must not keep a winner chosen without it. Files
    /// written before this field existed read as empty here; their timed candidates stand in.
    #[serde(default)]
    pub offered: Vec<String>,
    /// Wall-clock seconds the tuning took, compilation included.
    pub tuning_seconds: f64,
    /// Whether this process read the choice from the cache file instead of measuring.
    #[serde(skip)]
    pub from_cache: bool,
}

/// The file format: every adapter's records.
#[derive(Default, Serialize, Deserialize)]
struct CacheFile {
    format: String,
    adapters: BTreeMap<String, BTreeMap<String, TuneRecord>>,
}

const FORMAT: &str = "kiln.autotune.v1";

/// One device's choices: the records by `family/key`, loaded from the cache file on first use.
pub(crate) struct Tuner {
    adapter: String,
    records: BTreeMap<String, TuneRecord>,
}

impl Tuner {
    /// The tuner of `info`'s adapter, with its records from the cache file (`path`, else the
    /// user's: `cache_path`).
    pub(crate) fn new(info: &crate::device::AdapterInfo, path: Option<&std::path::Path>) -> Self {
        let adapter = format!(
            "{} | {:?} | {} | {} | kiln {} | kernels {}",
            info.name,
            info.backend,
            info.driver,
            info.driver_info,
            env!("CARGO_PKG_VERSION"),
            env!("KILN_KERNEL_HASH")
        );
        let file = match path {
            Some(p) => read_cache_at(p),
            None => read_cache(),
        };
        let mut records = file
            .and_then(|mut c| c.adapters.remove(&adapter))
            .unwrap_or_default();
        for r in records.values_mut() {
            r.from_cache = true;
        }
        Tuner { adapter, records }
    }
}

/// The cache file: `KILN_CACHE_DIR`, else the platform's user cache directory, `kiln/` in it.
pub fn cache_path() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = if let Some(d) = var("KILN_CACHE_DIR") {
        d
    } else if cfg!(windows) {
        var("LOCALAPPDATA")?.join("kiln")
    } else if cfg!(target_os = "macos") {
        var("HOME")?.join("Library/Caches/kiln")
    } else {
        var("XDG_CACHE_HOME")
            .or_else(|| var("HOME").map(|h| h.join(".cache")))?
            .join("kiln")
    };
    Some(dir.join("autotune.json"))
}

/// The cache file's contents; `None` when absent, unreadable or of another format (the file is
/// a cache: anything wrong with it means measuring again, never an error).
fn read_cache() -> Option<CacheFile> {
    read_cache_at(&cache_path()?)
}

/// `read_cache` of the file at `path`.
fn read_cache_at(path: &std::path::Path) -> Option<CacheFile> {
    let bytes = std::fs::read(path).ok()?;
    let file: CacheFile = serde_json::from_slice(&bytes).ok()?;
    (file.format == FORMAT).then_some(file)
}

/// Adds one record to the cache file (read again first: other processes may have added theirs;
/// written atomically). Failures are logged, not returned: the choice still holds in memory.
fn persist(adapter: &str, id: &str, record: &TuneRecord) {
    let Some(path) = cache_path() else { return };
    let mut file = read_cache().unwrap_or_default();
    file.format = FORMAT.into();
    file.adapters.retain(|other, _| !superseded(other, adapter));
    file.adapters
        .entry(adapter.to_string())
        .or_default()
        .insert(id.to_string(), record.clone());
    let write = || -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| crate::base::io_error("autotune", dir, e))?;
        }
        let json = serde_json::to_vec_pretty(&file).map_err(|e| crate::Error::InvalidArgument {
            op: "autotune",
            msg: e.to_string(),
        })?;
        crate::base::write_atomic("autotune", &path, &json)
    };
    if let Err(e) = write() {
        log::warn!("kiln: could not write the autotune cache: {e}");
    }
}

/// Whether the cache file's `other` entry is an earlier build of `adapter`'s: the same
/// adapter, driver and kiln version, other kernels (a development build's; its choices would
/// never be read again).
fn superseded(other: &str, adapter: &str) -> bool {
    const KERNELS: &str = " | kernels ";
    match (other.rsplit_once(KERNELS), adapter.rsplit_once(KERNELS)) {
        (Some((o, oh)), Some((a, ah))) => o == a && oh != ah,
        _ => false,
    }
}

/// Every choice `device` holds (tuned in this process or read from the cache file).
pub fn tuned(device: &Device) -> Vec<TuneRecord> {
    match tuner(device) {
        Some(t) => crate::device::lock(t).records.values().cloned().collect(),
        None => Vec::new(),
    }
}

/// Forgets `device`'s choices in memory (the cache file stays): the next use measures again.
pub fn forget(device: &Device) {
    if let Some(t) = tuner(device) {
        crate::device::lock(t).records.clear();
    }
}

/// The tuner of a GPU or planning device (a planning device's holds its target adapter's
/// records from the cache file); `None` for the CPU device.
fn tuner(device: &Device) -> Option<&Mutex<Tuner>> {
    super::launch_state_of(device).map(|s| &s.tuner)
}

/// Whether `device` is a CPU adapter (lavapipe, GL's llvmpipe). There a workgroup runs on one
/// thread, eight invocations to a SIMD vector, and a barrier switches between all of its
/// vectors: ops default to their barrier-free kernels on such adapters.
pub(crate) fn on_cpu_adapter(device: &Device) -> bool {
    device
        .adapter_info()
        .is_some_and(|i| i.device_type == wgpu::DeviceType::Cpu)
}

/// Loop headers an invocation may pass on a CPU adapter: Mesa's llvmpipe (lavapipe, and GL's
/// llvmpipe) breaks out of every loop of an invocation once it has passed 65535 loop headers
/// in all (gallivm's loop limiter), silently. On the dev box (2026-11-29) the serial softmax of
/// one row of 16001 f32 wrote the first 5843 elements of its second pass and left the rest
/// zero, of 12001 the first 9843: 21844 elements read or written, three headers each (the
/// row's loop, and the index's loop over one dim entered and left).
pub(crate) const CPU_ADAPTER_LOOP_HEADERS: usize = 65535;

/// Whether a kernel whose invocation passes `headers` loop headers runs whole on `device`
/// (anything on a GPU; under `CPU_ADAPTER_LOOP_HEADERS` on a CPU adapter).
pub(crate) fn loops_fit(device: &Device, headers: usize) -> bool {
    !on_cpu_adapter(device) || headers < CPU_ADAPTER_LOOP_HEADERS
}

/// Whether `device` is GL's llvmpipe, where a kernel with barriers in a loop ran thousands of
/// times slower than its barrier-free peer (2026-11-26, the dev box: the tiled 2048^2
/// transpose 8.0 s a run, the tree softmax of 1024^2 6.4 s, against 17 ms and 11 ms for their
/// peers on lavapipe): one run to time it would take the key's budget many times over, so such
/// kernels are not candidates there.
pub(crate) fn on_gl_cpu_adapter(device: &Device) -> bool {
    on_cpu_adapter(device)
        && device
            .adapter_info()
            .is_some_and(|i| i.backend == wgpu::Backend::Gl)
}

/// The power-of-two class of `n` (`2^k` for `2^k <= n < 2^(k+1)`), for keys.
pub(crate) fn class(n: usize) -> String {
    format!("2^{}", usize::BITS - 1 - n.max(1).leading_zeros())
}

/// The candidate to run for `key` of `family` on `device`: forced on this thread, the default
/// when tuning is off or the work is small, the remembered winner, or the fastest of a
/// measurement now. `candidates[0]` is the default; `run` launches one candidate on the op's
/// operands (its output is overwritten by the op's own launch afterwards).
pub(crate) fn pick<V: Copy + PartialEq>(
    device: &Device,
    family: &'static str,
    key: impl FnOnce() -> String,
    work: u64,
    candidates: &[(V, &'static str)],
    run: impl FnMut(V) -> Result<()>,
) -> Result<V> {
    choose(
        device,
        family,
        key,
        work,
        candidates,
        None::<fn(V) -> Result<()>>,
        run,
    )
}

/// `pick`, where `prepare` launches a candidate on a sliver of the op (one workgroup) before it
/// is timed, so that its compilation is not: Mesa's llvmpipe compiles a shader at its first
/// dispatch, inside the GPU's time (0.65-0.86 s for lavapipe's 16-row word product, which
/// then runs in 3 ms).
pub(crate) fn pick_prepared<V: Copy + PartialEq>(
    device: &Device,
    family: &'static str,
    key: impl FnOnce() -> String,
    work: u64,
    candidates: &[(V, &'static str)],
    prepare: impl FnMut(V) -> Result<()>,
    run: impl FnMut(V) -> Result<()>,
) -> Result<V> {
    choose(device, family, key, work, candidates, Some(prepare), run)
}

/// `pick` and `pick_prepared`: `prepare` is `None` where the first run compiles the candidate.
fn choose<V: Copy + PartialEq, P: FnMut(V) -> Result<()>>(
    device: &Device,
    family: &'static str,
    key: impl FnOnce() -> String,
    work: u64,
    candidates: &[(V, &'static str)],
    mut prepare: Option<P>,
    mut run: impl FnMut(V) -> Result<()>,
) -> Result<V> {
    let default = candidates[0].0;
    if let Some(v) = forced(family).and_then(|name| named(candidates, &name)) {
        return Ok(v);
    }
    let Some(t) = tuner(device) else {
        return Ok(default);
    };
    if candidates.len() == 1 || work < MIN_WORK || autotune() == Autotune::Off {
        return Ok(default);
    }
    let key = key();
    let id = format!("{family}/{key}");
    if let Some(v) = winner(t, &id, candidates) {
        return Ok(v);
    }
    if device.is_dry_run() {
        // Nothing to time: the target adapter's remembered choice or the default, as a
        // tuned process would run (Note [Dry runs]).
        return Ok(default);
    }
    // The work queued before the op (on llvmpipe with its kernels' compilation, at their first
    // dispatch) is not the tuning's: the clock starts once it is done.
    device.synchronize()?;
    let start = Instant::now();
    let outer = DEADLINE.get();
    let deadline = outer.map_or(start + BUDGET, |d| {
        (start + BUDGET).min(d.checked_sub(NESTED_RESERVE).unwrap_or(start))
    });
    if deadline.saturating_duration_since(start) < NESTED_MIN {
        // Nested, with the outer key's budget spent: the default runs untuned, and the key is
        // left for a use of its own.
        return Ok(default);
    }
    let _scope = Deadline::enter(deadline);
    let mut timed = Vec::new();
    // The fastest warm-up so far (`Best::warm`).
    let mut fastest_warm: Option<f64> = None;
    // The longest preparation so far: what the next candidate's compilation may cost.
    let mut prepare_max = Duration::ZERO;
    for &(v, name) in candidates {
        // Another candidate is tried only while it should fit in the budget (judged by the
        // fastest run so far, and the longest preparation): a product that takes a second a
        // run is not timed twice.
        let fastest = timed.iter().map(|t: &(&str, V, f64)| t.2).reduce(f64::min);
        if fastest.is_some_and(|f| !next_fits(Instant::now(), prepare_max, f, deadline)) {
            break;
        }
        // A candidate that cannot run here (too large to bind, say) is passed over.
        let t = Instant::now();
        let prepared = match prepare.as_mut() {
            Some(p) => p(v).and_then(|()| device.synchronize()),
            None => Ok(()),
        };
        prepare_max = prepare_max.max(t.elapsed());
        let left = deadline.saturating_duration_since(Instant::now());
        let best = Best {
            warm: fastest_warm,
            compiled: prepare.is_some(),
        };
        match prepared.and_then(|()| time_one(device, left, best, || run(v))) {
            Ok(t) => {
                fastest_warm = Some(fastest_warm.map_or(t.warm, |w| w.min(t.warm)));
                timed.push((name, v, t.secs));
            }
            Err(e) => log::debug!("kiln autotune: {id}: {name} failed: {e}"),
        }
    }
    let Some(&(mut winner, mut v, best)) = timed.iter().min_by(|a, b| a.2.total_cmp(&b.2)) else {
        return Ok(default);
    };
    // The default keeps its place unless another candidate beats it by more than MARGIN: a
    // choice between kernels within noise of each other is not worth a change of rounding.
    if let Some(&(name, d, secs)) = timed.first().filter(|t| t.1 == default) {
        if secs <= best * (1.0 + MARGIN) {
            (winner, v) = (name, d);
        }
    }
    let record = TuneRecord {
        family: family.to_string(),
        key,
        winner: winner.to_string(),
        candidates: timed.iter().map(|&(n, _, s)| (n.to_string(), s)).collect(),
        offered: candidates.iter().map(|&(_, n)| n.to_string()).collect(),
        tuning_seconds: start.elapsed().as_secs_f64(),
        from_cache: false,
    };
    let adapter = {
        let mut t = crate::device::lock(t);
        t.records.insert(id.clone(), record.clone());
        t.adapter.clone()
    };
    persist(&adapter, &id, &record);
    Ok(v)
}

/// Time a nested key needs left of the outer key's budget to be tuned at all.
const NESTED_MIN: Duration = Duration::from_millis(200);

/// What a nested key leaves of the outer key's budget for the outer key's own runs (and those
/// of the ops between: an f16 head product's casts). On lavapipe the f16 head's first use,
/// three keys deep, ran 0.43 s past its innermost key's end.
pub const NESTED_RESERVE: Duration = Duration::from_millis(300);

/// Whether another candidate fits: its compilation (the longest preparation so far) and a run
/// (the fastest so far) from `now`, before the key's deadline.
fn next_fits(now: Instant, prepare_max: Duration, fastest: f64, deadline: Instant) -> bool {
    now + prepare_max + Duration::from_secs_f64(fastest.clamp(0.0, 1e6)) <= deadline
}

/// This thread's tuning deadline for the keys tuned inside one, while it is tuned; the outer
/// key's again afterwards (after an error too).
struct Deadline(Option<Instant>);

impl Deadline {
    fn enter(deadline: Instant) -> Self {
        Deadline(DEADLINE.replace(Some(deadline)))
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        DEADLINE.set(self.0);
    }
}

/// `pick` without measuring: the winner remembered for `key` (on this adapter, or forced), else
/// the default. For ops that must not run twice (in place).
pub(crate) fn remembered<V: Copy + PartialEq>(
    device: &Device,
    family: &'static str,
    key: impl FnOnce() -> String,
    candidates: &[(V, &'static str)],
) -> V {
    if let Some(v) = forced(family).and_then(|name| named(candidates, &name)) {
        return v;
    }
    match tuner(device) {
        Some(t) if autotune() != Autotune::Off => {
            winner(t, &format!("{family}/{}", key()), candidates)
        }
        _ => None,
    }
    .unwrap_or(candidates[0].0)
}

/// The variant forced for `family`: on this thread (`force_variant`), else by
/// `KILN_FORCE_VARIANT`.
/// The variant `force_variant` (or `KILN_FORCE_VARIANT`) names for `family` on this thread,
/// for the families whose choice is a rule rather than a timing (`flash split`).
pub(crate) fn forced_name(family: &str) -> Option<String> {
    forced(family)
}

fn forced(family: &str) -> Option<String> {
    FORCED
        .with(|f| f.borrow().get(family).cloned())
        .or_else(|| forced_by_env(family))
}

/// The candidate remembered as the winner for `id` (`family/key`) on this device's adapter;
/// `None` where a record read from the cache file was measured without one of `candidates`.
///
/// Only records from the file are checked: one key's candidates can differ from call to call
/// (a transpose offers `words` only where its sides are multiples of 4), and a record this
/// process measured would otherwise be measured again at every alternation.
fn winner<V: Copy>(tuner: &Mutex<Tuner>, id: &str, candidates: &[(V, &'static str)]) -> Option<V> {
    let tuner = crate::device::lock(tuner);
    let record = tuner.records.get(id)?;
    if record.from_cache {
        let offered = |name: &str| match record.offered.is_empty() {
            false => record.offered.iter().any(|o| o == name),
            true => record.candidates.iter().any(|(c, _)| c == name),
        };
        if !candidates.iter().all(|&(_, name)| offered(name)) {
            return None;
        }
    }
    named(candidates, &record.winner)
}

/// The candidate called `name`; `a|b` names the first of `a`, `b` that is a candidate (one
/// forced name for a family whose keys offer different variants).
fn named<V: Copy>(candidates: &[(V, &'static str)], name: &str) -> Option<V> {
    name.split('|')
        .find_map(|name| candidates.iter().find(|(_, n)| *n == name))
        .map(|&(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forced name picks its candidate; `a|b` the first of them that is one, in that order;
    /// a name that is none leaves the choice alone.
    #[test]
    fn forced_names_pick_the_first_candidate_they_name() {
        let candidates = [(1, "narrow"), (2, "narrow_vec4"), (3, "tiled")];
        assert_eq!(named(&candidates, "tiled"), Some(3));
        assert_eq!(named(&candidates, "narrow_vec4|narrow"), Some(2));
        assert_eq!(named(&candidates, "narrow|narrow_vec4"), Some(1));
        assert_eq!(named(&candidates[..1], "narrow_vec4|narrow"), Some(1));
        assert_eq!(named(&candidates, "grouped|separate"), None);
    }

    /// Choices are keyed by the kernels' fingerprint too; an earlier build of the same version
    /// on the same adapter and driver gives way in the file, other versions and adapters stay.
    #[test]
    fn a_build_with_other_kernels_supersedes_its_entry_only() {
        let key = |gpu: &str, v: &str, k: &str| {
            format!("{gpu} | Vulkan | d | 1.0 | kiln {v} | kernels {k}")
        };
        let now = key("llvmpipe", "0.1.0", "aaaa");
        assert_eq!(env!("KILN_KERNEL_HASH").len(), 16);
        assert!(superseded(&key("llvmpipe", "0.1.0", "bbbb"), &now));
        assert!(!superseded(&now, &now));
        assert!(!superseded(&key("llvmpipe", "0.2.0", "bbbb"), &now));
        assert!(!superseded(&key("H100", "0.1.0", "bbbb"), &now));
        // Entries written before the fingerprint stay (nothing reads them; they are few).
        assert!(!superseded(
            "llvmpipe | Vulkan | d | 1.0 | kiln 0.1.0",
            &now
        ));
    }

    /// A key in progress gives the keys inside it its deadline, and the outer key's comes back
    /// when it ends.
    #[test]
    fn a_nested_key_sees_its_outer_keys_deadline_until_it_ends() {
        let t0 = Instant::now();
        assert_eq!(DEADLINE.get(), None);
        {
            let _outer = Deadline::enter(t0 + BUDGET);
            assert_eq!(DEADLINE.get(), Some(t0 + BUDGET));
            {
                let _inner = Deadline::enter(t0 + BUDGET - NESTED_RESERVE);
                assert_eq!(DEADLINE.get(), Some(t0 + BUDGET - NESTED_RESERVE));
            }
            assert_eq!(DEADLINE.get(), Some(t0 + BUDGET));
        }
        assert_eq!(DEADLINE.get(), None);
    }

    /// Another candidate is tried while its compilation and a run fit before the deadline.
    #[test]
    fn another_candidate_fits_before_the_deadline() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let prep = Duration::from_millis(700);
        assert!(next_fits(t0, prep, 0.2, at(2000)));
        assert!(!next_fits(at(1200), prep, 0.2, at(2000)));
        assert!(!next_fits(t0, prep, 0.2, at(500)));
        assert!(next_fits(t0, Duration::ZERO, 0.2, at(500)));
    }
}
