//! Links the `runner` executable with packed relative relocations (DT_RELR) when asked to:
//! a position-independent executable's relocation table shrinks from about a megabyte, read at
//! every start, to a few kilobytes. Such a binary starts only on glibc 2.36 or newer, so the
//! choice belongs to whoever decides where the binary will run (the release archive declares
//! its floor), never to the glibc the build machine happens to have: set
//! `RUNNER_PACKED_RELOCS=1` at build time to opt in.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUNNER_PACKED_RELOCS");
    if std::env::var("RUNNER_PACKED_RELOCS").as_deref() != Ok("1") {
        return;
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        println!("cargo:warning=RUNNER_PACKED_RELOCS=1 is ignored: {target} is not a glibc target");
        return;
    }
    // A cross build links against a sysroot this script cannot see: the opt-in is trusted.
    if target == host && !glibc_has_relr(&target) {
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
