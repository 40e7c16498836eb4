//! A store in front of the real one, for what SeaweedFS cannot be made to do: an endpoint of its
//! own (a second server with the same bucket and keys), taken down and brought back on the
//! same port, or one that accepts connections and never answers. It forwards bytes as they
//! are: a request signed for its endpoint's host checks on SeaweedFS, which verifies the
//! signature over the headers it receives.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the store does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    /// Forward it to the real server.
    Forward = 0,
    /// Accept it, read what comes, and never answer.
    Hang = 1,
}

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    /// The next GET of an object (not a listing) waits this long (ms) before it is forwarded.
    hold_next_get_ms: std::sync::atomic::AtomicU64,
    /// Every connection accepted (and its upstream), shut down when the store goes down.
    open: Mutex<Vec<TcpStream>>,
}

/// A loopback endpoint in front of `upstream` (`host:port`).
pub(crate) struct FakeStore {
    port: u16,
    upstream: String,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl FakeStore {
    /// A store forwarding to `upstream` (an `http://host:port` endpoint), up.
    pub(crate) fn forwarding(upstream: &str) -> FakeStore {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut s = FakeStore {
            port,
            upstream: upstream.trim_start_matches("http://").to_string(),
            shared: Arc::new(Shared {
                mode: AtomicU8::new(Mode::Forward as u8),
                stop: AtomicBool::new(false),
                hold_next_get_ms: Default::default(),
                open: Mutex::default(),
            }),
            accept: None,
        };
        s.serve(listener);
        s
    }

    /// Its endpoint (`http://127.0.0.1:PORT`), the same while it is down.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it does with new connections (and, for `Hang`, already open ones: they stop
    /// forwarding).
    pub(crate) fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
        if mode == Mode::Hang {
            self.close_open();
        }
    }

    /// Holds the next GET of an object (not a listing or a HEAD) for `ms` before forwarding it:
    /// the test changes the store meanwhile, between an open's listing and its reads.
    pub(crate) fn hold_next_get(&self, ms: u64) {
        self.shared.hold_next_get_ms.store(ms, Ordering::SeqCst);
    }

    /// Down: its port refuses connections, and the connections open are cut.
    pub(crate) fn down(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            t.join().unwrap();
        }
        self.close_open();
    }

    /// Up again on the same port.
    pub(crate) fn up(&mut self) {
        assert!(self.accept.is_none(), "already up");
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("port {} taken meanwhile: {e}", self.port));
        self.shared.stop.store(false, Ordering::SeqCst);
        self.serve(listener);
    }

    fn close_open(&self) {
        for c in self.shared.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn serve(&mut self, listener: TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let shared = self.shared.clone();
        let upstream = self.upstream.clone();
        self.accept = Some(std::thread::spawn(move || {
            while !shared.stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(_) => continue,
                };
                client.set_nonblocking(false).unwrap();
                shared
                    .open
                    .lock()
                    .unwrap()
                    .push(client.try_clone().unwrap());
                if shared.mode.load(Ordering::SeqCst) == Mode::Hang as u8 {
                    // Read (so the client's request is sent) and keep the socket open.
                    let mut c = client;
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
                    });
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                shared
                    .open
                    .lock()
                    .unwrap()
                    .push(server.try_clone().unwrap());
                pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    Some(shared.clone()),
                );
                pipe(server, client, None);
            }
            // Dropping the listener closes the port.
        }));
    }
}

impl Drop for FakeStore {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.down();
        }
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes; requests (`holds`:
/// the client's side) held as [`FakeStore::hold_next_get`] says.
fn pipe(mut from: TcpStream, mut to: TcpStream, holds: Option<Arc<Shared>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    // A request's head arrives in one read: an object's GET has no query.
                    let head = &buf[..n.min(512)];
                    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
                    if let Some(h) = &holds {
                        if line.starts_with(b"GET /") && !line.contains(&b'?') {
                            let ms = h.hold_next_get_ms.swap(0, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(ms));
                        }
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
