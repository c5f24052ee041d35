//! Chunks across threads. Each chunk is coded by exactly the same code whatever thread runs
//! it, and results are gathered in chunk order, so the bytes never depend on the thread count.
//!
//! A pool is built per call and dropped after it: nothing survives the call, so a process
//! that forks afterwards inherits no worker threads (fork-safe by construction).

use rayon::prelude::*;

use crate::error::{Error, Result};

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("speckv-{i}"))
        .build()
        .map_err(|e| Error::InvalidArgument(format!("threads: cannot start {threads} threads: {e}")))
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
