//! What the unit tests know of their machine: a test that needs something this processor may
//! lack (AVX2, AVX-512) skips without it, unless `SPECKV_REQUIRE` (comma-separated names, as
//! `tests/conftest.py` reads them: `.ci/run` names what its machine has) names it, and then
//! fails, so that a required kernel is never silently left untested.

/// Whether a test needing `name` runs: true when `present`; otherwise it says why it skips
/// (`why`) and returns false, or panics when `SPECKV_REQUIRE` names `name`.
pub(crate) fn have(name: &str, present: bool, why: &str) -> bool {
    if present {
        return true;
    }
    let required = std::env::var("SPECKV_REQUIRE").unwrap_or_default();
    assert!(!required.split(',').any(|s| s.trim() == name), "SPECKV_REQUIRE={name}, but {why}");
    eprintln!("skipped: {why}");
    false
}

/// The unit tests' random numbers: one step of Knuth's MMIX linear congruential generator
/// (take the state's high bits: its low bits cycle short).
pub(crate) fn lcg_step(state: u64) -> u64 {
    state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407)
}
