//! The admin port's bearer tokens (`--admin-token-file`), read at start-up
//! and again whenever the file changes (polled, see [`TokenFile::poll`]) or
//! on SIGHUP, so a token is rotated without a restart.
//!
//! The file: one token per line, blank lines and `#` comments skipped,
//! whitespace around each part trimmed.
//!
//! - `TOKEN`, or `NAME:TOKEN` to name it in the log. The line is split at
//!   its **first** colon: a name may not contain `:`, a token may. Neither
//!   may be empty, and a token has no whitespace and at least 16 characters.
//! - `read NAME:TOKEN` (or `read TOKEN`): a read-only token, for
//!   `--admin-reads token` (`/limited`, `/counters`, `/json`, `tollgate
//!   top`); a reset with it is refused (403).
//!
//! A file that other users may read or write, or its group write (mode
//! `& 0o027`), is refused unless `--admin-token-file-mode-check off`: a
//! token others can read is not a secret. Its group may read it (`0640`,
//! `0440`): that is how a Kubernetes Secret reaches a non-root container
//! (`defaultMode: 0440` and the pod's `fsGroup`). At start-up any problem stops Tollgate; on a reload, a
//! file that is gone, empty, unreadable, invalid or open to others closes
//! the tokens (every one refused, 503 saying why) and logs an error until it
//! is fixed: the old tokens never stay in force after the file changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Read who is limited and their counters (`read NAME:TOKEN`).
    Read,
    /// Read, and reset counters (`NAME:TOKEN`).
    Reset,
}

/// One token of the file.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token {
    /// Its name in the log (`token N` when the line gives none).
    pub name: String,
    /// The secret a bearer sends.
    pub secret: String,
    /// What it may do.
    pub scope: Scope,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log or a Debug.
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// The tokens in force.
#[derive(Debug)]
pub(crate) enum Tokens {
    /// These tokens are accepted.
    Open(Vec<Token>),
    /// None is: the file's last change did not load (the reason).
    Closed(String),
}

/// `--admin-token-file`: the tokens, swapped whole when the file changes.
pub(crate) struct TokenFile {
    path: PathBuf,
    mode_check: bool,
    tokens: ArcSwap<Tokens>,
    /// The file's fingerprint when last loaded (or refused).
    seen: Mutex<u64>,
    /// A changed fingerprint seen once, waiting for a second look.
    settling: Mutex<Option<u64>>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Reads the file at start-up; the error names it, and the line.
    pub(crate) fn load(path: &Path, mode_check: bool) -> Result<Self, String> {
        let seen = fingerprint(path);
        let tokens = read(path, mode_check)?;
        Ok(Self {
            path: path.to_owned(),
            mode_check,
            tokens: ArcSwap::from_pointee(Tokens::Open(tokens)),
            seen: Mutex::new(seen),
            settling: Mutex::new(None),
        })
    }

    /// The tokens in force now.
    pub(crate) fn tokens(&self) -> Arc<Tokens> {
        self.tokens.load_full()
    }

    /// Reads the file now: its tokens replace those in force, or, when it
    /// does not load, every token is refused until it does (logged at
    /// error). Reads a file: call it off the async runtime.
    pub(crate) fn reload(&self, why: &str) {
        *self.seen.lock() = fingerprint(&self.path);
        match read(&self.path, self.mode_check) {
            Ok(tokens) => {
                tracing::info!(
                    why,
                    path = %self.path.display(),
                    tokens = tokens.len(),
                    "admin tokens reloaded"
                );
                self.tokens.store(Arc::new(Tokens::Open(tokens)));
            }
            Err(error) => {
                tracing::error!(
                    why,
                    %error,
                    "admin tokens closed: every token is refused (resets, and reads with --admin-reads token) until the file loads"
                );
                self.tokens.store(Arc::new(Tokens::Closed(error)));
            }
        }
    }

