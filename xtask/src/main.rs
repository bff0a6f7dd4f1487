//! `cargo xtask`: the one entry point that people and CI share.

fn main() {
    eprintln!("usage: cargo xtask <bench>");
    std::process::exit(2);
}
