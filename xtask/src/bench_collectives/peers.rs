//! The peers measured beside mirra in the same run: OpenMPI's own `MPI_Allreduce` between
//! processes of this machine (its shared-memory transport), and gloo's through
//! `torch.distributed`. Both programs live in `benches/peers/` and time an all-reduce the
//! way [`ranks`](crate::ranks) times mirra's: inputs written afresh before every
//! iteration, a barrier, the all-reduce alone timed on every rank, the slowest rank's
//! time, every iteration checked against the closed form. A peer that is not installed
//! (no `mpirun`/`mpicc`, `torch` does not import) or fails gives no rows, and says why.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::nccl::{size_label, Op, Row};
use crate::timing::median;

/// The interpreter that runs the gloo program.
const PYTHON: &str = "python3";
/// The longest one world size of one peer may run before it is killed.
const DEADLINE: Duration = Duration::from_secs(900);

/// A peer of mirra's collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    OpenMpi,
    Gloo,
    /// mirra's own `mpi` backend, one rank per process: run as the peers are (under
    /// `mpirun`, the same protocol), but chosen with `--backends mpi`, not `--peers`.
    MirraMpi,
}

impl Peer {
    pub const ALL: [Peer; 2] = [Peer::OpenMpi, Peer::Gloo];

    /// The name in tables, flags and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Peer::OpenMpi => "openmpi",
            Peer::Gloo => "gloo",
            Peer::MirraMpi => "mpi",
        }
    }

    /// What runs, in words.
    pub const fn what(self) -> &'static str {
        match self {
            Peer::OpenMpi => "OpenMPI's MPI_Allreduce between processes (mpirun, shared memory)",
            Peer::Gloo => "gloo's all_reduce through torch.distributed, between processes",
            Peer::MirraMpi => {
                "mirra's mpi backend between processes (mpirun, a rank per process; \
                 crates/mirra-collectives/examples/mpi_allreduce.rs)"
            }
        }
    }
}

/// `--peers`: a comma-separated list of peer names, or `none`.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    if s.trim() == "none" {
        return Ok(vec![]);
    }
    let mut peers = Vec::new();
    for name in s.split(',').map(str::trim) {
        let peer = Peer::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| format!("unknown peer `{name}` (known: openmpi, gloo, or none)"))?;
        if !peers.contains(&peer) {
            peers.push(peer);
        }
    }
    Ok(peers)
}

/// One size to measure: the message's bytes, warm-up and timed iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizePlan {
    pub bytes: usize,
    pub warmup: usize,
    pub iters: usize,
}

impl SizePlan {
    /// The programs' `BYTES:WARMUP:ITERS` argument.
    fn arg(&self) -> String {
        format!("{}:{}:{}", self.bytes, self.warmup, self.iters)
    }
}

/// What one peer's run gave.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRun {
    pub peer: Peer,
    /// The peer's version, or why it could not run at all.
    pub found: Result<String, String>,
    /// The command of the last world size run (for the record).
    pub command: String,
    /// One all-reduce row per world size and size.
    pub rows: Vec<Row>,
    /// World sizes that failed, and why.
    pub failures: Vec<(usize, String)>,
}

impl PeerRun {
    /// Why this peer has no usable row at `n` ranks of `bytes` (`None` when it has one).
    pub fn missing(&self, n: usize, bytes: usize) -> Option<String> {
        let name = self.peer.name();
        if let Err(why) = &self.found {
            return Some(format!("{name} missing: {why}"));
        }
        if let Some((_, why)) = self.failures.iter().find(|(m, _)| *m == n) {
            return Some(format!("{name} failed at {n} ranks: {why}"));
        }
        match self.row(n, bytes) {
            None => Some(format!(
                "{name} has no all_reduce at {n} ranks of {}",
                size_label(bytes)
            )),
            Some(r) if r.wrong > 0 => Some(format!(
                "{name}'s all_reduce at {n} ranks of {} had {} wrong elements",
                size_label(bytes),
                r.wrong
            )),
            Some(_) => None,
        }
    }

