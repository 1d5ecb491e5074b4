//! [`DedicatedStore`]: a store opened on an I/O runtime of its own, for callers that are not async
//! themselves (a command-line tool, language bindings) or whose async runtime must not carry the store's
//! connections.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use super::{ObjectStore, StoreOptions, open_store_with};
use crate::error::{Result, SourceError};

/// An [`ObjectStore`] together with the tokio runtime its connections live on.
///
/// The runtime runs `io_threads` worker threads named `spdl-store`. Requests may be awaited from any
/// runtime (the store's futures are `Send` and its connections are driven by its own runtime), or run to
/// completion from plain threads with [`block_on`](Self::block_on).
///
/// Dropping it shuts the runtime down without waiting (requests still in flight are cancelled), so the
/// last owner may be anywhere, an async context included, where a blocking shutdown would panic.
///
/// # Example
///
/// ```
/// use spdl_source::{DedicatedStore, StoreOptions};
///
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.bin"), b"hello")?;
/// let url = dir.path().to_str().unwrap();
/// let store = DedicatedStore::open(url, &StoreOptions::default(), 1)?;
/// let bytes = store.block_on(store.store().get("a.bin"))?;
/// assert_eq!(&bytes[..], b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DedicatedStore {
    store: Arc<dyn ObjectStore>,
    /// Always `Some` but during `drop`.
    runtime: Option<tokio::runtime::Runtime>,
}

impl DedicatedStore {
    /// Starts a runtime of `io_threads` worker threads (at least 1) and opens the store `url` names on it
    /// (see [`open_store_with`] for the addresses). Must not be called from inside an async context.
    pub fn open(url: &str, opts: &StoreOptions, io_threads: usize) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(io_threads.max(1))
            .thread_name("spdl-store")
            .enable_all()
            .build()
            .map_err(|source| SourceError::Runtime { url: url.to_owned(), source })?;
        let store = runtime.block_on(open_store_with(url, opts))?;
        Ok(DedicatedStore { store, runtime: Some(runtime) })
    }

    /// The store. Clones of the `Arc` stay usable while this value lives; once it is dropped, their
    /// requests fail or are cancelled (the connections' runtime is gone).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The store's runtime, to spawn requests on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime().handle()
    }

    /// Runs `future` to completion on the store's runtime, blocking this thread.
    ///
    /// # Panics
    ///
    /// When called from inside an async context (tokio forbids blocking there).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime().block_on(future)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().unwrap_or_else(|| unreachable!("the runtime is taken only by Drop"))
    }
}

impl Drop for DedicatedStore {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl fmt::Debug for DedicatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedicatedStore").field("store", &self.store).finish_non_exhaustive()
    }
}
