//! A real `redis-server` of the caller's own, on a free loopback port, for
//! the quota's tests and `examples/fleet_quota.rs` (which include this file).
//!
//! Where `redis-server` is not installed, [`RedisServer::start`] returns
//! `None` after printing why, so a plain `cargo test` on such a machine
//! skips; with `ADMISSION_REQUIRE_REDIS=1` (set by `scripts/test-all.sh`,
//! which installs it) a missing server is a failure instead.

#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes a missing `redis-server` a failure.
pub const REQUIRE_REDIS: &str = "ADMISSION_REQUIRE_REDIS";

/// A `redis-server` process on 127.0.0.1, killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// A server on a free port, or `None` (with a line saying so) where
    /// `redis-server` cannot be run and the caller did not require it.
    ///
    /// # Panics
    ///
    /// Where the server is required (`ADMISSION_REQUIRE_REDIS=1`) and
    /// cannot be started.
    pub fn start(what: &str) -> Option<RedisServer> {
        let port = free_port();
        let mut server = RedisServer { port, child: None };
        match server.spawn() {
            Ok(()) => Some(server),
            Err(why) => {
                if std::env::var(REQUIRE_REDIS).is_ok_and(|value| value == "1") {
                    panic!("{what}: {REQUIRE_REDIS}=1 but redis-server could not start: {why}");
                }
                println!("skipped {what}: redis-server could not start ({why})");
                let _ = std::io::stdout().flush();
                None
            }
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("redis-server: {error}"))?;
        self.child = Some(child);
        // It takes a few milliseconds to listen.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if TcpStream::connect(self.addr()).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("redis-server exited: {status}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err("redis-server did not listen within 10 s".into())
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye, no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    ///
    /// # Panics
    ///
    /// If it cannot be started again.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn().expect("redis-server starts again on its port");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}