    /// The row at `n` ranks of `bytes`, if measured.
    pub fn row(&self, n: usize, bytes: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.world_size == n && r.bytes == bytes)
    }

    /// The run as it lands in `collectives.json`.
    pub fn json(&self) -> Value {
        json!({
            "peer": self.peer.name(),
            "what": self.peer.what(),
            "available": self.found.is_ok(),
            "version": self.found.as_ref().ok(),
            "missing": self.found.as_ref().err(),
            "command": self.command,
            "rows": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
            "failures": self.failures.iter().map(|(n, why)| json!({
                "world_size": n,
                "error": why,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Runs `peer` at every world size over `sizes`; `copy(n, bytes)` is the copy rate the
/// rows are put beside. `root` is the workspace, `target` cargo's target directory (where
/// the MPI program is built).
pub fn run(
    peer: Peer,
    world_sizes: &[usize],
    sizes: &[SizePlan],
    root: &Path,
    target: &Path,
    copy: impl Fn(usize, usize) -> Option<f64>,
) -> PeerRun {
    let mut out = PeerRun {
        peer,
        found: Err("not run".into()),
        command: String::new(),
        rows: vec![],
        failures: vec![],
    };
    let program = match peer {
        Peer::OpenMpi => build_mpi(root, target),
        Peer::MirraMpi => build_mirra_mpi(root, target),
        Peer::Gloo => Ok((String::new(), root.join("benches/peers/gloo_allreduce.py"))),
    };
    let (mut version, program) = match program {
        Ok(p) => p,
        Err(why) => {
            out.found = Err(why);
            return out;
        }
    };
    let specs: Vec<String> = sizes.iter().map(SizePlan::arg).collect();
    for &n in world_sizes {
        let mut cmd = match peer {
            Peer::OpenMpi | Peer::MirraMpi => {
                let mut c = Command::new("mpirun");
                c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
                    .arg(n.to_string())
                    .arg(&program);
                c
            }
            Peer::Gloo => {
                let mut c = Command::new(PYTHON);
                c.arg(&program).arg(n.to_string());
                c
            }
        };
        cmd.args(&specs);
        out.command = format!("{cmd:?}").replace('"', "");
        let lines = match run_to_end(cmd, DEADLINE) {
            Ok(lines) => lines,
            Err(why) => {
                // gloo says first when torch does not import: then no world size can run.
                if let Some(e) = why.strip_prefix(GLOO_UNAVAILABLE) {
                    out.found = Err(e.to_string());
                    return out;
                }
                out.failures.push((n, why));
                continue;
            }
        };
        match parse(peer, n, &lines, &copy) {
            Ok((v, rows)) => {
                if let Some(v) = v {
                    version = v;
                }
                out.rows.extend(rows);
            }
            Err(why) => out.failures.push((n, why)),
        }
    }
    out.found = Ok(version);
    out
}

/// What [`run_to_end`]'s error starts with when gloo's program says torch is missing.
const GLOO_UNAVAILABLE: &str = "unavailable: ";

/// `mpirun`'s version (`Open MPI 4.1.4`), or why it does not run.
fn mpirun_version() -> Result<String, String> {
    let out = Command::new("mpirun")
        .arg("--version")
        .output()
        .map_err(|e| format!("mpirun does not run ({e}); ci/install-mpi.sh installs OpenMPI"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("mpirun (unknown version)")
        .replace("mpirun (Open MPI)", "Open MPI")
        .trim()
        .to_string())
}

/// `mpirun`'s version, and the MPI program built with `mpicc` into `target/peers/`.
fn build_mpi(root: &Path, target: &Path) -> Result<(String, PathBuf), String> {
    let install = "ci/install-mpi.sh installs OpenMPI";
    let version = mpirun_version()?;
    let dir = target.join("peers");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let binary = dir.join("mpi_allreduce");
    let built = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(root.join("benches/peers/mpi_allreduce.c"))
        .output()
        .map_err(|e| format!("mpicc does not run ({e}); {install}"))?;
    if !built.status.success() {
        return Err(format!(
            "mpicc failed: {}",
            tail(&String::from_utf8_lossy(&built.stderr))
        ));
    }
    Ok((version, binary))
}

/// mirra's MPI program (`--features mpi`, which needs OpenMPI and libclang), built in
/// release, and what it runs on.
fn build_mirra_mpi(root: &Path, target: &Path) -> Result<(String, PathBuf), String> {
    let built = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["build", "--release", "--locked", "-p", "mirra-collectives"])
        .args(["--features", "mpi", "--example", "mpi_allreduce"])
        .output()
        .map_err(|e| format!("cargo does not run: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "building it with --features mpi failed (ci/install-mpi.sh installs OpenMPI and \
             libclang): {}",
            tail(&String::from_utf8_lossy(&built.stderr))
        ));
    }
    Ok((
        format!("mirra mpi over {}", mpirun_version()?),
        target.join("release/examples/mpi_allreduce"),
    ))
}

/// The last few lines of a program's error output.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// Runs `cmd` to its end (killed after `deadline`) and returns its output lines, or why it
/// failed. gloo's "torch does not import" comes back prefixed with [`GLOO_UNAVAILABLE`].
fn run_to_end(mut cmd: Command, deadline: Duration) -> Result<Vec<String>, String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{name} does not run: {e}"))?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = wait_until(&mut child, deadline);
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    if let Some(first) = lines.first() {
        if let Ok(v) = serde_json::from_str::<Value>(first) {
            if let Some(e) = v["error"].as_str() {
                return Err(format!("{GLOO_UNAVAILABLE}{e}"));
            }
        }
    }
    match status {
        None => Err(format!(
            "killed after {} s without finishing",
            deadline.as_secs()
        )),
        Some(Ok(s)) if s.success() => Ok(lines),
        Some(Ok(s)) => Err(format!("{name} exited with {s}: {}", tail(&stderr))),
        Some(Err(e)) => Err(format!("cannot wait for {name}: {e}")),
    }
}

/// Waits for `child` until `deadline` has passed, then kills it (`None`).
fn wait_until(
    child: &mut Child,
    deadline: Duration,
) -> Option<std::io::Result<std::process::ExitStatus>> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Ok(status)),
            Ok(None) if start.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

/// The version (gloo's first line) and the rows of one world size's output.
fn parse(
    peer: Peer,
    n: usize,
    lines: &[String],
    copy: &impl Fn(usize, usize) -> Option<f64>,
) -> Result<(Option<String>, Vec<Row>), String> {
    let mut version = None;
    let mut rows = Vec::new();
    for line in lines.iter().filter(|l| l.trim_start().starts_with('{')) {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| format!("cannot read the line `{line}`: {e}"))?;
        if let Some(t) = v["torch"].as_str() {
            version = Some(format!("torch {t} (gloo)"));
            continue;
        }
        let field = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("the line `{line}` has no {k}"))
        };
        let seconds: Vec<f64> = v["seconds"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if seconds.is_empty() || !seconds.iter().all(|s| *s > 0.0) {
            return Err(format!("the line `{line}` has no positive timings"));
        }
        let bytes = field("bytes")? as usize;
        rows.push(Row {
            backend: peer.name().to_string(),
            world_size: n,
            op: Op::AllReduce,
            dtype: "f32",
            bytes,
            count: field("count")? as usize,
            seconds: median(&seconds),
            wrong: field("wrong")?,
            copy_gbs: copy(n, bytes),
        });
    }
    if rows.is_empty() {
        return Err("it printed no result".into());
    }
    Ok((version, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_lists_parse() {
        assert_eq!(parse_peers("none").unwrap(), vec![]);
        assert_eq!(
            parse_peers("gloo,openmpi,gloo").unwrap(),
            vec![Peer::Gloo, Peer::OpenMpi]
        );
        assert!(parse_peers("nccl")
            .unwrap_err()
            .contains("unknown peer `nccl`"));
        assert!(parse_peers("").is_err());
    }

    #[test]
    fn output_lines_become_rows() {
        let lines: Vec<String> = [
            r#"{"torch": "2.15.0"}"#,
            "some warning",
            r#"{"bytes": 4096, "count": 1024, "warmup": 1, "seconds": [3e-6, 1e-6, 2e-6], "wrong": 0}"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (v, rows) = parse(Peer::Gloo, 2, &lines, &|_, _| Some(7.0)).unwrap();
        assert_eq!(v.as_deref(), Some("torch 2.15.0 (gloo)"));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.backend.as_str(), r.world_size, r.bytes),
            ("gloo", 2, 4096)
        );
        assert_eq!((r.seconds, r.wrong, r.copy_gbs), (2e-6, 0, Some(7.0)));
        // Broken output is an error, not a row.
        for bad in [
            r#"{"bytes": 4096, "count": 1024, "seconds": [], "wrong": 0}"#,
            r#"{"bytes": 4096, "count": 1024, "seconds": [0.0], "wrong": 0}"#,
            r#"{"bytes": 4096, "seconds": [1.0], "wrong": 0}"#,
            r#"{"bytes": 4096,"#,
        ] {
            assert!(parse(Peer::OpenMpi, 2, &[bad.to_string()], &|_, _| None).is_err());
        }
        assert!(parse(Peer::OpenMpi, 2, &[], &|_, _| None).is_err());
    }

    #[test]
    fn a_missing_row_says_why() {
        let row = |n: usize, wrong: u64| Row {
            backend: "openmpi".into(),
            world_size: n,
            op: Op::AllReduce,
            dtype: "f32",
            bytes: 4096,
            count: 1024,
            seconds: 1e-5,
            wrong,
            copy_gbs: None,
        };
        let run = PeerRun {
            peer: Peer::OpenMpi,
            found: Ok("Open MPI 4.1.4".into()),
            command: String::new(),
            rows: vec![row(2, 0), row(4, 3)],
            failures: vec![(8, "exited with 1".into())],
        };
        assert_eq!(run.missing(2, 4096), None);
        assert!(run.missing(4, 4096).unwrap().contains("3 wrong elements"));
        assert!(run.missing(2, 64 << 20).unwrap().contains("no all_reduce"));
        assert!(run.missing(8, 4096).unwrap().contains("failed at 8 ranks"));
        let gone = PeerRun {
            found: Err("mpirun does not run".into()),
            ..run
        };
        assert_eq!(
            gone.missing(2, 4096).unwrap(),
            "openmpi missing: mpirun does not run"
        );
        assert_eq!(gone.json()["available"], false);
    }

    #[test]
    fn a_program_that_fails_or_hangs_is_reported() {
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo oops >&2; exit 4"]);
        let e = run_to_end(sh, Duration::from_secs(10)).unwrap_err();
        assert!(e.contains("exited with") && e.contains("oops"), "{e}");
        let mut sleep = Command::new("sleep");
        sleep.arg("5");
        let t = Instant::now();
        let e = run_to_end(sleep, Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("killed after"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(4));
        let mut torchless = Command::new("sh");
        torchless.args([
            "-c",
            r#"echo '{"error": "torch does not import: x"}'; exit 3"#,
        ]);
        let e = run_to_end(torchless, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e, format!("{GLOO_UNAVAILABLE}torch does not import: x"));
    }
}
