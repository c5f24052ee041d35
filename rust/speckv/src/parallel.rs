//! Chunks across threads. Each chunk is coded by exactly the same code whatever thread runs
//! it, and results are gathered in chunk order, so the bytes never depend on the thread count.
//!
//! Pools are kept between calls, one per thread count and process: building one costs ~75 us
//! (two threads started), and a restore makes a few hundred calls (issue 36's profile). A
//! process that forks gets none of its parent's threads: the child sees another process id
//! and builds its own pools, never touching (nor dropping) the ones it inherited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Thread counts whose pools are kept at once; a call with yet another count drops them all.
const KEPT_POOLS: usize = 8;

struct Pools {
    pid: u32,
    by_threads: HashMap<usize, Arc<rayon::ThreadPool>>,
}

fn pool(threads: usize) -> Result<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<Option<Pools>> = Mutex::new(None);
    let pid = std::process::id();
    // a panic elsewhere while the lock was held leaves the map itself intact
    let mut guard = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_some_and(|p| p.pid != pid) {
        // a forked child: its parent's pools have no threads here; leak them rather than run
        // their drop, which would signal threads that do not exist in this process
        std::mem::forget(guard.take());
    }
    let pools = guard.get_or_insert_with(|| Pools { pid, by_threads: HashMap::new() });
    if let Some(p) = pools.by_threads.get(&threads) {
        return Ok(p.clone());
    }
    if pools.by_threads.len() >= KEPT_POOLS {
        pools.by_threads.clear();
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("speckv-{i}"))
        .build()
        .map_err(|e| Error::InvalidArgument(format!("threads: cannot start {threads} threads: {e}")))?;
    let built = Arc::new(built);
    pools.by_threads.insert(threads, built.clone());
    Ok(built)
}

fn check_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Err(Error::InvalidArgument("threads must be at least 1".into()));
    }
    Ok(())
}

/// `f(i)` for every chunk `i < n`, in order. Stops at the first error in chunk order.
pub fn map_chunks<T, F>(threads: usize, n: usize, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(usize) -> Result<T> + Sync + Send,
{
    check_threads(threads)?;
    if threads == 1 || n <= 1 {
        return (0..n).map(f).collect();
    }
    pool(threads)?.install(|| (0..n).into_par_iter().map(&f).collect())
}

/// `f(i, slice_i)` over `out` split into consecutive pieces of `piece` elements.
pub fn for_each_piece_mut<W, F>(threads: usize, out: &mut [W], piece: usize, f: F) -> Result<()>
where
    W: Send,
    F: Fn(usize, &mut [W]) -> Result<()> + Sync + Send,
{
    check_threads(threads)?;
    if out.is_empty() {
        return Ok(());
    }
    if threads == 1 || out.len() <= piece {
        return out.chunks_mut(piece).enumerate().try_for_each(|(i, s)| f(i, s));
    }
    let results: Vec<Result<()>> =
        pool(threads)?.install(|| out.par_chunks_mut(piece).enumerate().map(|(i, s)| f(i, s)).collect());
    results.into_iter().collect()
}
