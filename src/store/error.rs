//! Why a store could not decide, and why a reset did not happen.

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The memory store is at its key cap and nothing in the shard has expired.
    #[error("memory store is full ({max_keys} keys, see --max-keys)")]
    Full {
        /// The configured cap.
        max_keys: usize,
    },
    /// Redis did not answer within the timeout.
    #[error("Redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// Redis failed repeatedly; calls are not attempted until a probe succeeds.
    #[error("Redis is unavailable (circuit open, probing in the background)")]
    CircuitOpen,
    /// Redis answered with an error, or the connection failed.
    #[error("Redis error: {message}")]
    Redis {
        /// What Redis or the connection said.
        message: String,
        /// Whether a retry may succeed.
        transient: bool,
    },
    /// A Redis Cluster hash slot is being migrated and a call's keys are
    /// not all on one of its two nodes (Redis answered `TRYAGAIN`). The
    /// Redis store decides such a call key by key instead; it never leaves
    /// the store.
    #[error("a Redis Cluster hash slot is being migrated")]
    Migrating,
    /// The script answered something it never should.
    #[error("{0}")]
    Script(String),
    /// The store is misconfigured.
    #[error("{0}")]
    Config(String),
}

impl StoreError {
    /// Whether retrying later may succeed (what the failure mode acts on).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Full { .. }
            | StoreError::Timeout(_)
            | StoreError::CircuitOpen
            | StoreError::Migrating => true,
            StoreError::Redis { transient, .. } => *transient,
            StoreError::Script(_) | StoreError::Config(_) => false,
        }
    }
}

/// Why a reset did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetError {
    /// More counters than the caller's bound: none deleted.
    #[error(
        "more than {0} counters match; nothing was reset (send a larger \"max_keys\" to reset them all)"
    )]
    TooMany(usize),
    /// The store failed.
    #[error("{0}")]
    Store(StoreError),
}
