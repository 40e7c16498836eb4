//! Plain `pread` on the calling thread, one read at a time: the simplest baseline (`std`).

use std::io;

use super::{Backend, RawDone, RawRead};

/// Reads with `pread` on the calling thread, one at a time (the baseline).
#[derive(Default)]
pub struct SyncBackend {
    staged: Option<RawRead>,
    done: Vec<RawDone>,
    syscalls: u64,
}

impl SyncBackend {
    /// A synchronous backend.
    pub fn new() -> SyncBackend {
        SyncBackend::default()
    }
}

impl Backend for SyncBackend {
    fn name(&self) -> &'static str {
        "std"
    }

    fn capacity(&self) -> usize {
        1
    }

    unsafe fn push(&mut self, op: RawRead) -> Result<(), RawRead> {
        if self.staged.is_some() || !self.done.is_empty() {
            return Err(op);
        }
        self.staged = Some(op);
        Ok(())
    }

    fn submit(&mut self, _wait: usize) -> io::Result<()> {
        if let Some(op) = self.staged.take() {
            // SAFETY: Backend::push's contract makes `op.buf` valid and ours for `op.len` bytes.
            let res =
                match unsafe { crate::sys::pread_raw(op.fd, op.buf, op.len as usize, op.offset) } {
                    Ok(n) => n as i32,
                    Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                };
            self.syscalls += 1;
            self.done.push(RawDone { id: op.id, res });
        }
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<RawDone>) {
        out.append(&mut self.done);
    }

    fn cancel_all(&mut self) {
        if let Some(op) = self.staged.take() {
            self.done.push(RawDone {
                id: op.id,
                res: -libc::ECANCELED,
            });
        }
    }

    fn syscalls(&self) -> u64 {
        self.syscalls
    }

    fn describe(&self) -> String {
        "std pread, one at a time".into()
    }
}

impl std::fmt::Debug for SyncBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Backend::describe(self))
    }
}
