//! Links the `runner` executable with packed relative relocations (DT_RELR) where the C
//! library supports them (glibc 2.36+): a position-independent executable's relocation table
//! shrinks from about a megabyte, read at every start, to a few kilobytes.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target == host && target.ends_with("-linux-gnu") && glibc_has_relr(&target) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
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
