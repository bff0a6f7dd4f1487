//! A `mirra` binary copied away from the checkout it was built in trains on the test set
//! embedded in it: the default data no longer comes from the checkout's absolute path.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the binary `copy` as `mirra train --epochs 1 --history <dir>/history.json` from
/// `dir`, with the checkout hidden under an empty tmpfs in a private mount namespace when
/// the system allows one (`unshare`); `None` when it does not.
fn run_with_checkout_hidden(checkout: &Path, dir: &Path, copy: &Path) -> Option<Output> {
    let script = r#"
        mount -t tmpfs none "$1" || exit 97
        # The old default, <checkout>/data/mnist, is gone.
        if [ -e "$1/data/mnist" ]; then echo "the checkout is still visible" >&2; exit 98; fi
        cd "$2" && exec "$3" train --epochs 1 --history "$2/history.json"
    "#;
    let out = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .args([checkout, dir, copy])
        .output()
        .ok()?;
    // 97: no mount allowed; unshare's own failure (no user namespaces) exits 1 before sh.
    let unshare_failed =
        !out.status.success() && String::from_utf8_lossy(&out.stderr).starts_with("unshare:");
    if out.status.code() == Some(97) || unshare_failed {
        return None;
    }
    Some(out)
}

#[test]
fn a_copied_binary_trains_without_the_checkout() {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    assert!(
        !dir_path.starts_with(&checkout),
        "the temporary directory {} is inside the checkout",
        dir_path.display()
    );
    let copy = dir_path.join("mirra");
    std::fs::copy(env!("CARGO_BIN_EXE_mirra"), &copy).unwrap();

    let out = match run_with_checkout_hidden(&checkout, &dir_path, &copy) {
        Some(out) => out,
        None => {
            println!(
                "no private mount namespace here: the copy runs from {} with the checkout \
                 still in place",
                dir_path.display()
            );
            Command::new(&copy)
                .args(["train", "--epochs", "1", "--history"])
                .arg(dir_path.join("history.json"))
                .current_dir(&dir_path)
                .output()
                .unwrap()
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("on 8000 samples, validating on 2000"),
        "{stdout}"
    );
    let h: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir_path.join("history.json")).unwrap()).unwrap();
    let val = h["val_accuracy"][0].as_f64().unwrap();
    assert!(val > 0.85, "validation accuracy {val}");
}
