//! numpy's f32 matmul throughput, measured by `python3` running an embedded script in a
//! subprocess, for comparison with mirra's in the same run.
//!
//! The subprocess gets the same thread count (`OPENBLAS_NUM_THREADS` and friends, and
//! `threadpoolctl` when it is installed) and runs without `OPENBLAS_CORETYPE` and
//! `OPENBLAS_L2_SIZE`: some machines set them, and a forced core type (e.g. `Haswell` on
//! an AVX-512 CPU) makes OpenBLAS pick a slower kernel than it would detect itself.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

use serde_json::{json, Value};

use crate::timing::{Plan, Samples};

/// Variables removed from the numpy subprocess's environment.
pub const UNSET_ENV: [&str; 2] = ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"];

/// The interpreter.
const PYTHON: &str = "python3";

/// A small server: prints one JSON line of facts (numpy and BLAS versions, the BLAS
/// kernel), then answers each stdin line `n warm_up_s repeats min_repeat_s` with one JSON
/// line `{"n", "per_call": [seconds...], "calls"}` timing `numpy.matmul` of two `n x n` f32
/// matrices; exits at end of input. On an import error the first line is `{"error": ...}`.
/// A persistent process lets mirra and numpy alternate size by size on a noisy machine.
const SCRIPT: &str = r#"
import json, sys, time
threads = int(sys.argv[1])
try:
    import numpy as np
except Exception as e:
    print(json.dumps({"error": "cannot import numpy: %s" % e}), flush=True)
    sys.exit(0)
info = {"numpy_version": np.__version__, "threads": threads}
try:
    import threadpoolctl
    limits = threadpoolctl.threadpool_limits(limits=threads, user_api="blas")
    keys = ("internal_api", "architecture", "version", "num_threads", "threading_layer", "prefix", "filepath")
    info["blas"] = [{k: d.get(k) for k in keys} for d in threadpoolctl.threadpool_info() if d.get("user_api") == "blas"]
except ImportError:
    info["blas"] = None
    info["blas_note"] = "threadpoolctl is not installed: threads set by OPENBLAS_NUM_THREADS only, kernel unknown"
try:
    cfg = np.show_config(mode="dicts")
    info["build_blas"] = cfg.get("Build Dependencies", {}).get("blas")
except Exception:
    pass
