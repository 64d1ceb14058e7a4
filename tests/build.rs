//! How the executable is linked: packed relative relocations only when the build opts in, so
//! a binary built on a new glibc still starts on older systems.

/// Whether the ELF64 little-endian file `bytes` has a DT_RELR entry in its dynamic section.
/// `None` when it is not such a file.
fn has_relr(bytes: &[u8]) -> Option<bool> {
    const PT_DYNAMIC: u32 = 2;
    const DT_NULL: u64 = 0;
    const DT_RELR: u64 = 36;
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != PT_DYNAMIC {
            continue;
        }
        let offset = usize::try_from(u64_at(ph + 8)?).ok()?;
        let size = usize::try_from(u64_at(ph + 32)?).ok()?;
        for entry in (offset..offset + size).step_by(16) {
            match u64_at(entry)? {
                DT_NULL => break,
                DT_RELR => return Some(true),
                _ => {}
            }
        }
    }
    Some(false)
}

#[cfg(all(target_os = "linux", target_endian = "little", target_pointer_width = "64"))]
#[test]
fn packed_relocations_are_opt_in() {
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_runner")).expect("the runner binary is built");
    let relr = has_relr(&bytes).expect("the runner binary is an ELF64 little-endian file");
    if option_env!("RUNNER_PACKED_RELOCS") != Some("1") {
        assert!(
            !relr,
            "built without RUNNER_PACKED_RELOCS=1, the binary must not need glibc 2.36's DT_RELR"
        );
    }
}

#[test]
fn the_elf_reader_finds_relr_entries() {
    // A minimal ELF64 header with one PT_DYNAMIC program header and a dynamic section.
    let mut elf = vec![0u8; 0x100];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
    elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    elf[0x40..0x44].copy_from_slice(&2u32.to_le_bytes());
    elf[0x48..0x50].copy_from_slice(&0x80u64.to_le_bytes());
    elf[0x60..0x68].copy_from_slice(&48u64.to_le_bytes());
    let entry = |elf: &mut Vec<u8>, at: usize, tag: u64| elf[at..at + 8].copy_from_slice(&tag.to_le_bytes());
    entry(&mut elf, 0x80, 1);
    entry(&mut elf, 0x90, 0);
    assert_eq!(has_relr(&elf), Some(false));
    entry(&mut elf, 0x90, 36);
    assert_eq!(has_relr(&elf), Some(true));
    assert_eq!(has_relr(b"#!/bin/sh"), None);
}
