//! One process per data directory: the directory is claimed with a lock on
//! its `owner` file, which holds the owner's process id, so a second
//! process is refused with a message naming the first. The kernel drops the
//! lock when the owner exits, however it exits (a `kill -9` included), so a
//! crash leaves nothing to clean up.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The file that is locked and names the owner.
pub(super) const OWNER_FILE: &str = "owner";

/// A claimed data directory (the claim lasts as long as this value).
#[derive(Debug)]
pub(super) struct Owner {
    _file: std::fs::File,
}

/// The directory `--data-dir` names, created if missing, and claimed for
/// this process; the error names the flag and says what to change.
pub(super) fn claim(dir: &Path) -> Result<Owner, String> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "--data-dir {shown}: not a directory; give a directory (it is created if missing)"
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .map_err(|e| format!("--data-dir {shown}: cannot create it: {e}"))?,
        Err(e) => return Err(format!("--data-dir {shown}: {e}")),
    }
    let path: PathBuf = dir.join(OWNER_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            format!(
                "--data-dir {shown}: cannot write there ({e}); give a directory this process may write"
            )
        })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let pid = text.trim();
            let pid = if pid.is_empty() { "unknown" } else { pid };
            return Err(format!(
                "--data-dir {shown} is in use by another tollgate (pid {pid}, per {}): each process needs a data directory of its own",
                path.display()
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!(
                "--data-dir {shown}: cannot lock {}: {e}",
                path.display()
            ));
        }
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .and_then(|()| file.sync_all());
    written.map_err(|e| {
        format!(
            "--data-dir {shown}: cannot write {} ({e}); give a directory this process may write",
            path.display()
        )
    })?;
    Ok(Owner { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_naming_the_first() {
        let dir = std::env::temp_dir().join(format!("tollgate-owner-{}", std::process::id()));
        let first = claim(&dir).expect("claimed");
        let refused = claim(&dir).expect_err("a second claim");
        assert!(
            refused.contains(&format!("pid {}", std::process::id())),
            "{refused}"
        );
        drop(first);
        claim(&dir).expect("claimed again once released");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_is_not_a_directory() {
        let file = std::env::temp_dir().join(format!("tollgate-owner-file-{}", std::process::id()));
        std::fs::write(&file, b"x").expect("written");
        let refused = claim(&file).expect_err("a file");
        assert!(
            refused.contains("--data-dir") && refused.contains("not a directory"),
            "{refused}"
        );
        let _ = std::fs::remove_file(&file);
    }
}
