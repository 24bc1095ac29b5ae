//! Rule errors: each names the file, the line and column where known, and
//! the problem.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line and column, when the parser knows them.
    pub at: Option<(u32, u32)>,
    /// What is wrong.
    pub message: String,
}

impl RuleError {
    pub(crate) fn new(file: &Path, at: Option<(u32, u32)>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            at,
            message: message.into(),
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, col)) => {
                write!(f, "{}:{line}:{col}: {}", self.file.display(), self.message)
            }
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// Every problem found in a rule set; loading reports them all at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleErrors(pub Vec<RuleError>);

impl fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}

/// Where a problem is, and what it is: how the rule compiler's parts
/// report what they find.
pub(super) type ErrorSink<'a> = &'a mut dyn FnMut(Option<(u32, u32)>, String);
