//! The site's `TaskProlog` (slurm.conf) for tasks that run in a container:
//! where it is, and the program bound at its path inside the container so
//! that Slurm's own run there is a no-op (the front end runs the script on
//! the host before each task joins; see the plugin's `task_prolog`).

use anyhow::anyhow;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::container::spec::MountSpec;
use crate::privilege::with_root;

/// Where the exit-0 program is kept below the node's state folder.
const NOOP_FILE: &str = "task-prolog-noop";

/// The site's `TaskProlog` from slurm.conf, or `None` when there is none.
pub fn site_prolog() -> anyhow::Result<Option<PathBuf>> {
    let conf = crate::slurm_conf::slurm_conf_path();
    let value = crate::slurm_conf::value(&conf, "TaskProlog")
        .map_err(|e| anyhow!("cannot find the site's TaskProlog: {e:#}"))?;
    Ok(value.map(PathBuf::from))
}

/// The bind that makes Slurm's run of `prolog` inside the container a no-op:
/// the exit-0 program (kept in `state_dir`, written there when missing) at
/// the TaskProlog's own path, read-only.
pub fn container_bind(prolog: &Path, state_dir: &Path) -> anyhow::Result<MountSpec> {
    let program = exit0_program().ok_or_else(|| {
        anyhow!(
            "the site's TaskProlog {} cannot run for container tasks on this CPU architecture \
             ({}); remove TaskProlog from slurm.conf or run the step without --container-image",
            prolog.display(),
            std::env::consts::ARCH
        )
    })?;
    let path = state_dir.join(NOOP_FILE);
    with_root(|| write_if_changed(&path, &program)).map_err(|e| {
        anyhow!(
            "cannot write {} (stands in for the TaskProlog inside the container): {e:#}",
            path.display()
        )
    })?;
    Ok(MountSpec {
        source: path,
        target: prolog.to_path_buf(),
        read_only: true,
    })
}

fn write_if_changed(path: &Path, content: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, content)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555))?;
    std::fs::rename(&tmp, path)
}

/// Where the exit-0 program is loaded (any address above `mmap_min_addr`).
const LOAD_ADDRESS: u64 = 0x40_0000;
/// Size of the ELF file header and of its one program header.
const ELF_HEADER: usize = 64;
const PROGRAM_HEADER: usize = 56;

/// A static ELF program of this machine's architecture that only calls
/// `exit(0)`: it runs in any image (no interpreter, no libraries). `None` on
/// architectures berth has no code for.
pub fn exit0_program() -> Option<Vec<u8>> {
    // (ELF machine, instructions)
    let (machine, code): (u16, &[u8]) = if cfg!(target_arch = "x86_64") {
        // xor edi, edi; mov eax, 60 (exit); syscall
        (62, &[0x31, 0xff, 0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05])
    } else if cfg!(target_arch = "aarch64") {
        // mov x0, #0; mov x8, #93 (exit); svc #0
        (
            183,
            &[
                0x00, 0x00, 0x80, 0xd2, 0xa8, 0x0b, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4,
            ],
        )
    } else {
        return None;
    };
    let size = (ELF_HEADER + PROGRAM_HEADER + code.len()) as u64;
    let mut elf = Vec::with_capacity(size as usize);
    // e_ident: magic, 64-bit, little endian, version 1, System V ABI.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes()); // e_version
    let entry = LOAD_ADDRESS + (ELF_HEADER + PROGRAM_HEADER) as u64;
    elf.extend_from_slice(&entry.to_le_bytes());
    elf.extend_from_slice(&(ELF_HEADER as u64).to_le_bytes()); // e_phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    elf.extend_from_slice(&(ELF_HEADER as u16).to_le_bytes());
    elf.extend_from_slice(&(PROGRAM_HEADER as u16).to_le_bytes());
    elf.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    elf.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
                                    // The one PT_LOAD segment: the whole file, readable and executable.
    elf.extend_from_slice(&1u32.to_le_bytes()); // p_type: PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // p_flags: R | X
    elf.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    elf.extend_from_slice(&LOAD_ADDRESS.to_le_bytes()); // p_vaddr
    elf.extend_from_slice(&LOAD_ADDRESS.to_le_bytes()); // p_paddr
    elf.extend_from_slice(&size.to_le_bytes()); // p_filesz
    elf.extend_from_slice(&size.to_le_bytes()); // p_memsz
    elf.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    elf.extend_from_slice(code);
    debug_assert_eq!(elf.len() as u64, size);
    Some(elf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_exit0_program_runs_and_says_nothing() {
        let Some(program) = exit0_program() else {
            return; // no code for this architecture: the step fails with a message instead
        };
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("noop");
        write_if_changed(&path, &program).unwrap();
        write_if_changed(&path, &program).unwrap(); // unchanged: left alone
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o555);
        let output = Command::new(&path).env_clear().output().unwrap();
        assert!(output.status.success(), "{:?}", output.status);
        assert!(output.stdout.is_empty() && output.stderr.is_empty());
    }
}
