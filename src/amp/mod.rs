//! Automatic mixed precision, as `torch.amp`: `autocast` regions (the policy itself lives with
//! the ops, in `ops/autocast.rs`, because ops consult it) and `GradScaler`. See Note \[Autocast\]
//! in ARCHITECTURE.md.

mod scaler;

pub use crate::ops::autocast::{
    autocast, autocast_cache_len, autocast_dtype, autocast_with_cache, is_autocast_enabled,
    with_autocast, AutocastGuard, DeviceType,
};
pub use scaler::GradScaler;
