//! The probability model: how a prediction becomes integer coding parameters, the bank of
//! fixed-point tables those parameters select, and the adaptive models for everything the
//! tables do not cover (escapes and the predictor-free mode).

pub mod adaptive;
pub mod grid;
pub mod ladder;
pub mod mixture;
pub mod params;
pub mod raw;
pub mod tables;

pub use adaptive::AdaptiveModel;
pub use params::ModelParams;
pub use raw::RawPatternModel;
pub use tables::{Table, TableBank};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Per-parameter-set cache of something expensive to build (tables), shared by every stream
/// and thread that codes with the same parameters.
pub(crate) type ParamsCache<T> = OnceLock<Mutex<HashMap<ModelParams, Arc<T>>>>;

/// Parameter sets kept in a cache. Streams choose their parameters, so a stream of hostile
/// bytes could otherwise make a long-running process keep tables for every set it names.
const MAX_CACHED_PARAMS: usize = 8;

pub(crate) fn shared<T>(cache: &'static ParamsCache<T>, params: &ModelParams, build: impl FnOnce() -> T) -> Arc<T> {
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = guard.get(params) {
        return found.clone();
    }
    let built = Arc::new(build());
    if guard.len() < MAX_CACHED_PARAMS {
        guard.insert(*params, built.clone());
    }
    built
}