    /// Looks at the file once (its mode and content): reloads when it
    /// changed and read the same at the previous look, so a file being
    /// rewritten is not loaded half-written. Returns whether it reloaded.
    pub(crate) fn poll(&self) -> bool {
        let now = fingerprint(&self.path);
        if !crate::reload::settled(&self.settling, *self.seen.lock(), now) {
            return false;
        }
        self.reload("--admin-token-file changed");
        true
    }
}

/// A hash of the file's mode and content (or of why it cannot be read).
fn fingerprint(path: &Path) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    match std::fs::metadata(path) {
        Ok(meta) => hasher.update(&mode(&meta).to_le_bytes()),
        Err(e) => hasher.update(e.to_string().as_bytes()),
    }
    match std::fs::read(path) {
        Ok(bytes) => hasher.update(&bytes),
        Err(e) => hasher.update(e.to_string().as_bytes()),
    }
    hasher.digest()
}

#[cfg(unix)]
fn mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode(_: &std::fs::Metadata) -> u32 {
    0o600
}

/// Reads and checks the token file: its mode (unless `mode_check` is off),
/// then its lines (see [`parse`]).
pub(crate) fn read(path: &Path, mode_check: bool) -> Result<Vec<Token>, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("--admin-token-file {shown}: {e}"))?;
    let mode = mode(&meta);
    if mode_check && mode & 0o027 != 0 {
        return Err(format!(
            "--admin-token-file {shown}: its mode {mode:04o} lets other users read or write it (or its group write it); run chmod 600 {shown}, or 640 for a group that must read it (or turn this check off with --admin-token-file-mode-check off)"
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--admin-token-file {shown}: {e}"))?;
    parse(&text).map_err(|e| format!("--admin-token-file {shown}: {e}"))
}

/// The tokens of a file's text; the error names the line.
pub(crate) fn parse(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens: Vec<Token> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        // A byte-order mark is not part of the first name.
        let line = line.trim_start_matches('\u{feff}').trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (scope, rest) = match line.split_once(char::is_whitespace) {
            Some(("read", rest)) => (Scope::Read, rest.trim()),
            // `READ name:T` or `Read T` meant read-only: never read as a
            // name (with a space) that may reset.
            Some((word, _)) if word.eq_ignore_ascii_case("read") => {
                return Err(format!(
                    "line {number}: '{}' is not a scope: write `read` in lower case for a read-only token",
                    word.escape_debug()
                ));
            }
            _ => (Scope::Reset, line),
        };
        let (name, secret) = match rest.split_once(':') {
            Some((name, secret)) => (name.trim().to_owned(), secret.trim()),
            None => (format!("token {}", tokens.len() + 1), rest),
        };
        if name.is_empty() {
            return Err(format!(
                "line {number}: the name before ':' is empty (NAME:TOKEN)"
            ));
        }
        if secret.is_empty() {
            return Err(format!(
                "line {number}: token '{}' is empty (NAME:TOKEN)",
                name.escape_debug()
            ));
        }
        if secret.contains(char::is_whitespace) {
            return Err(format!(
                "line {number}: token '{}' contains whitespace (a line is [read] NAME:TOKEN)",
                name.escape_debug()
            ));
        }
        if secret.chars().count() < 16 {
            return Err(format!(
                "line {number}: token '{}' is shorter than 16 characters",
                name.escape_debug()
            ));
        }
        if tokens.iter().any(|t| t.secret == secret) {
            return Err(format!(
                "line {number}: token '{}' repeats an earlier line's token (one token, one name and one scope)",
                name.escape_debug()
            ));
        }
        tokens.push(Token {
            name,
            secret: secret.to_owned(),
            scope,
        });
    }
    if tokens.is_empty() {
        return Err("no token in it".to_owned());
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef";

    fn one(line: &str) -> Result<Token, String> {
        parse(line).map(|mut t| t.remove(0))
    }

    #[test]
    fn a_misspelt_scope_a_repeated_token_and_a_bom_are_caught() {
        let t = format!("{SECRET}x");
        assert!(
            parse(&format!("READ ops:{t}\n"))
                .unwrap_err()
                .contains("lower case")
        );
        assert!(
            parse(&format!("Read {t}\n"))
                .unwrap_err()
                .contains("lower case")
        );
        assert!(
            parse(&format!("a:{t}\nread b:{t}\n"))
                .unwrap_err()
                .contains("repeats")
        );
        let bom = parse(&format!("\u{feff}ops:{t}\n")).expect("loads");
        assert_eq!(bom[0].name, "ops");
    }

    #[test]
    fn a_line_is_split_at_its_first_colon_and_both_parts_are_needed() {
        let t = one(&format!("  ops : {SECRET}:x  ")).expect("a token");
        assert_eq!(
            (t.name.as_str(), t.secret.as_str(), t.scope),
            ("ops", "0123456789abcdef:x", Scope::Reset)
        );
        let t = one(SECRET).expect("a token");
        assert_eq!((t.name.as_str(), t.secret.as_str()), ("token 1", SECRET));
        let err = one(&format!("# c\n\n:{SECRET}")).expect_err("empty name");
        assert!(err.contains("line 3") && err.contains("name"), "{err}");
        let err = one("ops:").expect_err("empty token");
        assert!(
            err.contains("line 1") && err.contains("'ops' is empty"),
            "{err}"
        );
        let err = one("ops:   ").expect_err("blank token");
        assert!(err.contains("is empty"), "{err}");
        let err = one("ops:0123456789 abcdef").expect_err("whitespace");
        assert!(err.contains("whitespace"), "{err}");
        let err = one("ops:short").expect_err("short");
        assert!(err.contains("shorter than 16"), "{err}");
        assert_eq!(parse("# only\n\n").expect_err("none"), "no token in it");
    }

    #[test]
    fn read_marks_a_token_read_only() {
        let t = one(&format!("read  viewer:{SECRET}")).expect("a token");
        assert_eq!((t.name.as_str(), t.scope), ("viewer", Scope::Read));
        let t = one(&format!("read {SECRET}")).expect("a token");
        assert_eq!((t.secret.as_str(), t.scope), (SECRET, Scope::Read));
        // A name that merely begins with "read" is a name.
        let t = one(&format!("reader:{SECRET}")).expect("a token");
        assert_eq!((t.name.as_str(), t.scope), ("reader", Scope::Reset));
        let t = one(&format!("read:{SECRET}")).expect("a token");
        assert_eq!((t.name.as_str(), t.scope), ("read", Scope::Reset));
        assert!(format!("{t:?}").contains("read") && !format!("{t:?}").contains(SECRET));
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_refused_and_a_change_closes_or_swaps() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("ops:{SECRET}\n")).expect("write");
        let chmod =
            |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).expect("chmod");
        chmod(0o644);
        let err = TokenFile::load(&path, true).expect_err("refused");
        assert!(
            err.contains(&path.display().to_string())
                && err.contains("0644")
                && err.contains("chmod 600")
                && err.contains("--admin-token-file-mode-check off"),
            "{err}"
        );
        assert!(TokenFile::load(&path, false).is_ok());
        chmod(0o600);
        let file = TokenFile::load(&path, true).expect("loads");
        assert!(!file.poll());
        // Its group may read it (a Kubernetes Secret's 0440 with fsGroup).
        chmod(0o640);
        assert!(!file.poll(), "seen once");
        assert!(file.poll(), "seen twice: reloaded");
        assert!(matches!(&*file.tokens(), Tokens::Open(_)));
        // Others may read it: closed.
        chmod(0o644);
        assert!(!file.poll(), "seen once");
        assert!(file.poll(), "seen twice: reloaded");
        assert!(matches!(&*file.tokens(), Tokens::Closed(why) if why.contains("0644")));
        chmod(0o600);
        std::fs::write(&path, format!("new:{SECRET}x\n")).expect("write");
        file.reload("test");
        assert!(matches!(&*file.tokens(), Tokens::Open(t) if t[0].name == "new"));
        std::fs::remove_file(&path).expect("rm");
        file.reload("test");
        assert!(matches!(&*file.tokens(), Tokens::Closed(_)));
    }
}
