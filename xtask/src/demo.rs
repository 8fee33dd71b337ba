//! `cargo xtask demo`: set up, build, start the demo backends, and run the controller on the
//! bundled manifests in `deploy/examples/`, on loopback ports a user can curl without root.
//!
//! ```text
//!   127.0.0.1:9101, :9102  hello-1, hello-2   (Service demo/hello)
//!   127.0.0.1:9103         api-1              (Service demo/api)
//!   127.0.0.1:8080 HTTP, :8443 HTTPS, :10254 admin   ingress
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::toolchain::RouteArg;
use crate::workspace::Workspace;

#[derive(clap::Args)]
pub struct Args {
    /// Build with the release profile (slower to build, faster to run).
    #[arg(long)]
    pub release: bool,
    /// Skip `setup` (installing missing Debian packages and bpf-linker).
    #[arg(long)]
    pub no_setup: bool,
}

const BACKENDS: [(&str, u16); 3] = [("hello-1", 9101), ("hello-2", 9102), ("api-1", 9103)];

pub fn run(args: &Args) -> Result<()> {
    if !args.no_setup
        && let Err(err) = crate::setup::run(&crate::setup::Args { build_only: false })
    {
        eprintln!("setup failed ({err:#}); continuing, the build may fall back to userspace-only");
    }
    let build = crate::build::Args {
        release: args.release,
        route: RouteArg { route: None },
    };
    let ws = Workspace::locate()?;
    let binary = match crate::build::run(&build) {
        Ok(()) => ws
            .target_dir
            .join(if args.release { "release" } else { "debug" })
            .join("ingress"),
        Err(err) => {
            eprintln!("building with eBPF failed ({err:#}); building the userspace-only binary");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "ingress"]).current_dir(&ws.root);
            if args.release {
                cmd.arg("--release");
            }
            anyhow::ensure!(cmd.status()?.success(), "cargo build -p ingress failed");
            ws.target_dir
                .join(if args.release { "release" } else { "debug" })
                .join("ingress")
        }
    };
    for (name, port) in BACKENDS {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("demo backend {name} on 127.0.0.1:{port}"))?;
        std::thread::spawn(move || serve(listener, name));
    }
    println!(
        "\ndemo backends on 127.0.0.1:9101-9103; starting ingress on http://127.0.0.1:8080, https://127.0.0.1:8443, admin http://127.0.0.1:10254\n\
         try:  curl -H 'Host: demo.local' http://127.0.0.1:8080/\n\
         \x20     curl -k --resolve demo.local:8443:127.0.0.1 https://demo.local:8443/api/users\n\
         \x20     curl http://127.0.0.1:10254/routes\n\
         Ctrl-C stops everything.\n"
    );
    let status = Command::new(&binary)
        .arg("--manifests")
        .arg(ws.root.join("deploy").join("examples"))
        .args([
            "--bind",
            "127.0.0.1",
            "--http-port",
            "8080",
            "--https-port",
            "8443",
            "--admin-port",
            "10254",
        ])
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    anyhow::ensure!(status.success(), "ingress exited with {status}");
    Ok(())
}

/// A tiny HTTP/1.1 server that says who it is and what it was asked; keep-alive aware.
fn serve(listener: TcpListener, name: &'static str) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = answer(stream, name);
        });
    }
}

fn answer(stream: TcpStream, name: &str) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut host = String::new();
        let mut forwarded_for = String::new();
        let mut close = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("host:") {
                host = v.trim().to_string();
            } else if let Some(v) = lower.strip_prefix("x-forwarded-for:") {
                forwarded_for = v.trim().to_string();
            } else if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let body = format!(
            "hello from {name}\nrequest: {}\nhost: {host}\nx-forwarded-for: {forwarded_for}\n",
            request_line.trim_end()
        );
        write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        if close {
            return Ok(());
        }
    }
}
