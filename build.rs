//! Link options of the `runner` executable that only the build can decide.
//!
//! - **Hot code first** (release builds, by default where the linker is known to be LLD): the
//!   functions a served run, a workflow test and a validation execute are laid out together at
//!   the start of `.text`, in the order `scripts/symbol-order.txt` lists them (made by
//!   `scripts/symbol-order.sh`). The kernel maps code 64 KiB around each page touched, so
//!   scattered hot functions kept 12.6 MiB of the 18.7 MB `.text` resident while serving;
//!   grouped, 4 to 6 MiB. A name the file lists that the binary lacks (the file is older than
//!   the code) is skipped silently. `RUNNER_SYMBOL_ORDER=0` turns it off, `=1` forces it on for
//!   a linker this script cannot vouch for.
//! - **Packed relative relocations** (DT_RELR) when asked to: a position-independent
//!   executable's relocation table shrinks from about a megabyte, read at every start, to a few
//!   kilobytes. Such a binary starts only on glibc 2.36 or newer, so the choice belongs to
//!   whoever decides where the binary will run (the release archive declares its floor), never
//!   to the glibc the build machine happens to have: set `RUNNER_PACKED_RELOCS=1` to opt in.

use std::path::Path;
use std::process::Command;

const ORDER_FILE: &str = "scripts/symbol-order.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // A file that is not there would be taken for changed at every build (a package without it).
    if Path::new(ORDER_FILE).exists() {
        println!("cargo:rerun-if-changed={ORDER_FILE}");
    }
    println!("cargo:rerun-if-env-changed=RUNNER_PACKED_RELOCS");
    println!("cargo:rerun-if-env-changed=RUNNER_SYMBOL_ORDER");
    let target = std::env::var("TARGET").unwrap_or_default();
    symbol_order(&target);
    packed_relocs(&target);
}

fn symbol_order(target: &str) {
    let wanted = match std::env::var("RUNNER_SYMBOL_ORDER").as_deref() {
        Ok("0") => return,
        Ok("1") => true,
        _ => std::env::var("PROFILE").as_deref() == Ok("release") && links_with_default_lld(target),
    };
    let file = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join(ORDER_FILE);
    if wanted && file.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            file.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether rustc links this target with its own LLD: the default on x86_64 Linux (glibc) since
/// Rust 1.90, unless a linker or linker flavour is configured.
fn links_with_default_lld(target: &str) -> bool {
    if target != "x86_64-unknown-linux-gnu" || std::env::var_os("RUSTC_LINKER").is_some() {
        return false;
    }
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") || flags.contains("fuse-ld") {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("-vV").output() else {
        return false;
    };
    let version = String::from_utf8_lossy(&out.stdout);
    let release = version
        .lines()
        .find_map(|l| l.strip_prefix("release: "))
        .unwrap_or_default();
    let mut parts = release.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}

fn packed_relocs(target: &str) {
    if std::env::var("RUNNER_PACKED_RELOCS").as_deref() != Ok("1") {
        return;
    }
    let host = std::env::var("HOST").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        println!("cargo:warning=RUNNER_PACKED_RELOCS=1 is ignored: {target} is not a glibc target");
        return;
    }
    // A cross build links against a sysroot this script cannot see: the opt-in is trusted.
    if target == host && !glibc_has_relr(target) {
        println!("cargo:warning=RUNNER_PACKED_RELOCS=1 is ignored: the C library linked against predates glibc 2.36");
        return;
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

/// Whether the C library this build links against defines the `GLIBC_ABI_DT_RELR` version
/// (the loader refuses DT_RELR binaries without it).
fn glibc_has_relr(target: &str) -> bool {
    let arch = target.split('-').next().unwrap_or_default();
    let candidates = [
        format!("/lib/{arch}-linux-gnu/libc.so.6"),
        format!("/usr/lib/{arch}-linux-gnu/libc.so.6"),
        "/lib64/libc.so.6".to_string(),
        "/usr/lib64/libc.so.6".to_string(),
        "/usr/lib/libc.so.6".to_string(),
    ];
    let marker = b"GLIBC_ABI_DT_RELR";
    candidates
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .is_some_and(|libc| std::fs::read(libc).is_ok_and(|bytes| bytes.windows(marker.len()).any(|w| w == marker)))
}
