//! Starts a real S3-compatible server (`s3s-fs`) on a free port of 127.0.0.1 over a temporary directory, for
//! the S3 tests and the S3 benchmark. `cargo xtask test` installs the binary (`cargo install s3s-fs@0.14.1
//! --features binary --locked`); it is looked up in `SPDL_S3S_FS`, then `PATH`, then `$CARGO_HOME/bin` and
//! `~/.cargo/bin`. Set `SPDL_SKIP_S3=1` to skip the S3 tests on a machine without it.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "spdl-test-access";
pub const SECRET_KEY: &str = "spdl-test-secret-key";

/// A running s3s-fs; killed and its directory removed on drop.
pub struct S3sServer {
    child: Child,
    pub endpoint: String,
    pub dir: tempfile::TempDir,
}

impl Drop for S3sServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary_name() -> &'static str {
    if cfg!(windows) { "s3s-fs.exe" } else { "s3s-fs" }
}

/// Where the s3s-fs binary is, if anywhere.
pub fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SPDL_S3S_FS") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(cargo_home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(cargo_home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo").join("bin"));
    }
    dirs.into_iter().map(|d| d.join(binary_name())).find(|p| p.is_file())
}

/// Starts a server, or returns `None` when s3s-fs is missing and `SPDL_SKIP_S3=1`. Panics when it is missing
/// otherwise: a silently skipped S3 suite is a suite that never runs.
pub fn start() -> Option<S3sServer> {
    let Some(binary) = find_binary() else {
        if std::env::var("SPDL_SKIP_S3").is_ok_and(|v| v == "1") {
            eprintln!("s3s-fs not found and SPDL_SKIP_S3=1: skipping the S3 test");
            return None;
        }
        panic!(
            "the S3 tests need the s3s-fs server: run `cargo xtask test` (which installs it), or \
             `cargo install s3s-fs@0.14.1 --features binary --locked`, or point SPDL_S3S_FS at the binary; \
             set SPDL_SKIP_S3=1 to skip these tests"
        );
    };
    let mut last_error = String::new();
    // A free port can be taken between probing and binding: try a few.
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("temporary directory for s3s-fs");
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut child = Command::new(&binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                last_error = format!("s3s-fs exited with {status} before listening on {addr}");
                break;
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Some(S3sServer { child, endpoint: format!("http://{addr}"), dir });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                last_error = format!("s3s-fs did not listen on {addr} within 60 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("{last_error}");
}
