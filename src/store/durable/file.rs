//! The database file of a data directory (redb): a `meta` table (the data
//! format, the hash seed, and a digest of every chunk) and a `chunks` table
//! (chunk number -> a chunk's bytes, see `codec.rs`). Every flush is one
//! transaction: after a crash the file holds the last flush that ended.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::codec;

/// The database file's name inside the data directory.
pub(super) const FILE_NAME: &str = "counters.redb";

/// The data format this Tollgate writes and reads (the layout of the
/// tables and chunks; redb's own file format is redb's).
pub(super) const FORMAT: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const CHUNKS: TableDefinition<u32, &[u8]> = TableDefinition::new("chunks");

/// redb's page cache: the file is read whole once, at start, and written
/// in copy-on-write pages; a large cache buys nothing.
const CACHE_BYTES: usize = 32 << 20;

/// Why a file cannot be used; each says what to do.
#[derive(Debug)]
pub(super) enum Refused {
    /// Corrupt or cut short: start afresh only when told to.
    Damaged(String),
    /// Written in another data format (by another Tollgate version).
    Format(u64),
    /// Cannot be read or written (permissions, a full disk at start).
    Io(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Damaged(why) | Refused::Io(why) => f.write_str(why),
            Refused::Format(v) => write!(f, "data format {v}, not {FORMAT}"),
        }
    }
}

/// The open database file.
pub(super) struct File {
    db: redb::Database,
    path: PathBuf,
}

/// What a file holds, read at start.
pub(super) struct Contents {
    /// The hash seed of its counters.
    pub seed: u64,
    /// Its chunks, by number.
    pub chunks: Vec<(u32, Vec<u8>)>,
}

fn damaged(e: impl std::fmt::Display) -> Refused {
    Refused::Damaged(e.to_string())
}

impl File {
    /// The file in `dir`, made with `seed` if there is none.
    pub(super) fn open_or_create(dir: &Path, seed: u64) -> Result<(File, Contents), Refused> {
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            let db = redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .create(&path)
                .map_err(|e| Refused::Io(e.to_string()))?;
            let file = File { db, path };
            file.write_meta(&[
                ("format", FORMAT),
                ("seed", seed),
                ("digest", 0),
                ("chunks", 0),
            ])
            .map_err(Refused::Io)?;
            let contents = Contents {
                seed,
                chunks: Vec::new(),
            };
            return Ok((file, contents));
        }
        let file = Self::open(&path)?;
        let contents = file.read()?;
        Ok((file, contents))
    }

    /// An existing file, its every page checked (a damaged file is refused,
    /// never trusted).
    pub(super) fn open(path: &Path) -> Result<File, Refused> {
        let opened = std::panic::catch_unwind(|| {
            redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .set_check_integrity_on_open(true)
                .open(path)
        })
        .map_err(|_| damaged("it could not be read (redb stopped on it)"))?;
        let db = opened.map_err(|e| match e {
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
            {
                Refused::Io(io.to_string())
            }
            redb::DatabaseError::UpgradeRequired(v) => damaged(format!(
                "it is in redb's file format {v}, which this build does not read"
            )),
            e => damaged(e),
        })?;
        Ok(File {
            db,
            path: path.to_owned(),
        })
    }

    fn read(&self) -> Result<Contents, Refused> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.read_all()))
            .map_err(|_| damaged("it could not be read (redb stopped on it)"))?
    }

    fn read_all(&self) -> Result<Contents, Refused> {
        let txn = self.db.begin_read().map_err(damaged)?;
        let meta = txn.open_table(META).map_err(|e| match e {
            redb::TableError::TableTypeMismatch(_) | redb::TableError::TypeDefinitionChanged(_) => {
                Refused::Format(0)
            }
            e => damaged(e),
        })?;
        let get = |name: &str| -> Result<u64, Refused> {
            meta.get(name)
                .map_err(damaged)?
                .map(|v| v.value())
                .ok_or_else(|| damaged(format!("its meta table has no {name}")))
        };
        let format = get("format")?;
        if format != FORMAT {
            return Err(Refused::Format(format));
        }
        let (seed, digest, count) = (get("seed")?, get("digest")?, get("chunks")?);
        let table = txn.open_table(CHUNKS).map_err(damaged)?;
        let mut chunks = Vec::new();
        for row in table.iter().map_err(damaged)? {
            let (id, bytes) = row.map_err(damaged)?;
            chunks.push((id.value(), bytes.value().to_vec()));
        }
        let sums: HashMap<u32, u64> = chunks
            .iter()
            .map(|(id, bytes)| (*id, codec::checksum(bytes).unwrap_or(0)))
            .collect();
        if sums.len() as u64 != count || digest_of(&sums) != digest {
            return Err(damaged(format!(
                "it holds {} chunks whose digest does not match the {count} its last write recorded (cut short or altered)",
                sums.len()
            )));
        }
        Ok(Contents { seed, chunks })
    }

    /// Each chunk's checksum, by number (what the file holds now).
    pub(super) fn checksums(&self) -> Result<HashMap<u32, u64>, String> {
        let contents = self.read().map_err(|e| e.to_string())?;
        Ok(contents
            .chunks
            .iter()
            .map(|(id, bytes)| (*id, codec::checksum(bytes).unwrap_or(0)))
            .collect())
    }

    fn write_meta(&self, values: &[(&str, u64)]) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
            for (name, value) in values {
                meta.insert(*name, *value).map_err(|e| e.to_string())?;
            }
            txn.open_table(CHUNKS).map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())
    }

    /// One flush, in one transaction: chunks written, chunks deleted, and
    /// the digest of what the file holds after it (`sums`).
    pub(super) fn write(
        &self,
        puts: &[(u32, Vec<u8>)],
        deletes: &[u32],
        sums: &HashMap<u32, u64>,
    ) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut chunks = txn.open_table(CHUNKS).map_err(|e| e.to_string())?;
            for (id, bytes) in puts {
                chunks
                    .insert(*id, bytes.as_slice())
                    .map_err(|e| e.to_string())?;
            }
            for id in deletes {
                chunks.remove(*id).map_err(|e| e.to_string())?;
            }
            let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
            meta.insert("digest", digest_of(sums))
                .map_err(|e| e.to_string())?;
            meta.insert("chunks", sums.len() as u64)
                .map_err(|e| e.to_string())?;
        }
        txn.commit().map_err(|e| e.to_string())
    }

    /// Gives the file's free pages back when it is much larger than what it
    /// holds (`live` bytes), or always with `always`.
    pub(super) fn compact(&mut self, live: u64, always: bool) -> Result<(), String> {
        if !always && self.len() <= live.saturating_mul(2) + (8 << 20) {
            return Ok(());
        }
        self.db
            .compact(redb::CompactionMode::Balanced)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The file's size in bytes.
    pub(super) fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}

/// The digest the meta table keeps of the chunks: the sum of their
/// checksums, so a chunk lost or kept from an older flush shows.
fn digest_of(sums: &HashMap<u32, u64>) -> u64 {
    sums.iter().fold(0u64, |d, (id, sum)| {
        d.wrapping_add(sum.rotate_left(*id % 64))
    })
}