print(json.dumps(info), flush=True)
rng = np.random.default_rng(0)
cache = {}
for line in sys.stdin:
    parts = line.split()
    if not parts:
        continue
    n, warm_up, repeats, min_repeat = int(parts[0]), float(parts[1]), int(parts[2]), float(parts[3])
    if n not in cache:
        cache[n] = tuple(rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(2))
    a, b = cache[n]
    t0, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - t0 < warm_up:
        c = np.matmul(a, b)
        calls += 1
    assert c.dtype == np.float32
    per = (time.perf_counter() - t0) / calls
    k = max(1, int(-(-min_repeat // per)))
    samples = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        for _ in range(k):
            c = np.matmul(a, b)
        samples.append((time.perf_counter() - t) / k)
    print(json.dumps({"n": n, "per_call": samples, "calls": k}), flush=True)
"#;

/// A short reason from a failed command's output.
fn reason(what: &str, out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    format!("{what} failed ({}): {}", out.status, last.trim())
}

fn python(args: &[&str]) -> std::io::Result<Output> {
    Command::new(PYTHON)
        .args(args)
        .stdin(Stdio::null())
        .output()
}

pub(crate) fn can_import(module: &str) -> bool {
    python(&["-c", &format!("import {module}")]).is_ok_and(|o| o.status.success())
}

fn pip_install(packages: &[&str]) -> Result<(), String> {
    let mut args = vec!["-m", "pip", "install", "--quiet"];
    args.extend_from_slice(packages);
    println!("numpy: running `{PYTHON} {}`", args.join(" "));
    match python(&args) {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(reason("pip install", &out)),
        Err(e) => Err(format!("cannot run {PYTHON} -m pip: {e}")),
    }
}

/// Makes sure `python3` can import numpy (installing it with pip if needed) and, best
/// effort, threadpoolctl (which reports the BLAS kernel). Returns the Python version.
pub fn prepare() -> Result<String, String> {
    let version = match python(&["--version"]) {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            text.trim().to_owned()
        }
        Ok(out) => return Err(reason(&format!("{PYTHON} --version"), &out)),
        Err(e) => return Err(format!("{PYTHON} is not available: {e}")),
    };
    if !can_import("numpy") {
        println!("numpy: not installed for {version}; installing it with pip");
        pip_install(&["numpy", "threadpoolctl"])?;
        if !can_import("numpy") {
            return Err("numpy still cannot be imported after pip install".into());
        }
    } else if !can_import("threadpoolctl") {
        println!("numpy: threadpoolctl (reports the BLAS kernel) is missing; installing it");
        if let Err(e) = pip_install(&["threadpoolctl"]) {
            println!("numpy: {e}; continuing without it");
        }
    }
    Ok(version)
}

/// A running numpy benchmark process.
#[derive(Debug)]
pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// numpy's version and BLAS facts, for the report.
    pub info: Value,
}

impl Session {
    /// Starts the embedded script with `threads` BLAS threads and without the variables of
    /// [`UNSET_ENV`].
    pub fn start(threads: usize) -> Result<Session, String> {
        let mut cmd = Command::new(PYTHON);
        cmd.arg("-c")
            .arg(SCRIPT)
            .arg(threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for var in UNSET_ENV {
            cmd.env_remove(var);
        }
        for var in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            cmd.env(var, threads.to_string());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {PYTHON}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut session = Session {
            child,
            stdin,
            stdout,
            info: Value::Null,
        };
        let info = session.read_line()?;
        if let Some(err) = info.get("error").and_then(Value::as_str) {
            return Err(err.to_owned());
        }
        session.info = info;
        Ok(session)
    }

    /// Seconds per `numpy.matmul` of two `n x n` f32 matrices, under `plan`.
    pub fn time(&mut self, n: usize, plan: Plan) -> Result<Samples, String> {
        let request = format!(
            "{n} {} {} {}\n",
            plan.warm_up.as_secs_f64(),
            plan.repeats,
            plan.min_repeat.as_secs_f64()
        );
        let Some(stdin) = self.stdin.as_mut() else {
            return Err("the numpy process is closed".into());
        };
        if let Err(e) = stdin
            .write_all(request.as_bytes())
            .and_then(|()| stdin.flush())
        {
            return Err(self.failure(&format!("cannot write to the numpy process: {e}")));
        }
        let v = self.read_line()?;
        let per_call: Vec<f64> = v["per_call"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if per_call.is_empty() {
            return Err(format!(
                "the numpy script returned no timing for n = {n}: {v}"
            ));
        }
        let calls = v["calls"].as_u64().unwrap_or(1);
        Ok(Samples { per_call, calls })
    }

    fn read_line(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err(self.failure("the numpy script ended early")),
            Ok(_) => serde_json::from_str(&line)
                .map_err(|e| format!("the numpy script printed `{}` ({e})", line.trim())),
            Err(e) => Err(self.failure(&format!("cannot read from the numpy process: {e}"))),
        }
    }

    /// `what`, with the last line of the script's stderr once it has ended.
    fn failure(&mut self, what: &str) -> String {
        // Closing stdin ends the script; read its stderr to the end before reaping it, so
        // that a long traceback cannot block it on a full pipe.
        self.stdin = None;
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.child.wait();
        match err.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => format!("{what}: {}", last.trim()),
            None => what.to_owned(),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // End of input ends the script.
        self.stdin = None;
        let _ = self.child.wait();
    }
}

/// The values the variables of [`UNSET_ENV`] had in this process (`null` when unset).
pub fn unset_env_record() -> Value {
    let mut m = serde_json::Map::new();
    for var in UNSET_ENV {
        m.insert(
            var.into(),
            std::env::var(var).map_or(Value::Null, Value::String),
        );
    }
    json!(m)
}
